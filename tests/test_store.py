"""RunStore: a measurement is written once, whichever road brings it (a job's answer, then its Evaluator's journal;
docs/measurement.md#how-a-measurement-reaches-the-store)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from env.data.measured import MeasuredPlan
from search.engine.batch_book import BatchBook
from search.records import meta
from search.records.store import STORE_NAME, RunStore, StoreError

WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)


def _m(mid: str, samples: list[float], source: str = "agent_0", digest: str = "p") -> MeasuredPlan:
    return MeasuredPlan(workload="synthetic", batch_shape="-", digest=digest, actions=["keep", "recompute"],
                        sources=[source], peak_bytes=100, live_before_bytes=0, step_seconds_samples=samples,
                        clock="thread-cpu", device="cpu", torch_version="t", measurement_ids=[mid])


def _writes(store: RunStore) -> list[str]:
    """Every statement that writes to the store's file, as SQLite runs it."""
    seen: list[str] = []
    store.conn.set_trace_callback(lambda sql: seen.append(sql) if WRITE.match(sql) else None)
    return seen


def test_a_measurement_delivered_twice_is_written_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    writes = _writes(store)
    answer = _m("evaluator_0-ab:1", [1.0, 1.1])
    first = store.record(answer)
    assert len(writes) == 1 and writes[0].lstrip().upper().startswith("INSERT")  # the row with its record
    writes.clear()
    again = store.record(answer)  # the same measurement, drained from the journal
    assert writes == [] and again == first
    row = store.get("p")
    assert row is not None and row.measurement is not None
    assert row.measurement.measurement_ids == ["evaluator_0-ab:1"] and row.measurement.step_seconds_samples == [1.0, 1.1]


def test_a_repeat_measurement_merges_and_a_known_one_adds_only_its_new_proposer(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.record(_m("evaluator_0-ab:1", [1.0]))
    writes = _writes(store)
    merged = store.record(_m("evaluator_1-cd:4", [1.2], source="rule:all"))  # a new measurement of the plan
    assert merged.measurement_ids == ["evaluator_0-ab:1", "evaluator_1-cd:4"] and merged.step_seconds_samples == [1.0, 1.2]
    assert len(writes) == 1  # the row's one update: its new proposer and its record
    writes.clear()
    known = store.record(_m("evaluator_0-ab:1", [1.0], source="exact"))  # known measurement, new proposer
    assert len(writes) == 1 and writes[0].lstrip().upper().startswith("UPDATE EVALUATIONS SET PROPOSERS")
    assert known.sources == ["agent_0", "rule:all", "exact"] and known.step_seconds_samples == [1.0, 1.2]
    row = store.get("p")
    assert row is not None and row.proposers == ["agent_0", "rule:all", "exact"]
    assert row.measurement is not None and row.measurement.measurement_ids == merged.measurement_ids


def test_a_measurement_without_ids_is_always_merged(tmp_path: Path) -> None:
    """An id is how the store knows a measurement; one without (made by hand) is never taken for a known one."""
    store = RunStore(tmp_path)
    bare = _m("x", [1.0]).model_copy(update={"measurement_ids": []})
    store.record(bare)
    assert store.record(bare).step_seconds_samples == [1.0, 1.0]


def test_a_throughput_measurement_is_one_row_written_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    book = BatchBook(store)
    writes = _writes(store)
    book.record({"micro_batch": 4, "record": _m("evaluator_0-ab:1", [1.0])})
    assert len(writes) == 1 and writes[0].lstrip().upper().startswith("INSERT INTO EVALUATIONS")
    writes.clear()
    merged = book.record({"micro_batch": 4, "record": _m("evaluator_1-cd:2", [1.2], source="exact")})
    assert len(writes) == 1 and writes[0].lstrip().upper().startswith("UPDATE EVALUATIONS")  # that row, merged
    assert merged.step_seconds_samples == [1.0, 1.2] and merged.sources == ["agent_0", "exact"]
    book.record({"micro_batch": 8, "record": _m("evaluator_0-ab:3", [2.0])})  # the same plan at another micro-batch
    writes.clear()
    book.credit({(4, "p"): "exact", (8, "p"): "rule:all"})  # only the row at 8 gains a proposer
    assert len(writes) == 1 and "rule:all" in writes[0]
    assert not any("meta" in w.lower() for w in writes)
    assert [(b, m.sources, m.step_seconds_samples) for b, m in store.measured_at_micro_batches()] == [
        (4, ["agent_0", "exact"], [1.0, 1.2]), (8, ["agent_0", "rule:all"], [2.0])]
    assert store.measured() == [] and store.count() == 0  # the workload's own batch holds none of them
    assert BatchBook(store).records == book.records  # a resumed run reads the same book
    with pytest.raises(ValueError, match="micro-batch must be 1 or more, not 0"):
        book.record({"micro_batch": 0, "record": _m("evaluator_0-ab:9", [1.0])})


_V2_EVALUATIONS = """CREATE TABLE evaluations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, plan_digest TEXT NOT NULL UNIQUE, actions TEXT NOT NULL,
    proposers TEXT NOT NULL DEFAULT '[]', predicted_peak_bytes INTEGER, predicted_step_seconds REAL,
    measured INTEGER NOT NULL DEFAULT 0, record TEXT, peak_bytes INTEGER, step_seconds REAL, clock TEXT,
    oom INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT NULL)"""


def _v2_store(folder: Path) -> tuple[MeasuredPlan, list[tuple[int, MeasuredPlan]]]:
    """A store as schema version 2 wrote it: a plan measured at the run's own batch in ``evaluations``, and the
    throughput search's measurements in the meta key ``throughput_measured``."""
    own = _m("evaluator_0-ab:1", [1.0], digest="own")
    at = [(2, _m("evaluator_0-ab:2", [1.5], digest="own")), (4, _m("evaluator_1-cd:3", [2.0], source="exact"))]
    conn = sqlite3.connect(folder / STORE_NAME)
    with conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(_V2_EVALUATIONS)
        conn.execute("INSERT INTO evaluations(plan_digest, actions, proposers, measured, record, peak_bytes, "
                     "step_seconds, clock, created_at, updated_at) VALUES ('own', '[\"keep\", \"recompute\"]', "
                     "'[\"agent_0\"]', 1, ?, 100, 1.0, 'thread-cpu', 1.0, 1.0)", (own.model_dump_json(),))
        conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", [
            (meta.STORE_SCHEMA_VERSION.name, "2"),
            (meta.THROUGHPUT_MEASURED.name,
             meta.THROUGHPUT_MEASURED.dumps([{"micro_batch": b, "record": m} for b, m in at]))])
    conn.close()
    return own, at


def test_a_store_of_schema_2_opens_with_its_throughput_measurements_as_rows(tmp_path: Path) -> None:
    own, at = _v2_store(tmp_path)
    before = (tmp_path / STORE_NAME).read_bytes()
    with RunStore(tmp_path, readonly=True) as reader:  # a reader sees it migrated and leaves the file as it was
        assert reader.measured() == [own] and reader.measured_at_micro_batches() == at
    assert (tmp_path / STORE_NAME).read_bytes() == before
    with RunStore(tmp_path) as store:  # a resumed run migrates the file once
        assert store.read(meta.STORE_SCHEMA_VERSION) == 3
        assert store.measured() == [own] and store.measured_at_micro_batches() == at
        assert {(b, d): m for (b, d), m in BatchBook(store).records.items()} == {(b, m.digest): m for b, m in at}
        assert store.conn.execute("SELECT COUNT(*) FROM meta WHERE key = ?",
                                  (meta.THROUGHPUT_MEASURED.name,)).fetchone()[0] == 0
        store.record(_m("evaluator_2-ef:4", [1.1], digest="own"))  # the migrated rows take new measurements
        assert store.get("own") is not None and store.get("own", micro_batch=2) is not None
    with RunStore(tmp_path) as store:
        assert store.measured_at_micro_batches() == at and store.count() == 1


def test_a_store_of_an_unknown_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        store.write(meta.STORE_SCHEMA_VERSION, 9)
    with pytest.raises(StoreError, match=r"schema version 9, this ckpt-search reads 2 and 3; open it with"):
        RunStore(tmp_path)


def test_a_schema_2_store_with_a_damaged_throughput_blob_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    _v2_store(tmp_path)
    with sqlite3.connect(tmp_path / STORE_NAME) as conn:
        conn.execute("UPDATE meta SET value = '[1]' WHERE key = ?", (meta.THROUGHPUT_MEASURED.name,))
    conn.close()
    with pytest.raises(StoreError, match=r"holds a meta 'throughput_measured' that is not .*nothing was changed"):
        RunStore(tmp_path)
    conn = sqlite3.connect(tmp_path / STORE_NAME)
    columns = [r[1] for r in conn.execute("PRAGMA table_info(evaluations)")]
    assert "micro_batch" not in columns and conn.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 1
    conn.close()

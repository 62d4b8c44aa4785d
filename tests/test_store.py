"""RunStore: a measurement is written once, whichever road brings it (a job's answer, then its Evaluator's journal;
docs/measurement.md#how-a-measurement-reaches-the-store)."""

from __future__ import annotations

import re
from pathlib import Path

from env.data.measured import MeasuredPlan
from search.records.store import RunStore

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
    assert len(writes) == 2  # the plan's row, then its record
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
    assert len(writes) == 2  # the new proposer, then the record
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

"""RunStore: one SQLite file (WAL) per run folder, written as results arrive.

Tables:
- ``meta``: key -> JSON value, each key declared with its type in ``search.records.meta``
  (``config``, ``profile``, ``units``, ``status``, ``rules``, ...) and read and written through
  ``read``/``write``.
- ``evaluations``: one row per measured configuration, a plan (or peer) at a micro-batch
  (``(plan_digest, micro_batch)`` unique; ``micro_batch`` 0 is the workload's own batch, as the search
  measures it, and a throughput search's rows name the micro-batch they were measured at, 1 or more):
  its actions, everyone who proposed it (``env.data.types.PlanSource``: ``agent_<i>``, ``rule:<name>``,
  ``exact``; first first), its cost-model prediction, and once measured its
  ``env.data.measured.MeasuredPlan`` (peak, samples, the clock that took them, device, ...); a repeat
  measurement merges into the same row, and a first one is one row written once.
- ``progress``: one row per agent: timesteps done, episodes, best reward, status.
- ``snapshots``: the frontier over time (evaluations so far, frontier size, hypervolume).

The dashboard reads this file and never imports Ray; readers open it read-only.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_origin

from pydantic import ValidationError

from env.data.errors import CkptSearchError
from env.data.measured import MeasuredPlan
from search.records import meta
from search.records.meta import MetaKey, meta_key
from search.records.ranking import Ranking

T = TypeVar("T")

STORE_NAME = "store.sqlite"
SCHEMA_VERSION = 3  # 3: evaluations keyed by (plan_digest, micro_batch); 2 kept throughput measurements in meta

_EVALUATIONS = """
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    plan_digest TEXT NOT NULL,
    micro_batch INTEGER NOT NULL DEFAULT 0, -- 0: the workload's own batch; else the micro-batch measured at
    actions TEXT NOT NULL,              -- JSON list of action names, one per unit (units in meta)
    proposers TEXT NOT NULL DEFAULT '[]', -- everyone who proposed it, first first (JSON list)
    predicted_peak_bytes INTEGER,
    predicted_step_seconds REAL,
    measured INTEGER NOT NULL DEFAULT 0, -- 1: the columns below hold its measurement
    record TEXT,                        -- the env.data.measured.MeasuredPlan, every measurement merged (JSON)
    peak_bytes INTEGER,                 -- from the record, for queries
    step_seconds REAL,                  -- median of the record's samples
    clock TEXT,                         -- which clock timed the samples
    oom INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL, updated_at REAL NOT NULL,
    UNIQUE (plan_digest, micro_batch)
);
"""
_V2_COLUMNS = ("id, plan_digest, actions, proposers, predicted_peak_bytes, predicted_step_seconds, measured, record, "
               "peak_bytes, step_seconds, clock, oom, created_at, updated_at")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
""" + _EVALUATIONS + """CREATE TABLE IF NOT EXISTS progress (
    agent TEXT PRIMARY KEY, budget_bytes INTEGER, budget_low_bytes INTEGER, timesteps INTEGER NOT NULL DEFAULT 0,
    total_timesteps INTEGER, episodes INTEGER NOT NULL DEFAULT 0, best_reward REAL,
    status TEXT NOT NULL DEFAULT 'running', restarts INTEGER NOT NULL DEFAULT 0, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, n_evaluations INTEGER NOT NULL,
    n_measured INTEGER NOT NULL, frontier_size INTEGER NOT NULL, hypervolume REAL NOT NULL
);
"""


class StoreError(CkptSearchError):
    """A run store that cannot be read or written."""


@dataclass(frozen=True)
class StoredPlan:
    """One row of ``evaluations``: a plan someone proposed, its prediction, and its measurement if any."""

    id: int
    digest: str
    actions: list[str]
    proposers: list[str]
    predicted_peak_bytes: int | None
    predicted_step_seconds: float | None
    measurement: MeasuredPlan | None  # None until measured
    created_at: float

    @property
    def source(self) -> str:
        """Who proposed it first."""
        return self.proposers[0] if self.proposers else ""


def _row_to_plan(r: sqlite3.Row) -> StoredPlan:
    proposers = json.loads(r["proposers"])
    m = MeasuredPlan.model_validate_json(r["record"]) if r["record"] else None
    if m is not None:
        m = m.model_copy(update={"sources": proposers})
    return StoredPlan(id=r["id"], digest=r["plan_digest"], actions=json.loads(r["actions"]), proposers=proposers,
                      predicted_peak_bytes=r["predicted_peak_bytes"], predicted_step_seconds=r["predicted_step_seconds"],
                      measurement=m, created_at=r["created_at"])


def _check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a damaged store (junk inside the file, a torn page) before anything reads or writes it:
    SQLite finds such damage only when it touches the page, which can be long after a write."""
    try:
        problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall() if r[0] != "ok"]
    except sqlite3.DatabaseError as e:
        problems = [str(e)]
    if problems:
        conn.close()
        raise StoreError(f"run store '{path}' is corrupt ({problems[0]}); nothing was written to it: move it aside "
                         "and resume from a backup of the run folder, or start a new run")


class RunStore:
    """The run's SQLite store. ``readonly=True`` for readers (the dashboard, reports)."""

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / STORE_NAME
        self.path = path
        if readonly and not path.is_file():
            raise StoreError(f"no run store at '{path}'; start a run with python -m search.run, or pick a run folder")
        try:
            if readonly:
                # no write-ahead log beside it: no writer is open, and an immutable read creates none either
                # (a finished run read by --resume or the dashboard is left exactly as it was)
                quiet = "" if path.with_name(path.name + "-wal").exists() else "&immutable=1"
                self.conn = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro{quiet}", uri=True,
                                            timeout=30, check_same_thread=False)
                _check_integrity(self.conn, path)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
                _check_integrity(self.conn, path)  # before anything is written to it
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.executescript(_SCHEMA)
            self.conn.row_factory = sqlite3.Row
            version = self.read(meta.STORE_SCHEMA_VERSION)
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"run store '{path}' is corrupt or not a ckpt-search store ({e}); "
                "move it aside and start a new run (nothing was written to it)"
            ) from None
        if version is None and not readonly:
            self.write(meta.STORE_SCHEMA_VERSION, SCHEMA_VERSION)
        elif version == 2:
            if readonly:  # the file is left as it is: its readers see it migrated in memory
                copy = sqlite3.connect(":memory:", check_same_thread=False)
                self.conn.backup(copy)
                self.conn.close()
                self.conn = copy
                self.conn.row_factory = sqlite3.Row
            _migrate_from_2(self.conn)
        elif version is not None and version != SCHEMA_VERSION:
            raise StoreError(f"run store '{path}' has schema version {version}, this ckpt-search reads 2 and "
                             f"{SCHEMA_VERSION}; open it with the version that wrote it")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- meta (search.records.meta) -----------------------------------------------------------
    def read(self, key: MetaKey[T]) -> T:
        """The run's value of ``key``, checked against its type; the key's ``missing`` when not written."""
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key.name,)).fetchone()
        if row is None:
            return key.missing()
        try:
            return key.loads(row[0])
        except (ValidationError, json.JSONDecodeError) as e:
            raise StoreError(f"run store '{self.path}' holds a meta '{key.name}' that is not {_type_name(key)} "
                             f"({_first_error(e)}); it was written by another ckpt-search version or is damaged: "
                             "start a new run") from None

    def write(self, key: MetaKey[T], value: T) -> None:
        """Set ``key`` to ``value``, checked against its type first (nothing is written if it is not)."""
        try:
            text = key.dumps(value)
        except ValidationError as e:
            raise StoreError(f"run meta '{key.name}' must be {_type_name(key)}, not {type(value).__name__} "
                             f"({_first_error(e)}); see search/records/meta.py") from None
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key.name, text))

    def get_meta(self, name: str) -> Any:
        """``read`` by the key's stored name, for scripts; an undeclared name is refused in one line."""
        return self.read(meta_key(name))

    def set_meta(self, name: str, value: Any) -> None:
        """``write`` by the key's stored name, for scripts; an undeclared name is refused in one line."""
        self.write(meta_key(name), value)

    # -- evaluations --------------------------------------------------------------------------
    def propose(self, digest: str, actions: list[str], source: str, predicted_peak_bytes: int | None = None,
                predicted_step_seconds: float | None = None, micro_batch: int = 0) -> None:
        """Insert a plan at ``micro_batch`` (0: the workload's own batch), or add ``source`` to its proposers; a
        prediction replaces the last one."""
        now = time.time()
        with self.conn:
            self._propose(digest, micro_batch, actions, source, now)
            if predicted_peak_bytes is not None:
                self.conn.execute(
                    "UPDATE evaluations SET predicted_peak_bytes = ?, predicted_step_seconds = ?, updated_at = ? "
                    "WHERE plan_digest = ? AND micro_batch = ?",
                    (predicted_peak_bytes, predicted_step_seconds, now, digest, micro_batch))

    def _row(self, digest: str, micro_batch: int) -> sqlite3.Row | None:
        return self.conn.execute("SELECT * FROM evaluations WHERE plan_digest = ? AND micro_batch = ?",
                                 (digest, micro_batch)).fetchone()

    def _propose(self, digest: str, micro_batch: int, actions: list[str], source: str, now: float) -> None:
        row = self._row(digest, micro_batch)
        if row is None:
            self.conn.execute(
                "INSERT INTO evaluations(plan_digest, micro_batch, actions, proposers, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (digest, micro_batch, json.dumps(actions), json.dumps([source] if source else []), now, now))
        elif source and source not in json.loads(row["proposers"]):
            self.conn.execute("UPDATE evaluations SET proposers = ? WHERE id = ?",
                              (json.dumps(json.loads(row["proposers"]) + [source]), row["id"]))

    def record(self, m: MeasuredPlan, micro_batch: int = 0) -> MeasuredPlan:
        """Add a measurement to its row at ``micro_batch`` (0: the workload's own batch), merged with those before
        (``MeasuredPlan.merged``); returns the row's whole record. One statement: the row's insert, or its update.
        Idempotent by measurement id: a measurement whose ids the row holds already (it arrives as a job's answer
        and again from its Evaluator's journal, docs/measurement.md#how-a-measurement-reaches-the-store) writes
        nothing, not even its row's record again; only a proposer new to the row is added."""
        now = time.time()
        with self.conn:
            row = self._row(m.digest, micro_batch)
            if row is None:
                first = m.model_copy(update={"sources": _proposers([], m.sources)})
                _insert(self.conn, first, micro_batch, now)
                return first
            before = json.loads(row["proposers"])
            proposers = _proposers(before, m.sources)
            old = MeasuredPlan.model_validate_json(row["record"]) if row["record"] else None
            merged = (old.merged(m) if old is not None else m).model_copy(update={"sources": proposers})
            if old is not None and has_all(old, m):
                if proposers != before:
                    self.conn.execute("UPDATE evaluations SET proposers = ? WHERE id = ?",
                                      (json.dumps(proposers), row["id"]))
                return merged
            self.conn.execute(
                "UPDATE evaluations SET proposers = ?, measured = 1, record = ?, peak_bytes = ?, step_seconds = ?, "
                "clock = ?, oom = ?, updated_at = ? WHERE id = ?",
                (json.dumps(proposers), merged.model_dump_json(), merged.peak_bytes,
                 None if merged.oom else merged.step_seconds, merged.clock, int(merged.oom), now, row["id"]))
        return merged

    def get(self, digest: str, micro_batch: int = 0) -> StoredPlan | None:
        row = self._row(digest, micro_batch)
        return _row_to_plan(row) if row else None

    def plans(self) -> list[StoredPlan]:
        """Every plan proposed at the workload's own batch, in the order first proposed."""
        return [_row_to_plan(r) for r in self.conn.execute("SELECT * FROM evaluations WHERE micro_batch = 0 ORDER BY id")]

    def measured(self) -> list[MeasuredPlan]:
        """Every measured plan's record at the workload's own batch, in the order first proposed."""
        q = "SELECT * FROM evaluations WHERE measured = 1 AND micro_batch = 0 ORDER BY id"
        return [m for r in self.conn.execute(q) if (m := _row_to_plan(r).measurement) is not None]

    def measured_at_micro_batches(self) -> list[tuple[int, MeasuredPlan]]:
        """Every plan and peer a throughput search measured, with the micro-batch it was measured at, in the order
        first measured."""
        q = "SELECT * FROM evaluations WHERE measured = 1 AND micro_batch > 0 ORDER BY id"
        return [(r["micro_batch"], m) for r in self.conn.execute(q) if (m := _row_to_plan(r).measurement) is not None]

    def baseline(self) -> MeasuredPlan | None:
        """The baseline's (all keep) record as measured; None before it is."""
        row = self.get(self.read(meta.BASELINE_DIGEST) or "")
        return row.measurement if row else None

    def ranking(self) -> Ranking:
        """How the search ranks the plans this store holds (``search.records.ranking.Ranking``), from the store alone."""
        return Ranking(self.baseline(), self.read(meta.DECIDED_FROM), self.read(meta.CONFIRMED_FROM))

    def count(self, measured_only: bool = False) -> int:
        """The plans at the workload's own batch (``measured_only``: those measured)."""
        q = "SELECT COUNT(*) FROM evaluations WHERE micro_batch = 0" + (" AND measured = 1" if measured_only else "")
        return int(self.conn.execute(q).fetchone()[0])

    # -- progress and snapshots ---------------------------------------------------------------
    def set_progress(self, agent: str, **fields: Any) -> None:
        fields["updated_at"] = time.time()
        with self.conn:
            self.conn.execute("INSERT OR IGNORE INTO progress(agent, updated_at) VALUES (?, ?)", (agent, fields["updated_at"]))
            self.conn.execute(f"UPDATE progress SET {', '.join(f'{c} = ?' for c in fields)} WHERE agent = ?",
                              (*fields.values(), agent))

    def progress(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM progress ORDER BY agent")]

    def snapshot(self, frontier_size: int, hypervolume: float) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT INTO snapshots(at, n_evaluations, n_measured, frontier_size, hypervolume) VALUES (?, ?, ?, ?, ?)",
                (time.time(), self.count(), self.count(measured_only=True), frontier_size, hypervolume))

    def snapshots(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM snapshots ORDER BY id")]


def _migrate_from_2(conn: sqlite3.Connection) -> None:
    """A store of schema version 2 brought to 3 in one transaction: ``evaluations`` gains ``micro_batch`` (its
    rows are at the workload's own batch, 0), and the throughput search's measurements, kept in the meta key
    ``throughput_measured`` there, become rows of it at their micro-batches; the meta key is removed."""
    now = time.time()
    with conn:
        conn.execute("BEGIN")  # the table's rebuild too: sqlite3 begins none before DDL
        conn.execute("ALTER TABLE evaluations RENAME TO evaluations_v2")
        conn.execute(_EVALUATIONS)
        conn.execute(f"INSERT INTO evaluations({_V2_COLUMNS}) SELECT {_V2_COLUMNS} FROM evaluations_v2")
        conn.execute("DROP TABLE evaluations_v2")
        blob = conn.execute("SELECT value FROM meta WHERE key = ?", (meta.THROUGHPUT_MEASURED.name,)).fetchone()
        try:
            measured = meta.THROUGHPUT_MEASURED.loads(blob[0]) if blob else []
        except (ValidationError, json.JSONDecodeError) as e:
            raise StoreError(f"run store of schema version 2 holds a meta 'throughput_measured' that is not "
                             f"{_type_name(meta.THROUGHPUT_MEASURED)} ({_first_error(e)}); nothing was changed: "
                             "open it with the version that wrote it, or start a new run") from None
        for r in measured:
            m = r["record"]
            _insert(conn, m.model_copy(update={"sources": _proposers([], m.sources)}), r["micro_batch"], now)
        conn.execute("DELETE FROM meta WHERE key = ?", (meta.THROUGHPUT_MEASURED.name,))
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                     (meta.STORE_SCHEMA_VERSION.name, meta.STORE_SCHEMA_VERSION.dumps(SCHEMA_VERSION)))


def _insert(conn: sqlite3.Connection, m: MeasuredPlan, micro_batch: int, now: float) -> None:
    """A measured configuration's first row, everything in one statement."""
    conn.execute(
        "INSERT INTO evaluations(plan_digest, micro_batch, actions, proposers, measured, record, peak_bytes, "
        "step_seconds, clock, oom, created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?)",
        (m.digest, micro_batch, json.dumps(m.actions), json.dumps(m.sources), m.model_dump_json(), m.peak_bytes,
         None if m.oom else m.step_seconds, m.clock, int(m.oom), now, now))


def has_all(stored: MeasuredPlan, m: MeasuredPlan) -> bool:
    """Whether every measurement in ``m`` is merged into ``stored`` already (by id; one without ids never is)."""
    return bool(m.measurement_ids) and set(m.measurement_ids) <= set(stored.measurement_ids)


def _proposers(before: list[str], sources: list[str]) -> list[str]:
    """``before`` and then each named source new to it, once, in order."""
    return list(dict.fromkeys([*before, *(s for s in sources if s)]))


def _type_name(key: MetaKey[Any]) -> str:
    """``dict[str, str]``, ``ModelProfile | None``: the key's type as its declaration reads."""
    t = key.value_type
    plain = isinstance(t, type) and get_origin(t) is None
    return t.__name__ if plain else re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", str(t))  # no module paths


def _first_error(e: ValidationError | json.JSONDecodeError) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"not JSON: {e.msg}"
    first = e.errors()[0]
    where = ".".join(str(x) for x in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]

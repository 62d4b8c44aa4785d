"""RunStore: one SQLite file (WAL) per run folder, written as results arrive.

Tables:
- ``meta``: key -> JSON value (``config``, ``profile``, ``units``, ``fingerprint``, ``status``,
  ``started_at``, ``finished_at``, ``notes``).
- ``evaluations``: one row per distinct plan (``plan_digest`` unique), its measured and
  predicted memory and time, who proposed it first (``source``: an agent name, ``rule:<name>``,
  ``exact``), and all its timed samples; a repeat measurement adds samples to the same row.
- ``progress``: one row per agent: timesteps done, episodes, best reward, status.
- ``snapshots``: the frontier over time (evaluations so far, frontier size, hypervolume).

The dashboard reads this file and never imports Ray; readers open it read-only.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from env.errors import CkptSearchError
from env.measure import spread_seconds

STORE_NAME = "store.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    plan_digest TEXT NOT NULL UNIQUE,
    actions TEXT NOT NULL,              -- JSON list of action names, one per unit (units in meta)
    source TEXT NOT NULL,               -- who proposed it first: agent name, rule:<name>, exact
    proposers TEXT NOT NULL DEFAULT '[]', -- everyone who proposed it, first first (JSON list)
    measured INTEGER NOT NULL,          -- 1: peak/time below are measured
    peak_bytes INTEGER,                 -- measured peak (NULL until measured)
    live_before_bytes INTEGER,
    step_seconds REAL,                  -- median of step_samples
    step_samples TEXT NOT NULL DEFAULT '[]',
    predicted_peak_bytes INTEGER,
    predicted_step_seconds REAL,
    oom INTEGER NOT NULL DEFAULT 0,
    device TEXT, torch_version TEXT, batch_shape TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS progress (
    agent TEXT PRIMARY KEY, budget_bytes INTEGER, timesteps INTEGER NOT NULL DEFAULT 0,
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
class Evaluation:
    """One row of ``evaluations``."""

    id: int
    plan_digest: str
    actions: list[str]
    source: str
    proposers: list[str]
    measured: bool
    peak_bytes: int | None
    live_before_bytes: int | None
    step_seconds: float | None
    step_samples: list[float]
    predicted_peak_bytes: int | None
    predicted_step_seconds: float | None
    oom: bool
    device: str | None
    torch_version: str | None
    batch_shape: str | None
    created_at: float

    @property
    def spread_seconds(self) -> float:
        return spread_seconds(self.step_samples)


def _row_to_eval(r: sqlite3.Row) -> Evaluation:
    return Evaluation(
        id=r["id"], plan_digest=r["plan_digest"], actions=json.loads(r["actions"]), source=r["source"],
        proposers=json.loads(r["proposers"]),
        measured=bool(r["measured"]), peak_bytes=r["peak_bytes"], live_before_bytes=r["live_before_bytes"],
        step_seconds=r["step_seconds"], step_samples=json.loads(r["step_samples"]),
        predicted_peak_bytes=r["predicted_peak_bytes"], predicted_step_seconds=r["predicted_step_seconds"],
        oom=bool(r["oom"]), device=r["device"], torch_version=r["torch_version"], batch_shape=r["batch_shape"],
        created_at=r["created_at"],
    )


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
                self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30, check_same_thread=False)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.executescript(_SCHEMA)
            self.conn.row_factory = sqlite3.Row
            version = self.get_meta("store_schema_version")
        except sqlite3.DatabaseError as e:
            raise StoreError(
                f"run store '{path}' is corrupt or not a ckpt-search store ({e}); "
                "move it aside and start a new run (nothing was written to it)"
            ) from None
        if version is None and not readonly:
            self.set_meta("store_schema_version", SCHEMA_VERSION)
        elif version is not None and version != SCHEMA_VERSION:
            raise StoreError(f"run store '{path}' has schema version {version}, this ckpt-search reads {SCHEMA_VERSION}; "
                             "open it with the version that wrote it")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- meta ---------------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # -- evaluations --------------------------------------------------------------------------
    def record(self, plan_digest: str, actions: list[str], source: str, *, predicted_peak_bytes: int | None = None,
               predicted_step_seconds: float | None = None, peak_bytes: int | None = None,
               live_before_bytes: int | None = None, step_samples: list[float] | None = None, oom: bool = False,
               device: str | None = None, torch_version: str | None = None, batch_shape: str | None = None) -> Evaluation:
        """Insert a plan, or update its row: measured samples are added, never replaced."""
        now = time.time()
        with self.conn:
            row = self.conn.execute("SELECT * FROM evaluations WHERE plan_digest = ?", (plan_digest,)).fetchone()
            if row is None:
                self.conn.execute(
                    "INSERT INTO evaluations(plan_digest, actions, source, proposers, measured, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, 0, ?, ?)", (plan_digest, json.dumps(actions), source, json.dumps([source]), now, now))
            elif source not in json.loads(row["proposers"]):
                self.conn.execute("UPDATE evaluations SET proposers = ? WHERE plan_digest = ?",
                                  (json.dumps(json.loads(row["proposers"]) + [source]), plan_digest))
            if predicted_peak_bytes is not None:
                self.conn.execute(
                    "UPDATE evaluations SET predicted_peak_bytes = ?, predicted_step_seconds = ?, updated_at = ? "
                    "WHERE plan_digest = ?", (predicted_peak_bytes, predicted_step_seconds, now, plan_digest))
            if peak_bytes is not None or oom:
                old = json.loads(row["step_samples"]) if row is not None else []
                samples = old + list(step_samples or [])
                median = statistics.median(samples) if samples else None
                peak = max(peak_bytes or 0, (row["peak_bytes"] or 0) if row is not None else 0)
                self.conn.execute(
                    "UPDATE evaluations SET measured = 1, peak_bytes = ?, live_before_bytes = ?, step_seconds = ?, "
                    "step_samples = ?, oom = ?, device = ?, torch_version = ?, batch_shape = ?, updated_at = ? "
                    "WHERE plan_digest = ?",
                    (peak, live_before_bytes, median, json.dumps(samples), int(oom), device, torch_version,
                     batch_shape, now, plan_digest))
        got = self.get(plan_digest)
        assert got is not None
        return got

    def get(self, plan_digest: str) -> Evaluation | None:
        row = self.conn.execute("SELECT * FROM evaluations WHERE plan_digest = ?", (plan_digest,)).fetchone()
        return _row_to_eval(row) if row else None

    def evaluations(self, measured_only: bool = False) -> list[Evaluation]:
        q = "SELECT * FROM evaluations" + (" WHERE measured = 1" if measured_only else "") + " ORDER BY id"
        return [_row_to_eval(r) for r in self.conn.execute(q)]

    def count(self, measured_only: bool = False) -> int:
        q = "SELECT COUNT(*) FROM evaluations" + (" WHERE measured = 1" if measured_only else "")
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

    def iter_rows(self) -> Iterator[sqlite3.Row]:
        yield from self.conn.execute("SELECT * FROM evaluations ORDER BY id")

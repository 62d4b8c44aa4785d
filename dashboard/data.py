"""Load run folders for the dashboard: plain functions over RunStore (read-only) and frontier.json.

A run folder (written by ``python -m search.run``) holds ``store.sqlite`` and, once the search
has a frontier, ``frontier.json``. ``load_run`` turns one into a :class:`RunData` of pandas
tables: every evaluation (with its rule name, exact-frontier flag and whether it is on the
frontier), the frontier, progress and snapshots.

One frontier: the points of ``frontier.json`` (what export and ``plans/`` read), or, while the
search has not written it (or it is damaged), the same rule applied here to the measured
evaluations: the non-dominated plans, less those a plan at most ``memory_tolerance_bytes``
higher beats by more than the run's timing noise (``search.records.pareto.readable``). Every
page reads ``RunData.frontier`` and the ``on_frontier`` column; nothing computes another.
Nothing here imports Streamlit or Ray; the app caches these functions.
"""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from dashboard.pricing import with_measured
from env.data.errors import CkptSearchError
from env.data.model_profile import ModelProfile
from env.data.plan import Plan, action_summary
from env.data.unit_choice import UnitChoice
from search.records import meta
from search.records.frontier_file import FRONTIER_NAME, FrontierError, FrontierFile, load_frontier
from search.records.peer_verdicts import PeerVerdict
from search.records.meta import DriverProcess, PeerEntry
from search.records.pareto import MEMORY_TOLERANCE, fastest_within, nondominated, readable
from search.records.ranking import timing_noise
from search.records.store import STORE_NAME, RunStore, StoreError

LOG_NAME = "search.log"  # what a search started from the dashboard prints


class RunDataError(CkptSearchError):
    """A run folder the dashboard cannot show: broken store or frontier file."""


class RunNotReady(RunDataError):
    """A run folder that has no results yet (the search is starting, or never started)."""


@dataclass(frozen=True)
class RunSummary:
    """One line of the run picker."""

    run_id: str
    path: Path
    status: str  # running | finished | interrupted | failed | stopped (driver gone) | starting | broken
    workload: str
    started_at: float  # unix time; the folder's mtime when the store does not say


@dataclass
class RunData:
    """Everything the pages show of one run."""

    path: Path
    run_id: str
    status: str
    config: dict[str, Any]
    units: list[str]
    fingerprint: str
    profile: ModelProfile | None
    baseline_peak_bytes: float
    baseline_seconds: float
    clock: str  # what the run's step times were read from (env.measure.timeline.step_clock)
    evaluations: pd.DataFrame  # one row per plan; see _evaluations_frame (``on_frontier``: in ``frontier``)
    frontier: pd.DataFrame  # the one frontier every page shows (module docstring), fewest bytes first
    frontier_source: str  # "frontier.json" or "evaluations" (computed here)
    timing_noise: float  # the run's timing noise, a share of a step (search.records.ranking.timing_noise)
    memory_tolerance_bytes: float  # a peak lower by less is no reason to be slower (search.records.pareto.readable)
    rules: dict[str, str]  # rule name -> plan digest
    exact: list[str]  # plan digests of the cost model's optimal frontier
    agents: list[dict[str, Any]]
    batch_scaling: dict[str, list[dict[str, Any]]]
    batch_size: int | None
    progress: pd.DataFrame
    snapshots: pd.DataFrame
    unit_choice: UnitChoice | None  # the decision units with the bytes each saves for backward
    headroom: str | None  # set when no plan over the units can lower the peak by more than 5%
    peers: pd.DataFrame  # measured peers (env.measure.peers): see _peers_frame
    started_at: float | None = None
    finished_at: float | None = None
    workload: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # why a failed run failed (its status's cause, else its log's last line)
    fsdp_ranks: int = 0  # 0: one device; N: measured under FSDP2 with N ranks (peaks and times per rank)
    refused: dict[str, str] = field(default_factory=dict)  # digest -> the correctness gate's line: never exported
    baseline_digest: str = ""  # the all-keep plan's digest
    device: str = ""  # what the baseline was measured on (e.g. "cpu (1 threads)", a GPU's name)
    # peer name -> the verdict the search wrote to frontier.json (search.records.peer_verdicts), as report.md says it
    peer_verdicts: dict[str, PeerVerdict] = field(default_factory=dict)

    def plan(self, digest: str) -> Plan:
        """The evaluated plan with this digest, as an exportable :class:`Plan`."""
        row = self.evaluations.loc[self.evaluations.digest == digest]
        if row.empty:
            raise RunDataError(f"plan '{digest}' is not in run '{self.run_id}'; pick a plan from its evaluations")
        return Plan.from_list(self.units, row.iloc[0].actions, self.fingerprint)


def run_status(status: str, driver: DriverProcess | None) -> str:
    """The store's status, except that a run marked running whose driver process is gone (killed
    with SIGKILL, or its machine restarted) reads ``stopped``: it never finishes, ``--resume`` continues it."""
    if status != "running" or not driver or driver.get("host") != socket.gethostname():
        return status  # another host's process cannot be checked from here
    try:
        os.kill(int(driver["pid"]), 0)
    except ProcessLookupError:
        return "stopped"
    except (PermissionError, KeyError, TypeError, ValueError):
        return status
    return status


def log_error(run_dir: Path, last_only: bool = False) -> str | None:
    """What a search started from the dashboard printed last: its ``error: ...`` line (how
    ``search.run`` reports a failure) among the log's last lines, else (``last_only`` False) its last line."""
    log = run_dir / LOG_NAME
    if not log.is_file():
        return None
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines[-5:] if line.startswith("error: ")]
    if errors:
        return errors[-1].removeprefix("error: ")
    return None if last_only or not lines else lines[-1]


def stamp(run_dir: str | Path) -> tuple[float, ...]:
    """Modification times of the files a run folder's data comes from (a cache key)."""
    run_dir = Path(run_dir)
    names = (STORE_NAME, STORE_NAME + "-wal", FRONTIER_NAME)
    return tuple((run_dir / n).stat().st_mtime if (run_dir / n).exists() else 0.0 for n in names)


def _is_run_folder(p: Path) -> bool:
    return p.is_dir() and any((p / n).exists() for n in (STORE_NAME, FRONTIER_NAME, LOG_NAME, "config.json"))


def _summary(p: Path) -> RunSummary:
    if not (p / STORE_NAME).is_file():  # a search that stopped before its store: its log says why
        status = "failed" if log_error(p, last_only=True) else "starting"
        return RunSummary(p.name, p, status, "", p.stat().st_mtime)
    try:
        with RunStore(p / STORE_NAME, readonly=True) as s:
            config = s.read(meta.CONFIG) or {}
            status = run_status(s.read(meta.STATUS) or "running", s.read(meta.DRIVER))
            return RunSummary(p.name, p, status, str(config.get("workload", "")),
                              float(s.read(meta.STARTED_AT) or p.stat().st_mtime))
    except StoreError:
        return RunSummary(p.name, p, "broken", "", p.stat().st_mtime)


def list_runs(root: str | Path) -> list[RunSummary]:
    """Run folders directly under ``root`` (or ``root`` itself if it is one), newest first, broken ones last
    (a broken store's time is only its folder's, so the dashboard never opens on one)."""
    root = Path(root)
    if not root.is_dir():
        return []
    folders = [root] if _is_run_folder(root) else [p for p in root.iterdir() if _is_run_folder(p)]
    return sorted((_summary(p) for p in folders), key=lambda r: (r.status == "broken", -r.started_at, r.run_id))


def one_line(e: BaseException) -> str:
    """An exception as one line a user can read: a pydantic error's first field and message, not its type dump."""
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the value"
        return f"{where}: {first['msg']}"
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _evaluations_frame(store: RunStore, rules: dict[str, str], exact: list[str]) -> pd.DataFrame:
    """One row per plan; times as the search ranked them (``search.records.ranking.Ranking``)."""
    rank = store.ranking()
    by_digest: dict[str, str] = {}
    for name, d in rules.items():  # two rules can give the same plan (every_2 and sqrt_n on 4 units)
        by_digest[d] = f"{by_digest[d]} / {name}" if d in by_digest else name
    exact_set = set(exact)
    rows = []
    for e in store.plans():
        m = rank(e.measurement) if e.measurement is not None else None
        rows.append({
            "digest": e.digest, "actions": e.actions, "summary": action_summary(e.actions), "source": e.source,
            "measured": m is not None and not m.oom, "oom": m is not None and m.oom,
            "peak_bytes": m.peak_bytes if m else None, "step_seconds": m.step_seconds if m and not m.oom else None,
            "spread_seconds": m.spread_seconds if m else 0.0, "repeats": len(m.step_seconds_samples) if m else 0,
            "n_measurements": m.n_measurements if m else 0, "clock": m.clock if m else None,
            "live_before_bytes": m.live_before_bytes if m else None, "predicted_peak_bytes": e.predicted_peak_bytes,
            "predicted_step_seconds": e.predicted_step_seconds, "device": m.device if m else None,
            "torch_version": m.torch_version if m else None, "batch_shape": m.batch_shape if m else None,
            "created_at": e.created_at, "rule": by_digest.get(e.digest, ""), "exact": e.digest in exact_set,
            "paired": bool(rank.scale and m is not None and m.has_references),
        })
    cols = ["digest", "actions", "summary", "source", "measured", "oom", "peak_bytes", "step_seconds",
            "spread_seconds", "repeats", "n_measurements", "clock", "live_before_bytes", "predicted_peak_bytes", "predicted_step_seconds",
            "device", "torch_version", "batch_shape", "created_at", "rule", "exact", "paired"]
    return pd.DataFrame(rows, columns=cols)


def _frontier_from_file(ff: FrontierFile, units: list[str]) -> pd.DataFrame:
    rows = []
    for p in ff.points:
        plan = ff.plan(p)
        rows.append({"digest": plan.digest, "actions": [a.value for a in plan.action_list(units or ff.units)],
                     "summary": plan.summary(), "source": p.source, "peak_bytes": p.peak_bytes,
                     "step_seconds": p.step_seconds, "spread_seconds": p.spread_seconds,
                     "activation_bytes": p.activation_bytes, "compile_scope": p.compile_scope})
    return pd.DataFrame(rows)


def _frontier_from_evaluations(evaluations: pd.DataFrame, tolerance: float, noise: float) -> pd.DataFrame:
    """The frontier as the search writes it, from the measured evaluations: non-dominated, then without a plan
    that one at most ``tolerance`` bytes higher beats by more than ``noise`` (``search.records.pareto.readable``)."""
    f = evaluations.loc[evaluations.measured].copy()
    if len(f):
        f = f.loc[nondominated(f[["peak_bytes", "step_seconds"]].to_numpy(dtype=float))]
        f = f.loc[readable(f.peak_bytes.astype(float).tolist(), f.step_seconds.astype(float).tolist(), tolerance, noise)]
    f["activation_bytes"] = f.peak_bytes - f.live_before_bytes.fillna(0)
    return f[["digest", "actions", "summary", "source", "peak_bytes", "step_seconds", "spread_seconds",
              "activation_bytes"]]


def _frontier(run_dir: Path, units: list[str], evaluations: pd.DataFrame, tolerance: float,
              noise: float) -> tuple[pd.DataFrame, str, float, float, list[str], dict[str, PeerVerdict]]:
    """(frontier, its source, memory tolerance, timing noise, notes): ``frontier.json``'s points and the rule
    it was written with; without the file, or where it is damaged, the same rule over the store's evaluations."""
    if (run_dir / FRONTIER_NAME).is_file():
        try:
            ff = load_frontier(run_dir)
        except FrontierError as e:
            note = (f"{FRONTIER_NAME} cannot be read ({e}); the frontier shown is computed from the run's store, "
                    "which is intact")
        else:
            rule = ff.readable or {}
            return (_frontier_from_file(ff, units), "frontier.json",
                    float(rule.get("memory_tolerance_bytes", tolerance)), float(rule.get("timing_noise", noise)), [],
                    _peer_verdicts(ff))
    else:
        note = f"no {FRONTIER_NAME} yet: the frontier shown is computed from the measured evaluations"
    return _frontier_from_evaluations(evaluations, tolerance, noise), "evaluations", tolerance, noise, [note], {}


def _peer_verdicts(ff: FrontierFile) -> dict[str, PeerVerdict]:
    """The peers' verdicts a frontier file holds, by peer (none in a file older than them)."""
    return {v.peer: v for v in ff.peers}


def _baseline(profile: ModelProfile | None, evaluations: pd.DataFrame,
              baseline_digest: str | None) -> tuple[float, float]:
    row = evaluations.loc[(evaluations.digest == baseline_digest) & evaluations.measured]
    if not row.empty:
        return float(row.iloc[0].peak_bytes), float(row.iloc[0].step_seconds)
    if profile is not None and profile.baseline is not None:
        return float(profile.baseline.peak_bytes), float(profile.baseline.step_seconds)
    return math.nan, math.nan


def load_run(run_dir: str | Path) -> RunData:
    """Read one run folder. Raises :class:`RunNotReady` (no results yet) or :class:`RunDataError`."""
    run_dir = Path(run_dir)
    if not (run_dir / STORE_NAME).is_file():
        log = run_dir / LOG_NAME
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
        raise RunNotReady(f"run '{run_dir.name}' has no results yet (no {STORE_NAME}); the search is starting"
                          + (f" (last log line: {tail[0]})" if tail else ", or it never started: see its folder"))
    try:
        with RunStore(run_dir / STORE_NAME, readonly=True) as store:
            return _read(run_dir, store)
    except StoreError as e:
        raise RunDataError(str(e)) from None
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise RunDataError(f"run '{run_dir.name}' cannot be read ({one_line(e)}); it was written by another "
                           "ckpt-search version, or is damaged: start a new run") from None


def _read(run_dir: Path, store: RunStore) -> RunData:
    import sqlite3

    try:
        return _run_data(run_dir, store)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"run store '{store.path}' is corrupt ({e}); move it aside and start a new run") from None


def _run_data(run_dir: Path, store: RunStore) -> RunData:
    profile = store.read(meta.PROFILE)
    rules, exact = store.read(meta.RULES), store.read(meta.EXACT)
    evaluations = _evaluations_frame(store, rules, exact)
    base_peak, base_seconds = _baseline(profile, evaluations, store.read(meta.BASELINE_DIGEST))
    evaluations["peak_rel"] = evaluations.peak_bytes.astype(float) / base_peak
    evaluations["time_rel"] = evaluations.step_seconds.astype(float) / base_seconds
    units = store.read(meta.UNITS) or (profile.units if profile else [])
    rank = store.ranking()
    records = [rank(m) for m in store.measured() if not m.oom]
    base = store.baseline()
    tolerance = MEMORY_TOLERANCE * (base.activation_bytes if base is not None else 0)
    frontier, source, tolerance, noise, notes, verdicts = _frontier(run_dir, units, evaluations, tolerance,
                                                                   timing_noise(records))
    evaluations["on_frontier"] = evaluations.digest.isin(set(frontier.digest)) & evaluations.measured
    evaluations["dominated"] = ~evaluations.on_frontier
    if not frontier.empty:
        frontier = frontier.sort_values(["peak_bytes", "step_seconds"]).reset_index(drop=True)
        frontier["peak_rel"] = frontier.peak_bytes / base_peak
        frontier["time_rel"] = frontier.step_seconds / base_seconds
    config = store.read(meta.CONFIG) or {}
    peers = _peers_frame(store.read(meta.PEERS), base_peak, base_seconds, store)
    clocks = evaluations.loc[evaluations.measured, "clock"].dropna().unique().tolist()
    clock = clocks[0] if len(clocks) == 1 else (" / ".join(clocks) if clocks else (profile.clock if profile else ""))
    status = run_status(store.read(meta.STATUS) or "running", store.read(meta.DRIVER))
    return RunData(
        path=run_dir, run_id=run_dir.name, status=status, config=config, units=units,
        fingerprint=store.read(meta.FINGERPRINT) or (profile.fingerprint if profile else ""), profile=profile,
        baseline_peak_bytes=base_peak, baseline_seconds=base_seconds, clock=clock, evaluations=evaluations,
        frontier=frontier, frontier_source=source, timing_noise=noise, memory_tolerance_bytes=tolerance, rules=rules, exact=exact, agents=[dict(a) for a in store.read(meta.AGENTS)],
        batch_scaling=with_measured(store.read(meta.BATCH_SCALING), store.measured_at_micro_batches(),
                                    _own_points(frontier, store.read(meta.BATCH_SIZE))),
        batch_size=store.read(meta.BATCH_SIZE), progress=pd.DataFrame(store.progress()),
        snapshots=pd.DataFrame(store.snapshots()), peers=peers,
        headroom=store.read(meta.HEADROOM), unit_choice=store.read(meta.UNIT_CHOICE),
        started_at=store.read(meta.STARTED_AT), finished_at=store.read(meta.FINISHED_AT),
        workload=str(config.get("workload", profile.workload if profile else "")), notes=notes,
        error=_failure(run_dir, store.read(meta.STATUS) or ""),
        fsdp_ranks=(store.read(meta.FSDP) or {}).get("ranks", 0),
        refused={d: c.line() for d, c in store.read(meta.GATE).items() if not c.passed},
        baseline_digest=store.read(meta.BASELINE_DIGEST) or "",
        device=base.device if base is not None else (profile.device if profile else ""),
        peer_verdicts=verdicts,
    )


def _failure(run_dir: Path, status: str) -> str | None:
    """Why a ``failed`` (or ``failed: <cause>``) run failed."""
    if not status.startswith("failed"):
        return None
    return status.partition(":")[2].strip() or log_error(run_dir) or "no cause recorded; see the search's output"


PEER_COLUMNS = ["peer", "peak_bytes", "step_seconds", "spread_seconds", "repeats", "peak_rel", "time_rel", "note"]


def _peers_frame(peers: dict[str, PeerEntry], base_peak: float, base_seconds: float, store: RunStore) -> pd.DataFrame:
    """The store's measured peers (that ran) on the frontier's axes, times ranked as the plans' are, each with
    the spread (IQR) and number of its step samples."""
    rows = []
    rank = store.ranking()
    for name, entry in peers.items():
        m = rank(entry["record"])
        if not m.oom:
            rows.append({"peer": name, "peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds,
                         "spread_seconds": m.spread_seconds, "repeats": len(m.step_seconds_samples),
                         "peak_rel": m.peak_bytes / base_peak, "time_rel": m.step_seconds / base_seconds,
                         "note": entry.get("note", "")})
    return pd.DataFrame(rows, columns=PEER_COLUMNS)


def select_plan(frontier: pd.DataFrame, budget_bytes: float) -> pd.Series | None:
    """The fastest frontier plan whose peak fits the budget (fewer bytes breaks ties); None if none fits."""
    best = fastest_within(frontier.peak_bytes.tolist(), frontier.step_seconds.tolist(), budget_bytes)
    return None if best is None else frontier.iloc[best]


def nearest_rule(run: RunData, digest: str) -> pd.Series | None:
    """The measured baseline rule closest to a plan, on axes relative to the all-keep baseline."""
    ev = run.evaluations
    rules = ev.loc[(ev.rule != "") & ev.measured & (ev.digest != digest)]
    me = ev.loc[ev.digest == digest]
    if rules.empty or me.empty or not me.iloc[0].measured:
        return None
    d = np.hypot(rules.peak_rel - me.iloc[0].peak_rel, rules.time_rel - me.iloc[0].time_rel)
    return rules.loc[d.idxmin()]


def unit_table(run: RunData, actions: list[str]) -> pd.DataFrame:
    """Per unit of a plan: its action, and from the profile the bytes it keeps and its time."""
    rows = []
    prof = run.profile
    for i, (unit, action) in enumerate(zip(run.units, actions)):
        row: dict[str, Any] = {"unit": unit, "action": action}
        if prof is not None and i < len(prof.units):
            cost = next((c[i] for a, c in prof.costs.items() if a.value == action), None)
            keep = next(c[i] for a, c in prof.costs.items() if a.value == "keep")
            if cost is not None:
                seconds = cost.fwd.seconds + cost.bwd.seconds
                row.update(kept_bytes=cost.kept_bytes, backward_peak_bytes=cost.backward_peak_bytes, seconds=seconds,
                           extra_seconds=seconds - (keep.fwd.seconds + keep.bwd.seconds),
                           saved_bytes=keep.kept_bytes - cost.kept_bytes)
        rows.append(row)
    return pd.DataFrame(rows)


def _own_points(frontier: pd.DataFrame, batch_size: int | None) -> dict[str, dict[str, Any]]:
    """Each frontier plan's point at the run's own batch, as shown (``dashboard.pricing.with_measured``)."""
    if batch_size is None or frontier.empty:
        return {}
    return {r.digest: {"batch_size": batch_size, "peak_bytes": int(r.peak_bytes), "step_seconds": float(r.step_seconds),
                       "oom": False, "clock": getattr(r, "clock", "")} for r in frontier.itertuples()}

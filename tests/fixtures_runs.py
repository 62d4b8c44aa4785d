"""Build small, real run folders for the dashboard's tests and screenshots.

A run folder is what ``python -m search.run`` writes: ``store.sqlite`` (RunStore) and, once the
frontier is known, ``frontier.json``. Every number here is measured on this machine with
``env.measure.measurement.measure`` and predicted with ``env.cost.cost_model.CostModel`` from a real
``env.measure.profiler.profile``; only the choice of plans is scripted (the baseline rules, the cost
model's exact frontier, a few random plans), not their memory or time.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from env.cost.cost_model import CostModel
from env.data.errors import PlanError
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan import Action, Plan, fingerprint
from env.data.segments import checkpoint_sequential_actions
from env.data.types import PlanSource
from env.measure.measurement import measure
from env.measure.profiler import profile
from env.units.find import find_units
from env.workloads.workload import load_workload
from search.records import meta
from search.records.frontier_file import Baseline, FrontierFile, point_from, write_frontier
from search.records.pareto import hypervolume, nondominated
from search.records.store import STORE_NAME, RunStore

RULE_ACTIONS = (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE)


def rule_plans(n: int, seed: int = 0) -> dict[str, list[Action]]:
    """The baseline rules the search service shows beside every frontier."""
    rng = random.Random(seed)
    return {
        "none": [Action.KEEP] * n,
        "all": [Action.RECOMPUTE] * n,
        "every_2": [Action.RECOMPUTE if i % 2 == 0 else Action.KEEP for i in range(n)],
        "all_selective": [Action.SELECTIVE] * n,
        "random_0": [rng.choice((Action.KEEP, Action.RECOMPUTE)) for _ in range(n)],
        "segments_2": checkpoint_sequential_actions(n, 2, [False] + [True] * (n - 1)),
    }


def exact_plans(cost_model: CostModel, actions: Sequence[Action]) -> list[list[Action]]:
    """The cost model's optimal frontier by enumeration (tiny models only: |actions|**n plans)."""
    combos = list(itertools.product(range(len(actions)), repeat=cost_model.n_units))
    points = np.array([[cost_model.peak_bytes(c), cost_model.step_seconds(c)] for c in combos])
    keep = nondominated(points)
    return [[actions[a] for a in combos[i]] for i in np.flatnonzero(keep)]


def _record(store: RunStore, plan: Plan, units: list[str], source: str, m: MeasuredPlan, cm: CostModel) -> None:
    try:
        pred = cm.predict(plan)
        peak, seconds = pred.peak_bytes, pred.step_seconds
    except PlanError:  # a chain plan (the segments rule): the profile has no chain costs, as on a search without them
        peak, seconds = None, None
    store.propose(plan.digest, [a.value for a in plan.action_list(units)], source,
                  predicted_peak_bytes=peak, predicted_step_seconds=seconds)
    store.record(m.proposed_by(source))


def _batch_scaling(spec: str, batch_size: int, plans: list[Plan], units: list[str]) -> dict[str, list[dict]]:
    """Each plan measured at the run's batch size, twice and four times it."""
    out: dict[str, list[dict]] = {p.digest: [] for p in plans}
    for b in (batch_size, 2 * batch_size, 4 * batch_size):
        w = load_workload(f"{spec}{'&' if '?' in spec else '?'}batch_size={b}")
        for p in plans:
            m = measure(w, p, units, repeats=1, warmup=0)
            out[p.digest].append({"batch_size": b, "peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds})
    return out


def _peers(w: object) -> dict[str, dict]:
    """``checkpoint_sequential`` peers (2 and n segments) measured as the search measures them
    (``env.measure.peers``), stored as the search stores them (``meta.PEERS``)."""
    from env.measure.peers import checkpoint_sequential_peer, find_chain, measure_peer

    chain = find_chain(w)  # type: ignore[arg-type]
    if chain is None:
        return {}
    n_blocks = len(w.model.get_submodule(chain))  # type: ignore[attr-defined]
    peers = [checkpoint_sequential_peer(k, chain) for k in sorted({2, n_blocks})]
    return {p.name: {"record": measure_peer(w, p, repeats=5), "note": ""} for p in peers}  # type: ignore[arg-type]


def _measured_plans(store: RunStore, fp: str, units: list[str]) -> list[Plan]:
    """Every measured plan (fewest bytes first): the frontier the dashboard ranks (references, floor, the readable
    rule) is among them whatever the timing noise, where the raw non-dominated set under load can miss it."""
    evals = sorted(store.measured(), key=lambda e: e.peak_bytes)
    return [Plan.from_list(units, e.actions, fp) for e in evals if not e.oom]


def _snapshots(store: RunStore, prof: ModelProfile) -> None:
    """Frontier size and hypervolume after each evaluation, as the search service records them."""
    evals = store.measured()
    created = [p.created_at for p in store.plans() if p.measurement is not None]
    base = prof.baseline
    assert base is not None
    for k in range(1, len(evals) + 1):
        pts = np.array([[e.peak_bytes / base.peak_bytes, e.step_seconds / base.step_seconds] for e in evals[:k]])
        front = pts[nondominated(pts)]
        hv = hypervolume(front)
        store.conn.execute(
            "INSERT INTO snapshots(at, n_evaluations, n_measured, frontier_size, hypervolume) VALUES (?, ?, ?, ?, ?)",
            (created[k - 1], k, k, len(front), hv))
    store.conn.commit()


def write_frontier_json(run_dir: Path, store: RunStore, prof: ModelProfile) -> Path:
    """``frontier.json`` (search.records.frontier_file) from the store's measured non-dominated evaluations."""
    units = store.read(meta.UNITS)
    rank = store.ranking()  # the times the search and the dashboard rank plans by
    evals = [rank(e) for e in store.measured() if not e.oom]
    front = [e for e, k in zip(evals, nondominated([[e.peak_bytes, e.step_seconds] for e in evals])) if k]
    assert prof.baseline is not None
    points = [point_from(e, units) for e in front]
    doc = FrontierFile(workload=prof.workload, batch_shape=prof.batch_shape, device=evals[0].device or prof.device,
                       clock=evals[0].clock, fingerprint=prof.fingerprint, units=units, points=points,
                       baseline=Baseline(peak_bytes=prof.baseline.peak_bytes, step_seconds=prof.baseline.step_seconds))
    return write_frontier(run_dir, doc)


_CACHE: dict[tuple, Path] = {}


def cached_run(workload: str = "gpt/tiny", status: str = "finished", frontier_json: bool = True) -> Path:
    """A run folder built once per process (tests share it read-only; copy it to change it)."""
    key = (workload, status, frontier_json)
    if key not in _CACHE:
        root = Path(tempfile.mkdtemp(prefix="ckpt-dashboard-runs-"))
        _CACHE[key] = build_run(root, f"{workload.replace('/', '-')}-{status}", workload, status,
                                frontier_json=frontier_json)
    return _CACHE[key]


def build_run(root: str | Path, run_id: str = "run-a", workload: str = "gpt/tiny", status: str = "finished",
              n_random: int = 4, frontier_json: bool = True, seed: int = 0, started_at: float | None = None) -> Path:
    """Profile, measure and store a small real run under ``root/run_id``; returns the run folder.

    Runs torch on one thread: on a shared 2-core machine two spinning threads per process made a
    gpt/tiny step 280x slower (2.8 s against 0.01 s).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _build_run(Path(root) / run_id, workload, status, n_random, frontier_json, seed, started_at)
    finally:
        torch.set_num_threads(threads)


def _build_run(run_dir: Path, workload: str, status: str, n_random: int, frontier_json: bool, seed: int,
               started_at: float | None) -> Path:
    w = load_workload(workload, seed=seed)
    units = find_units(w.model)
    fp = fingerprint(w.model, units)
    prof = profile(w, units, repeats=1)
    cm = CostModel(prof)
    batch_size = int(w.meta["options"]["batch_size"])
    rules = {name: Plan.from_list(units, acts, fp) for name, acts in rule_plans(len(units), seed).items()}
    exact = [Plan.from_list(units, acts, fp) for acts in exact_plans(cm, prof.actions)]
    rng = random.Random(seed + 1)
    randoms = [Plan.from_list(units, [rng.choice(prof.actions) for _ in units], fp) for _ in range(n_random)]
    with RunStore(run_dir / STORE_NAME) as store:
        started = started_at if started_at is not None else time.time()
        store.write(meta.CONFIG, {"workload": workload, "agents": 2, "timesteps": 256, "reward": "measured",
                                  "seed": seed})
        for key, value in ((meta.UNITS, units), (meta.FINGERPRINT, fp), (meta.PROFILE, prof),
                           (meta.STATUS, status), (meta.STARTED_AT, started), (meta.BATCH_SIZE, batch_size),
                           (meta.BASELINE_DIGEST, rules["none"].digest),
                           (meta.RULES, {n: p.digest for n, p in rules.items()}),
                           (meta.EXACT, [p.digest for p in exact]),
                           (meta.AGENTS, [{"name": "agent_0", "budget_bytes": int(prof.baseline.peak_bytes * 0.9)},
                                          {"name": "agent_1", "budget_bytes": int(prof.baseline.peak_bytes * 0.97)}])):
            store.write(key, value)
        labelled = [(p, PlanSource.rule(n)) for n, p in rules.items()] + [(p, PlanSource.EXACT) for p in exact]
        labelled += [(p, PlanSource.agent(i % 2)) for i, p in enumerate(randoms)]
        measure(w, rules["none"], units, repeats=5)  # not stored: the first plan measured ran slow (cold caches)
        for plan, source in labelled:
            if store.get(plan.digest) is None:
                _record(store, plan, units, source, measure(w, plan, units, repeats=5), cm)
        for i in range(2):
            done = 256 if status == "finished" else 96 + 32 * i
            store.set_progress(f"agent_{i}", budget_bytes=int(prof.baseline.peak_bytes * (0.9 + 0.07 * i)),
                               timesteps=done, total_timesteps=256, episodes=done // len(units), best_reward=0.1 * i,
                               status="finished" if status == "finished" else "running")
        _snapshots(store, prof)
        store.write(meta.PEERS, _peers(w))
        store.write(meta.BATCH_SCALING, _batch_scaling(workload, batch_size, _measured_plans(store, fp, units), units))
        if frontier_json:
            write_frontier_json(run_dir, store, prof)
        if status != "running":
            store.write(meta.FINISHED_AT, started + 60.0)
    return run_dir


if __name__ == "__main__":  # build a demo run folder: python -m tests.fixtures_runs runs-demo
    import sys

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "runs-demo")
    t0 = time.perf_counter()
    print(build_run(target, "gpt-tiny"), build_run(target, "cnn-tiny", workload="cnn/tiny", frontier_json=False),
          f"{time.perf_counter() - t0:.1f} s")

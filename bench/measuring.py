"""How the benchmarks measure plans so that a quote is fair: one Evaluator, interleaved rounds, equal samples.

- ``Ledger``: every plan a benchmark measures, through one ``search.engine.evaluator.Evaluator``
  (one measurement function, one cache); repeats merge into one ``MeasuredPlan``.
- ``evenly_mixed``: groups spread over one order of measurement, beside the library's rounds
  (``env.data.rounds``: ``rotated``, ``serpentine``, ``interleaved``, which the profiler's rounds use too),
  so that a change of machine load over a run falls on every plan compared alike.
- ``measure_rounds``: plans of one workload measured by the library's ``measure`` in its interleaved rounds.
- ``check_equal_samples``: a quote refuses plans timed unequally (no best-of-many flattery).
- ``hv_of``/``front_of``/``point_row``: measured plans on the normalised axes of
  ``search.records.pareto``.
- ``random_plans``: distinct uniform random plans, the random-search baseline and the plans
  that throughput and fidelity are measured on.
- ``run_search``: the CLI ``python -m search.run`` in a subprocess, as a user runs it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from bench.common import ROOT, BenchError, Result
from env.data.measured import MeasuredPlan
from env.data.plan import Action
from env.data.rounds import interleaved
from search.records.pareto import REFERENCE, hypervolume, nondominated, normalise

T = TypeVar("T")
Evaluate = Callable[[list[str], str, bool], MeasuredPlan]  # (action names, source, again) -> its record


def evenly_mixed(*groups: Sequence[T]) -> list[T]:
    """The groups' items in one sequence, each group spread evenly over it (the i-th of n items at
    (i + 0.5) / n of the way; ties in group order): with equal lengths a1 b1 c1 a2 b2 c2 ..."""
    placed = [((i + 0.5) / len(g), k, i) for k, g in enumerate(groups) for i in range(len(g))]
    return [groups[k][i] for _, k, i in sorted(placed)]


def random_plans(n_units: int, n_actions: int, count: int, seed: int) -> list[tuple[int, ...]]:
    """``count`` distinct plans as action indices, each unit's action uniform (every plan of the
    space, in order, when it holds no more than ``count``)."""
    if n_actions ** n_units <= count:
        return list(itertools.product(range(n_actions), repeat=n_units))
    rng, seen = np.random.default_rng(seed), dict[tuple[int, ...], None]()
    while len(seen) < count:
        seen.setdefault(tuple(int(a) for a in rng.integers(0, n_actions, n_units)), None)
    return list(seen)


def measure_rounds(w: Any, units: list[str], plans: dict[str, Any], repeats: int, rounds: int) -> dict[str, MeasuredPlan]:
    """Each plan of workload ``w`` measured (``env.measure.measurement.measure``) in ``rounds``
    interleaved rounds of ``repeats`` timed steps after one warm-up step, merged."""
    from env.measure.measurement import measure

    return interleaved({name: lambda p=p: measure(w, p, units, repeats=repeats, warmup=1) for name, p in plans.items()},
                       rounds)


def check_equal_samples(records: Sequence[MeasuredPlan], what: str) -> int:
    """Refuse a quote whose plans were not timed alike; the number of samples each has."""
    counts = {len(r.step_seconds_samples) for r in records}
    if len(counts) != 1:
        raise BenchError(f"{what}: quoted plans were timed {sorted(counts)} times; quote plans measured alike")
    return counts.pop()


class Ledger:
    """Every plan one benchmark measures, through one ``search.engine.evaluator.Evaluator`` (a local
    instance or its Ray actor), so that all methods share one measurement function and cache.
    Repeats of a plan merge into its ``MeasuredPlan`` (``MeasuredPlan.merged``, never twice)."""

    def __init__(self, evaluate: Evaluate, actions: Sequence[Action]) -> None:
        self.evaluate, self.actions = evaluate, list(actions)
        self.records: dict[tuple[int, ...], MeasuredPlan] = {}
        self.new_measurements = 0  # measurements made for this ledger (not adopted ones)
        self._seen: set[str] = set()  # measurement ids already in a record here

    def adopt(self, key: Sequence[int], record: MeasuredPlan) -> None:
        """A plan measured elsewhere (e.g. by the search run) joins the ledger, not counted as new."""
        key = tuple(int(a) for a in key)
        self.records[key] = self.records[key].merged(record) if key in self.records else record
        self._seen.update(record.measurement_ids)

    def measure(self, plan: Sequence[int], source: str, again: bool = False) -> MeasuredPlan:
        """The plan's record; measured now unless the Evaluator has it (``again``: add a repeat)."""
        key = tuple(int(a) for a in plan)
        r = self.evaluate([self.actions[a].value for a in key], source, again)
        if r.oom:
            raise BenchError(f"plan {list(key)} ran out of memory on {r.device}; pick a smaller workload size")
        old = self.records.get(key)
        self.records[key] = old.merged(r) if old is not None else r
        fresh = set(r.measurement_ids) - self._seen
        self.new_measurements += len(fresh)
        self._seen |= fresh
        return self.records[key]

    def normalised(self, plans: Sequence[Sequence[int]], base: MeasuredPlan) -> np.ndarray:
        """(n, 2) of (peak, seconds) relative to ``base``, from the current records."""
        recs = [self.records[tuple(p)] for p in plans]
        return normalise([(r.peak_bytes, r.step_seconds) for r in recs], base.peak_bytes, base.step_seconds)


def hv_of(ledger: Ledger, plans: Sequence[Sequence[int]], base: MeasuredPlan) -> float:
    """Hypervolume (search.records.pareto convention) of the measured plans."""
    return hypervolume(ledger.normalised(plans, base), REFERENCE) if plans else 0.0


def front_of(ledger: Ledger, plans: Sequence[Sequence[int]], base: MeasuredPlan) -> list[tuple[int, ...]]:
    """The non-dominated plans among ``plans`` (measured), sorted by peak."""
    uniq = list(dict.fromkeys(tuple(p) for p in plans))
    if not uniq:
        return []
    mask = nondominated(ledger.normalised(uniq, base))
    return sorted((p for p, k in zip(uniq, mask) if k), key=lambda p: ledger.records[p].peak_bytes)


def point_row(ledger: Ledger, plan: Sequence[int], base: MeasuredPlan) -> Result:
    """A plan's measured numbers as a JSON row, with savings and slowdown against ``base``."""
    r = ledger.records[tuple(plan)]
    return {"plan": list(r.actions), "peak_bytes": r.peak_bytes,
            "activation_bytes": r.activation_bytes, "step_seconds": r.step_seconds,
            "spread_seconds": r.spread_seconds, "clock": r.clock,
            "n_timed_steps": len(r.step_seconds_samples), "n_measurements": r.n_measurements,
            "peak_ratio": r.peak_bytes / base.peak_bytes,
            "time_ratio": r.step_seconds / base.step_seconds,
            "peak_saving": 1 - r.peak_bytes / base.peak_bytes,
            "activation_saving": 1 - r.activation_bytes / base.activation_bytes,
            "slowdown": r.step_seconds / base.step_seconds - 1}


def run_search(flags: Sequence[str], out: Path | None = None, cwd: Path | None = None) -> tuple[Result, float]:
    """``python -m search.run`` with ``flags`` into ``out/run`` (a temporary folder when None), run from
    the code in ``cwd`` (this repository when None; another tree goes on the child's ``PYTHONPATH`` too,
    so that its Ray workers import it): its report.json and the wall seconds it took (the clock a user
    waits by). A failed run raises ``BenchError`` with the CLI's last lines."""
    with tempfile.TemporaryDirectory(prefix="bench_search_") as tmp:
        folder = str(out or tmp)
        cmd = [sys.executable, "-m", "search.run", "--no-progress", "--out", folder, "--name", "run", *flags]
        t0 = time.perf_counter()
        env = None if cwd is None else {**os.environ, "PYTHONPATH": str(cwd)}
        done = subprocess.run(cmd, cwd=cwd or ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise BenchError(f"search.run {' '.join(flags)} failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
        return json.loads((Path(folder) / "run" / "report.json").read_text()), wall

"""Exact frontier against the rule baselines, on the cost model, for gpt, cnn and lstm.

    python bench/frontier_table.py                         # default sizes, ~1 min profiling each
    python bench/frontier_table.py --workloads gpt/small cnn/small lstm/small
    python bench/frontier_table.py --profile-dir DIR       # reuse/save DIR/<spec>.json profiles

For each workload: the exact frontier's size and hypervolume (``search.records.pareto`` convention:
axes divided by the all-keep plan, reference (1.1, 2.0)), the rules' hypervolume, and for
each rule the extra step time it pays against the exact frontier at equal memory: its time
over that of the fastest frontier point whose peak is no higher than the rule's, minus one.
All numbers are cost-model predictions from one profile per workload (``profile()``: its own
warm-up and timed steps on this process's threads); the only clock is the solver's time
(``time.perf_counter``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.baselines import baseline_rules  # noqa: E402
from agents.exact import FrontierPoint, exact_frontier  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from env.cost.cost_model import CostModel  # noqa: E402
from env.data.model_profile import ModelProfile  # noqa: E402
from env.data.plan import Action  # noqa: E402
from search.records.pareto import REFERENCE, hypervolume, normalise  # noqa: E402


def get_profile(spec: str, profile_dir: Path | None) -> ModelProfile:
    path = profile_dir / f"{spec.replace('/', '_')}.json" if profile_dir else None
    if path and path.is_file():
        return ModelProfile.model_validate_json(path.read_text())
    from env.measure.profiler import profile
    from env.units.find import find_units
    from env.workloads.workload import load_workload

    w = load_workload(spec)
    prof = profile(w, find_units(w.model), baseline=False)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(prof.model_dump_json())
    return prof


def extra_time(frontier: list[FrontierPoint], peak: int, seconds: float) -> float:
    """seconds / (fastest frontier time at peak <= ``peak``) - 1; the frontier's first point
    is the lowest peak of all plans, so one always qualifies."""
    best = min(p.step_seconds for p in frontier if p.peak_bytes <= peak)
    return seconds / best - 1.0


def workload_row(spec: str, prof: ModelProfile) -> dict[str, Any]:
    cm = CostModel(prof)
    keep = [prof.actions.index(Action.KEEP)] * cm.n_units
    base_peak, base_s = cm.peak_bytes(keep), cm.step_seconds(keep)
    t0 = time.perf_counter()
    frontier = exact_frontier(cm)
    solve_s = time.perf_counter() - t0
    rules = {}
    for name, plan in baseline_rules(cm.n_units, prof.actions, seed=0).items():
        pred = cm.predict(plan)
        rules[name] = {"plan": [prof.actions[a].value for a in plan],
                       "peak_ratio": pred.peak_bytes / base_peak, "time_ratio": pred.step_seconds / base_s,
                       "extra_time": extra_time(frontier, pred.peak_bytes, pred.step_seconds)}
    front = normalise([(p.peak_bytes, p.step_seconds) for p in frontier], base_peak, base_s)
    rule_pts = [(r["peak_ratio"], r["time_ratio"]) for n, r in rules.items() if not n.startswith("random")]
    return {
        "workload": spec, "n_units": cm.n_units, "actions": [a.value for a in prof.actions],
        "plans": len(prof.actions) ** cm.n_units,
        "baseline_peak_bytes": base_peak, "baseline_seconds": base_s,
        "solve_seconds": solve_s, "frontier_size": len(frontier),
        "hypervolume": hypervolume(front, REFERENCE), "rules_hypervolume": hypervolume(rule_pts, REFERENCE),
        "lowest_peak_ratio": float(front[0][0]), "frontier": [
            {"plan": [prof.actions[a].value for a in p.plan], "peak_ratio": float(x), "time_ratio": float(y)}
            for p, (x, y) in zip(frontier, front)],
        "rules": rules,
    }


def measure(run: Run) -> None:
    rows = [workload_row(spec, get_profile(spec, run.args.profile_dir)) for spec in run.args.workloads]
    run.result.update({"reference": REFERENCE, "workloads": rows})


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=["gpt", "cnn", "lstm"], help="workload specs")
    ap.add_argument("--profile-dir", type=Path, help="load <spec>.json profiles from here, save new ones")


BENCH = Bench("frontier_table", __doc__, options, quick={"workloads": ["gpt/tiny", "cnn/tiny", "lstm/tiny"]})

if __name__ == "__main__":
    main(BENCH, measure)

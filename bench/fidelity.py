"""Cost-model fidelity: predicted peak memory and step time against measure(), on random plans.

    python bench/fidelity.py                                   # every built-in (~10 min, 2 cores)
    python bench/fidelity.py --workloads gpt mlp --plans 20    # the default sizes of these two too
    python bench/fidelity.py --workloads gpt/tiny cnn/tiny --plans 20

By default cnn and lstm run at their default sizes and gpt and mlp at their ``small`` presets:
at the default sizes (gpt ~4 s a step on one thread) the ~170 steps a workload takes here would
not fit the whole run into ~15 minutes.

For each workload: one ``profile()`` (``--profile-repeats`` timed steps per action), then
``--plans`` distinct random plans over keep / recompute / selective, each predicted by
``CostModel`` and measured by ``measure()`` in ``--rounds`` interleaved rounds of ``--repeats``
timed steps (every plan once, then again, each round starting elsewhere), so a change in machine
load falls on all plans alike. Clock: the measuring thread's CPU time on CPU (``--threads``
torch threads), ``torch.cuda.synchronize``-bounded wall time on CUDA; peaks from the profiler's
memory events on CPU, ``max_memory_allocated`` on CUDA. Reports per workload the max and median
absolute relative error of peak bytes (target 5%) and of step time (target 10%), the signed
median time error (a bias, e.g. from the profile's marks, shows here), the error of the
predicted slowdown against all-keep (measured in the same rounds, so free of load changes
between profiling and measuring), and the measured time spread: the noise floor every time
error should be read against.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from bench.measuring import measure_rounds, random_plans  # noqa: E402
from env.cost.cost_model import CostModel  # noqa: E402
from env.data.plan import Action  # noqa: E402
from env.measure.profiler import profile  # noqa: E402
from env.runtime.apply import plan_for  # noqa: E402
from env.units.find import find_units  # noqa: E402
from env.workloads.workload import load_workload  # noqa: E402

PEAK_TARGET, TIME_TARGET = 0.05, 0.10
DEFAULT_WORKLOADS = ("gpt/small", "cnn", "lstm", "mlp/small")


def rel(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def run_workload(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    w = load_workload(spec, device=args.device)
    units = find_units(w.model)
    t0 = time.perf_counter()
    cm = CostModel(profile(w, units, repeats=args.profile_repeats, baseline=False))
    profile_seconds = time.perf_counter() - t0
    plans = random_plans(len(units), len(cm.profile.actions), args.plans, args.seed)
    by_name = {str(k): plan_for(w.model, units, [cm.profile.actions[a] for a in idx]) for k, idx in enumerate(plans)}
    keep = [cm.action_index(Action.KEEP)] * len(units)
    by_name["keep"] = plan_for(w.model, units, [Action.KEEP] * len(units))  # the reference for time ratios
    got = measure_rounds(w, units, by_name, args.repeats, args.rounds)
    keep_pred, keep_meas = cm.predict(keep).step_seconds, got["keep"].step_seconds
    rows = []
    for k, idx in enumerate(plans):
        m, pred = got[str(k)], cm.predict(idx)
        rows.append({"actions": [cm.profile.actions[a].value for a in idx],
                     "predicted_peak_bytes": pred.peak_bytes, "measured_peak_bytes": m.peak_bytes,
                     "peak_error": rel(pred.peak_bytes, m.peak_bytes),
                     "predicted_step_seconds": pred.step_seconds, "measured_step_seconds": m.step_seconds,
                     "time_error": rel(pred.step_seconds, m.step_seconds),
                     # slowdown against all-keep, predicted vs measured in the same rounds: free of
                     # the load difference between the profile's minutes and the measurement's
                     "time_ratio_error": rel(pred.step_seconds / keep_pred, m.step_seconds / keep_meas),
                     "relative_spread": m.spread_seconds / m.step_seconds})
    return {"workload": spec, "n_units": len(units), "n_plans": len(rows), "profile_seconds": profile_seconds,
            "bench_seconds": time.perf_counter() - t0, "clock": got["keep"].clock, **summary(rows), "plans": rows}


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    peak = [abs(r["peak_error"]) for r in rows]
    tim = [abs(r["time_error"]) for r in rows]
    return {"peak_max_abs_error": max(peak), "peak_median_abs_error": statistics.median(peak),
            "peak_within_target": sum(e <= PEAK_TARGET for e in peak) / len(rows),
            "time_max_abs_error": max(tim), "time_median_abs_error": statistics.median(tim),
            "time_median_signed_error": statistics.median(r["time_error"] for r in rows),
            "time_within_target": sum(e <= TIME_TARGET for e in tim) / len(rows),
            "time_ratio_max_abs_error": max(abs(r["time_ratio_error"]) for r in rows),
            "time_ratio_median_abs_error": statistics.median(abs(r["time_ratio_error"]) for r in rows),
            "median_relative_spread": statistics.median(r["relative_spread"] for r in rows)}


def measure(run: Run) -> None:
    run.device = run.args.device
    run.result.update({"targets": {"peak": PEAK_TARGET, "time": TIME_TARGET}, "workloads": []})
    for spec in run.args.workloads:
        run.result["workloads"].append(run_workload(spec, run.args))
        r = run.result["workloads"][-1]
        print(f"{spec}: {r['n_plans']} plans in {r['bench_seconds']:.0f} s", file=sys.stderr)


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=list(DEFAULT_WORKLOADS),
                    help="workload specs (default: every built-in, gpt and mlp at their small presets)")
    ap.add_argument("--plans", type=int, default=20, help="random plans per workload")
    ap.add_argument("--repeats", type=int, default=2, help="timed steps per plan per round")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the plans")
    ap.add_argument("--profile-repeats", type=int, default=5, help="timed steps per action in profile()")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random plans")
    ap.add_argument("--device", default="cpu", help="device to measure on: cpu, cuda, cuda:N")


BENCH = Bench("fidelity", __doc__, options, threads=1,
              quick={"workloads": ["gpt/tiny"], "plans": 4, "repeats": 1, "rounds": 1, "profile_repeats": 1})

if __name__ == "__main__":
    main(BENCH, measure)

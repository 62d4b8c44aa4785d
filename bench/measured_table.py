"""Measured peak memory and step time of the standard plans on every built-in workload.

    python bench/measured_table.py                          # default sizes (~5 min on 2 cores)
    python bench/measured_table.py --workloads gpt/tiny --repeats 5
    python bench/measured_table.py --threads 2              # on a machine of your own

For each workload the plans are: ``none`` (every unit kept), ``all recompute``, ``all
selective`` and ``every other`` (recompute on units 0, 2, 4, ...). All plans of one workload
are measured in one process, in ``--rounds`` interleaved rounds (A B C D, then B C D A, ...) of
``--repeats`` timed steps after a warm-up step, so that a change of machine load over the run
falls on every plan alike. Clock: the measuring thread's CPU time on CPU (``--threads`` torch
threads, 1 by default); a plan's step time is the median of all its timed steps and its spread
the interquartile range. The slowdown is given from medians and, beside it, from each plan's
fastest step (the least disturbed by other processes on a shared machine). Peaks come from the
profiler's memory events, exact on CPU.

``peak_mb`` (MiB) counts everything live at the step's peak, AdamW's two state tensors per
parameter included, so the saving of the total is smaller than the saving of the activation
part (peak minus what is live before the step), which is what checkpointing acts on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BenchError  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from bench.measuring import measure_rounds  # noqa: E402
from env.data.measured import MeasuredPlan  # noqa: E402
from env.data.plan import Action, Plan  # noqa: E402
from env.data.types import MIB  # noqa: E402
from env.runtime.apply import plan_for  # noqa: E402
from env.units.find import find_units  # noqa: E402
from env.workloads.spec import workload_names  # noqa: E402
from env.workloads.workload import load_workload  # noqa: E402


def standard_plans(model: torch.nn.Module, units: list[str]) -> dict[str, Plan]:
    """none / all recompute / all selective / every other unit recomputed."""
    n = len(units)
    every_other = [Action.RECOMPUTE if i % 2 == 0 else Action.KEEP for i in range(n)]
    return {
        "none": plan_for(model, units, [Action.KEEP] * n),
        "all recompute": plan_for(model, units, [Action.RECOMPUTE] * n),
        "all selective": plan_for(model, units, [Action.SELECTIVE] * n),
        "every other": plan_for(model, units, every_other),
    }


def rows_for(spec: str, units: list[str], got: dict[str, MeasuredPlan]) -> list[dict[str, Any]]:
    base = got["none"]
    return [{
        "workload": spec, "plan": name, "n_units": len(units), "batch_shape": m.batch_shape,
        "peak_mb": m.peak_bytes / MIB, "activation_mb": m.activation_bytes / MIB,
        "live_before_mb": m.live_before_bytes / MIB,
        "step_seconds": m.step_seconds, "spread_seconds": m.spread_seconds,
        "n_timed_steps": len(m.step_seconds_samples), "clock": m.clock,
        "peak_saving_pct": 100 * (1 - m.peak_bytes / base.peak_bytes),
        "activation_saving_pct": 100 * (1 - m.activation_bytes / base.activation_bytes),
        "slowdown_pct": 100 * (m.step_seconds / base.step_seconds - 1),
        # fastest step against fastest step: what the plan costs with the least interference
        "slowdown_min_pct": 100 * (min(m.step_seconds_samples) / min(base.step_seconds_samples) - 1),
        "step_seconds_samples": m.step_seconds_samples,
    } for name, m in got.items()]


def measure(run: Run) -> None:
    args = run.args
    if args.repeats * args.rounds < 5:
        raise BenchError(f"--repeats {args.repeats} x --rounds {args.rounds} gives fewer than 5 timed steps; raise either")
    run.result.update({"repeats_per_round": args.repeats, "rounds": args.rounds, "rows": []})
    for spec in args.workloads:
        t0 = time.perf_counter()
        w = load_workload(spec)
        units = find_units(w.model)
        run.result["rows"] += rows_for(spec, units, measure_rounds(w, units, standard_plans(w.model, units),
                                                                   args.repeats, args.rounds))
        print(f"{spec}: {len(units)} units, measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=workload_names(), help="workload specs (default: every built-in)")
    ap.add_argument("--repeats", type=int, default=2, help="timed steps per plan per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the plans")


BENCH = Bench("measured_table", __doc__, options, quick={"workloads": ["gpt/tiny"], "repeats": 5, "rounds": 1},
              threads=1)

if __name__ == "__main__":
    main(BENCH, measure)

"""Decision units on library models: the automatic choice against the old rule and an expert's.

    python bench/units_table.py                      # every row (~4 min on one thread)
    python bench/units_table.py --rows hf/t5 diffusers/unet2d
    python bench/units_table.py --quick              # small sizes, seconds (smoke test)

For each model, three unit sets: ``blocks`` (the old rule: the children of the largest
ModuleList/Sequential, ``env.units.find.find_units``), ``expert`` (what a person who read the model
would name: every block of each stage, encoder and decoder; ``bench.workloads.EXPERT_UNITS``) and
``auto`` (``env.units.choice``: chosen from one instrumented step where the saved activations are).
Each is measured with ``env.measure.measurement.measure`` as all-``recompute`` against the
all-``keep`` baseline (the same plan whatever the units); ``peak saving`` is the share of the
step's whole peak (weights, gradients, AdamW state, batch and activations) that recomputing every
unit removes. The plans are measured in ``--rounds`` interleaved rounds of ``--repeats`` timed
steps so that a change of machine load falls on all of them alike. Peaks are exact on CPU
(profiler memory events); times are medians by the measuring thread's CPU clock. ``--quick``
measures each model at the tiny size its row names, in one round.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BenchError  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from env.data.rounds import interleaved  # noqa: E402
from bench.workloads import EXPERT_UNITS  # noqa: E402
from env.data.measured import MeasuredPlan  # noqa: E402
from env.data.plan import Action  # noqa: E402
from env.data.types import MIB  # noqa: E402
from env.measure.measurement import measure as measure_plan  # noqa: E402
from env.runtime.apply import plan_for  # noqa: E402
from env.units.choice import resolve_units  # noqa: E402
from env.workloads.workload import Workload, load_workload  # noqa: E402


def measure_row(w: Workload, sets: dict[str, list[str]], repeats: int, rounds: int) -> dict[str, MeasuredPlan]:
    """All-keep once and all-recompute per unit set, in interleaved rounds."""
    plans = {"keep": plan_for(w.model, sets["auto"], [Action.KEEP] * len(sets["auto"]))}
    plans.update({name: plan_for(w.model, units, [Action.RECOMPUTE] * len(units)) for name, units in sets.items()})
    unit_of = {"keep": sets["auto"], **sets}
    return interleaved({name: lambda name=name: measure_plan(w, plans[name], unit_of[name], repeats=repeats, warmup=1)
                        for name in plans}, rounds)


def table_row(spec: str, choices: dict[str, Any], got: dict[str, MeasuredPlan]) -> dict[str, Any]:
    base = got["keep"]
    row: dict[str, Any] = {"workload": spec, "batch_shape": base.batch_shape, "peak_mb_keep": base.peak_bytes / MIB,
                           "activation_mb_keep": base.activation_bytes / MIB,
                           "live_before_mb": base.live_before_bytes / MIB, "step_seconds_keep": base.step_seconds}
    for name, choice in choices.items():
        m = got[name]
        row[name] = {
            "units": choice.units, "n_units": len(choice.units), "coverage": choice.coverage,
            "peak_mb": m.peak_bytes / MIB,
            "peak_saving_pct": 100 * (1 - m.peak_bytes / base.peak_bytes),
            "activation_saving_pct": 100 * (1 - m.activation_bytes / base.activation_bytes),
            "step_seconds": m.step_seconds, "slowdown_pct": 100 * (m.step_seconds / base.step_seconds - 1),
        }
    return row


def measure(run: Run) -> None:
    args, by_spec = run.args, {r.spec: r for r in EXPERT_UNITS}
    unknown = [s for s in args.rows if s not in by_spec]
    if unknown:
        raise BenchError(f"unknown row {unknown[0]}; choose from {', '.join(by_spec)}")
    run.result.update({"repeats_per_round": args.repeats, "rounds": args.rounds, "quick": args.quick, "rows": []})
    for spec in args.rows:
        t0 = time.perf_counter()
        row = by_spec[spec]
        w = load_workload(f"{spec}?{row.quick}" if args.quick else spec)
        choices = {"blocks": resolve_units(w, ["blocks"]), "expert": resolve_units(w, list(row.expert)),
                   "auto": resolve_units(w, ["auto"])}
        got = measure_row(w, {name: c.units for name, c in choices.items()}, args.repeats, args.rounds)
        run.result["rows"].append(table_row(w.spec, choices, got))
        print(f"{w.spec}: measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        print("\n".join(choices["auto"].lines()), file=sys.stderr)


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rows", nargs="+", default=[r.spec for r in EXPERT_UNITS], help="which models (specs of the rows)")
    ap.add_argument("--repeats", type=int, default=1, help="timed steps per plan per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the plans")


BENCH = Bench("units_table", __doc__, options, quick={"rounds": 1}, threads=1)

if __name__ == "__main__":
    main(BENCH, measure)

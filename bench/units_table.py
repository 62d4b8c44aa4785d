"""Decision units on library models: the automatic choice against the old rule and an expert's.

    python bench/units_table.py                      # every row (~4 min on one thread)
    python bench/units_table.py --rows hf/t5 diffusers/unet2d
    python bench/units_table.py --quick              # small sizes, seconds (smoke test)

For each model, three unit sets: ``blocks`` (the old rule: the children of the largest
ModuleList/Sequential, ``env.units.find.find_units``), ``expert`` (what a person who read the model
would name: every block of each stage, encoder and decoder) and ``auto`` (``env.units.choice``:
chosen from one instrumented step where the saved activations are). Each is measured with
``env.measure.measurement.measure`` as all-``recompute`` against the all-``keep`` baseline (the same
plan whatever the units); ``peak saving`` is the share of the step's whole peak (weights,
gradients, AdamW state, batch and activations) that recomputing every unit removes. The
plans are measured in ``--rounds`` interleaved rounds so that a change of machine load falls
on all of them alike; peaks are exact on CPU (profiler memory events), times are medians.
Writes ``bench/results/units_table.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS_DIR, interleaved, set_threads, write_result  # noqa: E402
from env.data.measured import MeasuredPlan as Measurement  # noqa: E402
from env.data.plan import Action  # noqa: E402
from env.measure.measurement import measure  # noqa: E402
from env.runtime.apply import plan_for  # noqa: E402
from env.units.choice import resolve_units  # noqa: E402
from env.workloads.workload import Workload, load_workload  # noqa: E402

RESULTS = RESULTS_DIR / "units_table.json"
MB = 2 ** 20
USER_UNET = "examples/unet_skips.py:build"


@dataclass(frozen=True)
class Row:
    spec: str
    expert: tuple[str, ...]  # globs an expert would give
    quick: str  # options for --quick


ROWS: tuple[Row, ...] = (
    Row("diffusers/unet2d", ("down_blocks.*", "mid_block", "up_blocks.*"), "batch_size=1&image_size=32"),
    Row("hf/resnet50", ("resnet.encoder.stages.*.layers.*",), "batch_size=1&image_size=64"),
    Row("hf/t5", ("encoder.block.*", "decoder.block.*"), "batch_size=1&seq_len=32&target_len=16"),
    Row(USER_UNET, ("down1", "down2", "down3", "bottom", "dec3", "dec2", "dec1"), "batch_size=1&image_size=32"),
    Row("hf/llama", ("model.layers.*",), "batch_size=1&seq_len=32"),
    Row("hf/gpt2", ("transformer.h.*",), "batch_size=1&seq_len=32"),
    Row("hf/bert", ("bert.encoder.layer.*",), "batch_size=1&seq_len=32"),
)
UNIT_SETS = ("blocks", "expert", "auto")


def measure_row(w: Workload, sets: dict[str, list[str]], repeats: int, rounds: int) -> dict[str, Measurement]:
    """All-keep once and all-recompute per unit set, in interleaved rounds."""
    plans = {"keep": plan_for(w.model, sets["auto"], [Action.KEEP] * len(sets["auto"]))}
    plans.update({name: plan_for(w.model, units, [Action.RECOMPUTE] * len(units)) for name, units in sets.items()})
    unit_of = {"keep": sets["auto"], **sets}
    return interleaved({name: lambda name=name: measure(w, plans[name], unit_of[name], repeats=repeats, warmup=1)
                        for name in plans}, rounds)


def table_row(spec: str, choices: dict[str, Any], got: dict[str, Measurement]) -> dict[str, Any]:
    base = got["keep"]
    row: dict[str, Any] = {"workload": spec, "batch_shape": base.batch_shape, "peak_mb_keep": base.peak_bytes / MB,
                           "activation_mb_keep": base.activation_bytes / MB,
                           "live_before_mb": base.live_before_bytes / MB, "step_seconds_keep": base.step_seconds}
    for name, choice in choices.items():
        m = got[name]
        row[name] = {
            "units": choice.units, "n_units": len(choice.units), "coverage": choice.coverage,
            "peak_mb": m.peak_bytes / MB,
            "peak_saving_pct": 100 * (1 - m.peak_bytes / base.peak_bytes),
            "activation_saving_pct": 100 * (1 - m.activation_bytes / base.activation_bytes),
            "step_seconds": m.step_seconds, "slowdown_pct": 100 * (m.step_seconds / base.step_seconds - 1),
        }
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| model | " + " | ".join(f"{s}: units, coverage, peak saving" for s in UNIT_SETS) + " |"
    lines = [head, "|---|" + "---:|" * len(UNIT_SETS)]
    for r in rows:
        cells = [f"{r[s]['n_units']}, {r[s]['coverage']:.0%}, {r[s]['peak_saving_pct']:.0f}%" for s in UNIT_SETS]
        lines.append(f"| {r['workload']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", default=[r.spec for r in ROWS], help="which models (specs of ROWS)")
    ap.add_argument("--repeats", type=int, default=1, help="timed steps per plan per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the plans")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (1: steady on a shared machine)")
    ap.add_argument("--quick", action="store_true", help="each model at a tiny size, one round (smoke test)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = ap.parse_args(argv)
    by_spec = {r.spec: r for r in ROWS}
    unknown = [s for s in args.rows if s not in by_spec]
    if unknown:
        ap.error(f"unknown row {unknown[0]}; choose from {', '.join(by_spec)}")
    set_threads(args.threads)
    rounds = 1 if args.quick else args.rounds
    load_at_start = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    for spec in args.rows:
        t0 = time.perf_counter()
        row = by_spec[spec]
        w = load_workload(f"{spec}?{row.quick}" if args.quick else spec)
        choices = {"blocks": resolve_units(w, ["blocks"]), "expert": resolve_units(w, list(row.expert)),
                   "auto": resolve_units(w, ["auto"])}
        got = measure_row(w, {name: c.units for name, c in choices.items()}, args.repeats, rounds)
        rows.append(table_row(w.spec, choices, got))
        print(f"{w.spec}: measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        print("\n".join(choices["auto"].lines()), file=sys.stderr)
    write_result("units_table", {"load_average_at_start": load_at_start, "repeats_per_round": args.repeats,
                                 "rounds": rounds, "quick": args.quick, "rows": rows}, args.out)
    print(markdown(rows))


if __name__ == "__main__":
    main()

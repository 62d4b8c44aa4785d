"""Dynamic checkpointing: batches of varying sequence length under one memory cap.

    python bench/dynamic.py            # gpt/small, sequences of 32, 64 and 128 tokens, ~5 min
    python bench/dynamic.py --quick    # gpt/tiny, seconds (smoke test)

One model (``gpt/small``, context 128) trains on batches whose sequences are 32, 64 or 128
tokens long (drawn at random, the same draw for both contenders), under a memory cap that the
longest batch cannot meet without checkpointing. Two ways to meet it:

- static: the fastest plan of the longest shape's frontier that fits the cap, used for every batch
  (what one search, or one hand-made plan, gives);
- dynamic: one search per shape (``python -m search.run --workload gpt/small?tokens=L``) and
  ``search.DynamicPlan``: before each step, the fastest plan of that shape's frontier that fits the
  cap (``apply`` swaps plans only when the choice changes; the swaps are timed with the steps).

Both train the same model on the same sequence of batches, in ``--rounds`` rounds alternating
which goes first; each step is timed by the thread's CPU clock (one torch thread, after a
warm-up), and the total over the sequence is compared (median over rounds). The peak of every
(shape, plan) pair used is measured apart (profiler memory events, exact on CPU) to check that
both stay under the cap. The searches run first, each in its own process, timed by the wall clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import set_threads  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from bench.measuring import run_search  # noqa: E402
from env.data.plan import Plan  # noqa: E402
from env.data.types import MIB  # noqa: E402
from env.measure.measurement import measure, warm_up  # noqa: E402
from env.measure.timeline import step_clock, train_step  # noqa: E402
from env.runtime.apply import apply_actions  # noqa: E402
from env.workloads.workload import Workload, load_workload  # noqa: E402
from search import DynamicPlan, load_frontier  # noqa: E402
from search.records.frontier_file import FrontierFile  # noqa: E402


def search_shapes(base: str, lengths: Sequence[int], flags: Sequence[str]) -> tuple[dict[int, FrontierFile], dict[int, float]]:
    """One default search per sequence length; each one's frontier file and wall seconds."""
    fronts, walls = {}, {}
    for n in lengths:
        with tempfile.TemporaryDirectory(prefix="bench_dynamic_") as tmp:
            _, walls[n] = run_search(["--workload", f"{base}?tokens={n}", "--no-batch-scaling", "--peers", "none", *flags],
                                     out=Path(tmp))
            fronts[n] = load_frontier(Path(tmp) / "run")
        print(f"tokens={n}: {len(fronts[n].points)} frontier points, {walls[n]:.0f} s", file=sys.stderr)
    return fronts, walls


def timed_sequence(w: Workload, inputs: dict[int, Any], order: Sequence[int], plan_for_step: Any) -> float:
    """Train on ``order`` (a length per step); ``plan_for_step(n)`` installs the plan for length n
    (timed with the step). Total seconds by the step clock."""
    _, clock = step_clock(w.device)
    total = 0
    for n in order:
        t0 = clock()
        plan_for_step(n)
        w.inputs = inputs[n]
        train_step(w, w.optimizer)
        total += clock() - t0
    return total / 1e9


def peaks_apart(w: Workload, inputs: dict[int, Any], plans: dict[str, dict[int, Plan]]) -> dict[str, dict[str, float]]:
    """The peak (MiB) of every (shape, plan) pair used, measured apart: the same model, that shape's batch."""
    return {name: {str(n): measure(dataclasses.replace(w, inputs=inputs[n]), plan, repeats=1, warmup=1).peak_bytes / MIB
                   for n, plan in by_shape.items()} for name, by_shape in plans.items()}


def timed_rounds(w: Workload, inputs: dict[int, Any], order: Sequence[int], static_plan: Plan, dyn: DynamicPlan,
                 cap: int, batch_shape: dict[int, str], rounds: int) -> dict[str, list[float]]:
    """Total seconds of the sequence with the static plan and with the dynamic one, rounds alternating who goes first."""
    installed: dict[str, Any] = {}

    def static_step(n: int) -> None:
        if "static" not in installed:
            installed["static"] = apply_actions(w.model, static_plan)

    def dynamic_step(n: int) -> None:
        dyn.apply(w.model, cap, batch_shape[n])

    totals: dict[str, list[float]] = {"static": [], "dynamic": []}
    for r in range(rounds):
        for name in (("static", "dynamic") if r % 2 == 0 else ("dynamic", "static")):
            totals[name].append(timed_sequence(w, inputs, order, static_step if name == "static" else dynamic_step))
            if name == "static":
                installed.pop("static").remove()
            else:
                dyn.remove()
        print(f"round {r}: static {totals['static'][-1]:.2f} s, dynamic {totals['dynamic'][-1]:.2f} s", file=sys.stderr)
    return totals


def measure_dynamic(run: Run) -> None:
    args, t_start = run.args, time.perf_counter()
    flags = ["--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128", "--max-measurements", "10",
             "--repeats", "1"] if args.quick else []
    fronts, walls = search_shapes(args.workload, args.lengths, flags)
    longest = max(args.lengths)
    lf = fronts[longest]
    low = min(p.peak_bytes for p in lf.points)
    cap = int(low + args.cap_share * (lf.baseline.peak_bytes - low))
    static_plan: Plan = lf.plan(lf.fastest_within(cap))
    dyn = DynamicPlan(list(fronts.values()))

    set_threads(1)
    w = load_workload(args.workload, seed=args.seed)
    shapes = {n: load_workload(f"{args.workload}?tokens={n}", seed=args.seed) for n in args.lengths}
    inputs = {n: s.inputs for n, s in shapes.items()}
    batch_shape = {n: s.batch_shape for n, s in shapes.items()}
    choices = {n: dyn.select(cap, batch_shape[n]) for n in args.lengths}
    warm_up(w)
    order = np.random.default_rng(args.seed).choice(args.lengths, size=args.steps).tolist()
    peaks = peaks_apart(w, inputs, {"static": {n: static_plan for n in args.lengths},
                                    "dynamic": {n: choices[n].plan for n in args.lengths}})
    totals = timed_rounds(w, inputs, order, static_plan, dyn, cap, batch_shape, args.rounds)
    med = {k: statistics.median(v) for k, v in totals.items()}
    run.result.update({
        "workload": args.workload, "lengths": args.lengths, "steps": args.steps, "order": order,
        "rounds": args.rounds, "clock": "thread-cpu (one torch thread)", "cap_mb": cap / MIB,
        "search_wall_seconds": walls,
        "static": {"plan_from_tokens": longest, "actions": static_plan.summary(), "peaks_mb": peaks["static"],
                   "totals_seconds": totals["static"]},
        "dynamic": {"choices": {str(n): {"actions": c.plan.summary(), "peak_mb_on_frontier": c.point.peak_bytes / MIB,
                                         "step_seconds_on_frontier": c.point.step_seconds} for n, c in choices.items()},
                    "peaks_mb": peaks["dynamic"], "totals_seconds": totals["dynamic"]},
        "median_seconds": med, "dynamic_over_static": med["dynamic"] / med["static"],
        "both_under_cap": all(v <= cap / MIB for p in peaks.values() for v in p.values()),
        "wall_seconds": time.perf_counter() - t_start,
    })


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workload", default="gpt/small", help="a gpt spec whose seq_len is the longest length")
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--steps", type=int, default=30, help="batches in the training sequence")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cap-share", type=float, default=0.4,
                    help="the cap: lowest peak of the longest shape's frontier plus this share of the way to its baseline")
    ap.add_argument("--seed", type=int, default=0)


BENCH = Bench("dynamic", __doc__, options, quick={"workload": "gpt/tiny", "lengths": [8, 16], "steps": 8, "rounds": 2})

if __name__ == "__main__":
    main(BENCH, measure_dynamic)

"""Warm-up steps before a timed step at another micro-batch: is one enough?

    python bench/warmup.py             # gpt/small at micro-batches 4 and 16, two processes at once (~3 min)
    python bench/warmup.py --quick     # gpt/tiny, one round (seconds)

A throughput search measures a plan at a micro-batch (``env.measure.micro_batch.AtMicroBatch``) after
``WARMUP`` untimed step; where the plan was measured there before, its peak is taken from that
measurement and the next step is timed. Here each plan (all keep, recompute everything, every second unit
recomputed) is measured at each micro-batch with one warm-up step and with two, its peak taken from a
measurement before (as a search measures a plan again), in ``--rounds`` interleaved rounds (the plans in
order and then reversed, one warm-up first and then two) of ``--repeats`` timed steps, in ``--processes``
processes at once, as Evaluators measure side by side on their cores. Each row shows the first timed step
after one warm-up against the timed steps after it, and one warm-up against two (medians of all the
processes' samples; the thread's CPU clock, ``--threads`` torch threads per process).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from bench.measuring import serpentine  # noqa: E402

PLANS = {"all keep": "keep", "recompute everything": "recompute", "every 2nd recomputed": "every2"}


def samples_in_process(spec: str, micro_batch: int, rounds: int, repeats: int,
                       threads: int) -> dict[str, dict[int, list[list[float]]]]:
    """In a fresh process on ``threads`` torch threads: per plan and warm-up steps, each measurement's timed step
    seconds."""
    import torch

    from env.data.plan import Action
    from env.measure.measurement import measure, warm_up
    from env.runtime.apply import plan_for
    from env.units.choice import resolve_units
    from env.workloads.workload import load_workload

    torch.set_num_threads(threads)
    w = load_workload(f"{spec}?batch_size={micro_batch}")
    units = resolve_units(w, ["auto"]).units
    actions = {"keep": [Action.KEEP] * len(units), "recompute": [Action.RECOMPUTE] * len(units),
               "every2": [Action.RECOMPUTE if i % 2 else Action.KEEP for i in range(len(units))]}
    plans = {name: plan_for(w.model, units, actions[key]) for name, key in PLANS.items()}
    warm_up(w)
    known = {name: measure(w, plan, units, repeats=1) for name, plan in plans.items()}
    out: dict[str, dict[int, list[list[float]]]] = {name: {1: [], 2: []} for name in plans}
    for r in range(rounds):
        for name in serpentine(list(plans), r):
            for warmup in serpentine([1, 2], r):
                m = measure(w, plans[name], units, repeats=repeats, warmup=warmup, known=known[name])
                out[name][warmup].append(m.step_seconds_samples)
    return out


def row(spec: str, micro_batch: int, plan: str, runs: dict[int, list[list[float]]]) -> dict[str, Any]:
    def median(xs: list[float]) -> float:
        return statistics.median(xs)

    first = {w: [s[0] for s in runs[w]] for w in runs}
    rest = {w: [x for s in runs[w] for x in s[1:]] for w in runs}
    every = {w: [x for s in runs[w] for x in s] for w in runs}
    return {"workload": spec, "micro_batch": micro_batch, "plan": plan, "measurements": len(runs[1]),
            "first_ms": {str(w): 1e3 * median(first[w]) for w in runs},
            "rest_ms": {str(w): 1e3 * median(rest[w]) for w in runs},
            "first_over_rest_one_warmup": median(first[1]) / median(rest[1]),
            "one_over_two_warmups": median(every[1]) / median(every[2])}


def measure(run: Run) -> None:
    args = run.args
    run.result.update({"rows": [], "processes": args.processes, "clock": "thread-cpu"})
    ctx = multiprocessing.get_context("spawn")
    for b in args.micro_batches:
        with ctx.Pool(args.processes) as pool:
            jobs = [(args.workload, b, args.rounds, args.repeats, args.threads)] * args.processes
            got = pool.starmap(samples_in_process, jobs)
        for plan in PLANS:
            merged = {w: [s for g in got for s in g[plan][w]] for w in (1, 2)}
            run.result["rows"].append(row(args.workload, b, plan, merged))
        run.save()


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workload", default="gpt/small")
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds over the plans and warm-ups")
    ap.add_argument("--repeats", type=int, default=4, help="timed steps per measurement (at least 2)")
    ap.add_argument("--processes", type=int, default=2, help="processes measuring at once")


BENCH = Bench("warmup", __doc__, options,
              quick={"workload": "gpt/tiny", "micro_batches": [2], "rounds": 1, "repeats": 2, "processes": 1},
              threads=1)

if __name__ == "__main__":
    main(BENCH, measure)

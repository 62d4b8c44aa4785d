"""Warm-up steps before a timed step at another micro-batch: is one enough?

    python bench/warmup.py             # gpt/small at micro-batches 4 and 16, two processes at once, then
                                       # the peaks alone on four workloads (~6 min)
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

Then the peak alone, as a search finds the ladder and each peer's largest micro-batch: per workload of
``--peak-workloads``, each plan and the first two eager peers at each of ``--peak-micro-batches``, measured with
one warm-up step before the memory step and with none (``AtMicroBatch.warmup_for``), in ``--peak-rounds``
interleaved rounds; each row says whether every measurement read the same bytes, and the seconds of each kind.
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
from env.data.rounds import serpentine  # noqa: E402

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


def peak_rows(spec: str, micro_batches: list[int], rounds: int) -> list[dict[str, Any]]:
    """Per plan and eager peer at each micro-batch: its peak alone with one warm-up step and with none."""
    import time

    from env.data.plan import Action
    from env.measure.measurement import measure, warm_up
    from env.measure.micro_batch import AtMicroBatch
    from env.measure.peers import Peer, PeerKind, measure_peer, peers_for
    from env.runtime.apply import plan_for
    from env.units.choice import resolve_units
    from env.workloads.workload import load_workload

    w = load_workload(spec)
    units = list(resolve_units(w, ["auto"]).units)
    at = AtMicroBatch(w, units, [Action.KEEP, Action.RECOMPUTE], 1)
    warm_up(w)
    every2 = [Action.RECOMPUTE if i % 2 else Action.KEEP for i in range(len(units))]
    items: dict[str, Any] = {"all keep": [Action.KEEP] * len(units), "recompute everything":
                             [Action.RECOMPUTE] * len(units), "every 2nd recomputed": every2}
    items.update({p.name: p for p in [p for p in peers_for(w) if p.kind is not PeerKind.COMPILE_BUDGET][:2]})
    rows = []
    for b in micro_batches:
        got: dict[str, dict[int, list[tuple[int, float]]]] = {name: {1: [], 0: []} for name in items}
        for r in range(rounds):
            for name in serpentine(list(items), r):
                for warmup in serpentine([1, 0], r):
                    with at.batches(None).use(b) as wb:
                        t0 = time.perf_counter()
                        item = items[name]
                        m = (measure_peer(wb, item, repeats=1, warmup=warmup, stop_above=-1) if isinstance(item, Peer)
                             else measure(wb, plan_for(wb.model, units, item), units, repeats=1, warmup=warmup,
                                          stop_above=-1))
                        got[name][warmup].append((m.peak_bytes, time.perf_counter() - t0))
        for name, by in got.items():
            peaks = {p for runs in by.values() for p, _ in runs}
            rows.append({"workload": spec, "micro_batch": b, "item": name, "measurements": len(by[0]),
                         "same_bytes": len(peaks) == 1, "peak_mib": max(peaks) / 2**20,
                         "seconds": {str(k): statistics.median(s for _, s in runs) for k, runs in by.items()}})
    return rows


def measure(run: Run) -> None:
    args = run.args
    run.result.update({"rows": [], "processes": args.processes, "clock": "thread-cpu", "peak_rows": []})
    for spec in args.peak_workloads:
        run.result["peak_rows"] += peak_rows(spec, args.peak_micro_batches, args.peak_rounds)
        run.save()
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
    ap.add_argument("--peak-workloads", nargs="*", default=["gpt/small", "cnn/small", "hf/llama", "diffusers/unet2d"])
    ap.add_argument("--peak-micro-batches", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--peak-rounds", type=int, default=2, help="interleaved rounds of the peaks alone")


BENCH = Bench("warmup", __doc__, options,
              quick={"workload": "gpt/tiny", "micro_batches": [2], "rounds": 1, "repeats": 2, "processes": 1,
                     "peak_workloads": ["gpt/tiny"], "peak_micro_batches": [1, 3], "peak_rounds": 1},
              threads=1)

if __name__ == "__main__":
    main(BENCH, measure)

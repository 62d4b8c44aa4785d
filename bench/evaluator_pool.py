"""Measurements in parallel: the same plans through 1 and 2 CPU Evaluators, and the default search.

    python bench/evaluator_pool.py              # ~8 min on 2 cores
    python bench/evaluator_pool.py --quick      # tiny sizes, for the smoke test

1. Throughput: ``--plans`` random plans of ``--workload`` measured through a
   ``search.engine.evaluator_pool.EvaluatorPool`` of 1 and of 2 CPU Evaluators (one torch thread each),
   in alternating rounds (1, 2, 1, 2, ...) so that a change of machine load falls on both; each
   round's pool is started before its clock starts (building the workload is not timed).
   Each Evaluator warms up (``env.measure.measurement.warm_up``) as the pool starts, before the clock.
   Reported: measurements per minute by the wall clock, per round and median, and the ratio.
   Beside it, the ceiling: the same plans in 1 and in 2 plain processes (no Ray, no queue; each
   warmed up, started together), with the mean seconds of one measurement and of its timed steps:
   what two measurement streams reach on this machine at all, and the pool's share of it.
2. The default search (``python -m search.run``, its default workload and budgets) with
   ``--evaluators 1`` and ``--evaluators 2``: wall time of the whole run, as a user sees it.

Clock: the wall clock (``time.perf_counter``) throughout; each round records the load average
beside it, and the result the load before and after the whole run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from env.data.rounds import rotated  # noqa: E402
from bench.measuring import random_plans, run_search  # noqa: E402
from search.engine import ray_session  # noqa: E402
from search.records.config import SearchConfig  # noqa: E402


ACTIONS = ("keep", "recompute", "selective")


def named_plans(n_units: int, count: int, seed: int) -> list[list[str]]:
    """``count`` distinct random plans over keep / recompute / selective, as action names."""
    return [[ACTIONS[a] for a in p] for p in random_plans(n_units, len(ACTIONS), count, seed)]


def throughput(workload: str, count: int, repeats: int, rounds: int, seed: int) -> list[dict[str, Any]]:
    """Measurements per minute through pools of 1 and 2 Evaluators, alternating."""
    from search.engine.batch_book import Job
    from search.engine.evaluator_pool import EvaluatorPool

    rows = []
    for r in range(rounds):
        for k in rotated((1, 2), r):
            cfg = SearchConfig(workload=workload, evaluators=k, repeats=repeats, seed=seed, progress=False).validate()
            pool = EvaluatorPool(cfg)
            n_units = len(pool.slots[0].info["units"])
            plans = named_plans(n_units, count, seed + r)
            t0 = time.perf_counter()
            done = pool.measure([Job(tuple(p), source="bench") for p in plans], on_result=lambda m: m)
            wall = time.perf_counter() - t0
            per_evaluator = {e: sum(label == e for m in done for label in m.evaluators)
                             for e in {label for m in done for label in m.evaluators}}
            rows.append({"round": r, "evaluators": k, "plans": len(done), "wall_seconds": wall, "n_units": n_units,
                         "warm_up_steps": [w["steps"] for w in pool.warm_ups],
                         "measurements_per_minute": 60 * len(done) / wall, "per_evaluator": per_evaluator,
                         "load_average_1": os.getloadavg()[0]})
            print(f"round {r}, {k} evaluator(s): {rows[-1]['measurements_per_minute']:.1f} measurements/min",
                  file=sys.stderr)
            import ray

            for s in pool.slots:
                ray.kill(s.handle)
    return rows


def _plain_worker(workload: str, plans: list[list[str]], repeats: int, barrier: Any, out: Any) -> None:
    """One plain process (no Ray): build and warm up the workload, wait for the others, measure ``plans``."""
    import torch

    from env.data.plan import Action
    from env.measure.measurement import measure, warm_up
    from env.runtime.apply import plan_for
    from env.units.choice import resolve_units
    from env.workloads.workload import load_workload

    torch.set_num_threads(1)
    w = load_workload(workload)
    units = resolve_units(w, ["auto"]).units
    warm_up(w)
    barrier.wait()
    t0 = time.perf_counter()
    walls, timed = [], []
    for p in plans:
        t1 = time.perf_counter()
        m = measure(w, plan_for(w.model, units, [Action(a) for a in p[:len(units)]]), units, repeats=repeats, warmup=2)
        walls.append(time.perf_counter() - t1)
        timed.append(sum(m.step_seconds_samples))
    out.put({"wall_seconds": time.perf_counter() - t0, "measurements": len(plans),
             "mean_measurement_seconds": statistics.mean(walls), "mean_timed_step_seconds": statistics.mean(timed)})


def ceiling(workload: str, count: int, repeats: int, rounds: int, seed: int, n_units: int) -> list[dict[str, Any]]:
    """The same plans in 1 and in 2 plain processes (no Ray, no queue): what two measurement
    streams can reach on this machine at all, and where one measurement's time goes."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    rows = []
    for r in range(rounds):
        plans = named_plans(n_units, count, seed + r)
        for k in rotated((1, 2), r):
            barrier, out = ctx.Barrier(k), ctx.Queue()
            procs = [ctx.Process(target=_plain_worker, args=(workload, plans[i::k], repeats, barrier, out)) for i in range(k)]
            for p in procs:
                p.start()
            got = [out.get() for _ in procs]
            for p in procs:
                p.join()
            wall = max(g["wall_seconds"] for g in got)
            rows.append({"round": r, "processes": k, "plans": count, "wall_seconds": wall,
                         "measurements_per_minute": 60 * count / wall,
                         "mean_measurement_seconds": statistics.mean(g["mean_measurement_seconds"] for g in got),
                         "mean_timed_step_seconds": statistics.mean(g["mean_timed_step_seconds"] for g in got),
                         "load_average_1": os.getloadavg()[0]})
            print(f"round {r}, {k} plain process(es): {rows[-1]['measurements_per_minute']:.1f} measurements/min, "
                  f"{rows[-1]['mean_measurement_seconds']:.3f} s a measurement", file=sys.stderr)
    return rows


def default_search(evaluators: int, extra: Sequence[str]) -> dict[str, Any]:
    """Wall time of ``python -m search.run`` with its defaults and ``--evaluators``."""
    flags = ["--evaluators", str(evaluators), *extra]
    report, wall = run_search(flags)
    return {"evaluators": evaluators, "wall_seconds": wall, "command": "python -m search.run " + " ".join(flags),
            "summary": f"{report['measured']} plans measured of {report['evaluations']} evaluated",
            "measurement_mode": report.get("measurement_mode")}


def measure(run: Run) -> None:
    args = run.args
    load_before = os.getloadavg()
    ray_session.start_ray(num_cpus=os.cpu_count())
    try:
        rows = throughput(args.workload, args.plans, args.repeats, args.rounds, args.seed)
    finally:
        import ray

        ray.shutdown()
    med = {k: statistics.median(r["measurements_per_minute"] for r in rows if r["evaluators"] == k) for k in (1, 2)}
    plain = ceiling(args.workload, args.plans, args.repeats, args.rounds, args.seed, rows[0]["n_units"])
    plain_med = {k: statistics.median(r["measurements_per_minute"] for r in plain if r["processes"] == k) for k in (1, 2)}
    searches = [] if args.no_search else [default_search(k, []) for k in (1, 2)]
    run.result.update({"clock": "wall (perf_counter) around each round of measurements", "rounds": rows,
                       "measurements_per_minute_median": med, "speedup_2_over_1": med[2] / med[1],
                       "plain_processes": plain, "plain_measurements_per_minute_median": plain_med,
                       "plain_speedup_2_over_1": plain_med[2] / plain_med[1], "pool_over_plain_with_2": med[2] / plain_med[2],
                       "default_search": searches, "load_average_before": load_before,
                       "load_average_after": os.getloadavg()})


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workload", default="gpt/small", help="workload whose plans are measured")
    ap.add_argument("--plans", type=int, default=16, help="distinct plans per round")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per measurement (the search's default)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, alternating 1 and 2 Evaluators first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-search", action="store_true", help="leave out the default search runs")


BENCH = Bench("evaluator_pool", __doc__, options,
              quick={"workload": "gpt/tiny", "plans": 4, "repeats": 1, "rounds": 1, "no_search": True})

if __name__ == "__main__":
    main(BENCH, measure)

"""What a search costs: env steps/s, measurements/s, PPO throughput on Ray, growth with units and actions.

    python bench/search_cost.py            # ~5 min on 2 cores
    python bench/search_cost.py --quick    # tiny sizes, for the smoke test

1. Env steps per second in ``model`` mode: taken from ``bench/results/env_speed.json`` when
   ``bench/env_speed.py`` has written it, else measured here on a synthetic 6-unit profile.
2. Measurements per second per workload (bench sizes): new plans measured through
   ``search.engine.evaluator.Evaluator`` (warm-up, profiled step and ``--repeats`` timed steps
   each, ``--threads`` torch threads), by the wall clock around all of them.
3. PPO throughput: ``agents.ppo.PPOAgent`` as Ray actors in ``model`` mode on
   ``ray.init(num_cpus=2)``, with 1 and with 2 workers training at once; env steps/s summed, by
   the wall clock after an untimed first rollout.
4. Growth with the number of decision units (8 .. 128) and actions (2, 3) on synthetic profiles:
   the exact solver's time and frontier size (each solve in a child process with a time limit;
   once a size runs past it, larger ones are not tried) and env steps/s.

Synthetic profiles mimic a stack of equal-ish blocks: ``keep`` stores a block's activations
(40e6 bytes), ``recompute`` stores only its input (4e6 bytes) and pays its forward again (1.33x
time), ``selective`` stores half for 1.1x; sizes vary +-30% between units. Every figure is
measured once, on whatever else the machine does (its load at the start is recorded).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue as queue_mod
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS_DIR, read_result  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from bench.workloads import workload_specs  # noqa: E402
from env.cost.cost_model import CostModel  # noqa: E402
from env.data.model_profile import ModelProfile, Segment, UnitCost  # noqa: E402
from env.data.plan import Action  # noqa: E402
from env.gym.checkpoint_env import CheckpointEnv  # noqa: E402

ACTIONS = [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE]


def synthetic_profile(n_units: int, n_actions: int, seed: int = 0) -> ModelProfile:
    """A profile of ``n_units`` blocks (see the module docstring); actions keep, recompute[, selective]."""
    rng = np.random.default_rng(seed)
    acts = ACTIONS[:n_actions]
    costs: dict[Action, list[UnitCost]] = {a: [] for a in acts}
    for _ in range(n_units):
        act, grad, inp = (int(x * rng.uniform(0.7, 1.3)) for x in (40_000_000, 4_000_000, 4_000_000))  # bytes
        fwd_s = 0.01 * rng.uniform(0.7, 1.3)
        stored = {Action.KEEP: act, Action.RECOMPUTE: inp, Action.SELECTIVE: act // 2}
        extra = {Action.KEEP: 1.0, Action.RECOMPUTE: 1.33, Action.SELECTIVE: 1.1}
        for a in acts:
            kept = stored[a]
            fwd = Segment(delta_bytes=kept, rise_bytes=act, seconds=fwd_s)
            bwd = Segment(delta_bytes=grad - kept, rise_bytes=act - kept + grad + act // 4,
                          seconds=fwd_s * (2 + extra[a] - 1))
            costs[a].append(UnitCost(fwd=fwd, bwd=bwd))
    empty = Segment(delta_bytes=0, rise_bytes=0, seconds=0.0)
    return ModelProfile(workload=f"synthetic/{n_units}x{n_actions}", batch_shape="-", device="none",
                        fingerprint=f"synthetic-{n_units}-{n_actions}-{seed}",
                        units=[f"blocks.{i}" for i in range(n_units)], actions=acts, base_bytes=200_000_000,
                        pre=Segment(delta_bytes=20_000_000, rise_bytes=20_000_000, seconds=0.005),
                        post=empty, tail=Segment(delta_bytes=0, rise_bytes=10_000_000, seconds=0.01), costs=costs)


def env_steps_per_second(prof: ModelProfile, episodes: int, seed: int = 0) -> float:
    """Random-action episodes in ``model`` mode with ``action_masks`` as MaskablePPO calls it."""
    cm = CostModel(prof)
    keep_peak = cm.peak_bytes([prof.actions.index(Action.KEEP)] * cm.n_units)
    env = CheckpointEnv(prof, budget_bytes=int(0.7 * keep_peak))
    plans = np.random.default_rng(seed).integers(0, len(prof.actions), size=(episodes, cm.n_units)).tolist()
    t0 = time.perf_counter()
    for plan in plans:
        env.reset()
        for a in plan:
            env.action_masks()
            env.step(a)
    return episodes * cm.n_units / (time.perf_counter() - t0)


def _solve(prof_json: str, queue: Any) -> None:
    from agents.exact import exact_frontier

    cm = CostModel(ModelProfile.model_validate_json(prof_json))
    queue.put("started")
    t0 = time.perf_counter()
    frontier = exact_frontier(cm)
    queue.put((time.perf_counter() - t0, len(frontier)))


def solve_with_limit(prof: ModelProfile, limit_s: float) -> tuple[float, int] | None:
    """(solve seconds, frontier size) in a child process, or None past ``limit_s`` (0: no limit,
    solved in this process)."""
    if limit_s <= 0:
        from agents.exact import exact_frontier

        t0 = time.perf_counter()
        size = len(exact_frontier(CostModel(prof)))
        return time.perf_counter() - t0, size
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_solve, args=(prof.model_dump_json(), queue))
    proc.start()
    try:
        queue.get(timeout=120)  # the child's interpreter start-up is not the solver's time
        return queue.get(timeout=limit_s)
    except queue_mod.Empty:  # the solve ran past the limit
        return None
    finally:
        proc.terminate()
        proc.join()


def scaling(units: Sequence[int], n_actions: Sequence[int], limit_s: float, episodes: int) -> list[dict[str, Any]]:
    rows = []
    for a in n_actions:
        stop = None
        for n in units:
            prof = synthetic_profile(n, a)
            row: dict[str, Any] = {"n_units": n, "n_actions": a, "plans": float(a) ** n,
                                   "env_steps_per_second": env_steps_per_second(prof, max(20, episodes // n))}
            if stop is None:
                got = solve_with_limit(prof, limit_s)
                if got is None:
                    stop = n
                    row["exact_note"] = f"ran past {limit_s:.0f} s; larger sizes not tried"
                    print(row["exact_note"], file=sys.stderr)
                else:
                    row["exact_seconds"], row["exact_frontier_size"] = got
            else:
                row["exact_note"] = f"not tried: {stop} units ran past {limit_s:.0f} s"
            print(f"{n} units x {a} actions: {row}", file=sys.stderr)
            rows.append(row)
    return rows


def measurements_per_second(specs: dict[str, str], count: int, repeats: int, threads: int) -> list[dict[str, Any]]:
    """New plans measured per second through an Evaluator, per workload."""
    from search.engine.evaluator import Evaluator

    rows = []
    plans = [["keep"], ["recompute"], ["selective"], ["recompute", "keep"]]
    for label, spec in specs.items():
        ev = Evaluator(spec, 0, [], ["keep", "recompute", "selective"], repeats, "cpu", threads)
        n = len(ev.units)
        chosen = [(p * n)[:n] for p in plans[:count]]
        t0 = time.perf_counter()
        steps = [ev.evaluate(p, "bench").step_seconds for p in chosen]
        wall = time.perf_counter() - t0
        rows.append({"label": label, "workload": spec, "n_units": n, "measurements": len(chosen),
                     "repeats": repeats, "seconds_per_measurement": wall / len(chosen),
                     "measurements_per_second": len(chosen) / wall, "median_step_seconds": float(np.median(steps))})
        print(f"{label}: {rows[-1]['seconds_per_measurement']:.2f} s a measurement", file=sys.stderr)
    return rows


def ppo_throughput(workers: Sequence[int], timesteps: int, n_units: int) -> list[dict[str, Any]]:
    """Env steps/s of PPO agents as Ray actors in model mode, ``w`` training at once, on 2 CPUs."""
    import ray

    from agents.ppo import PPOAgent

    root = str(Path(__file__).resolve().parents[1])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": root, "OMP_NUM_THREADS": "1"}})
    try:
        prof = synthetic_profile(n_units, 3).model_dump(mode="json")
        budget = int(0.7 * CostModel(synthetic_profile(n_units, 3)).peak_bytes([0] * n_units))
        Agent = ray.remote(num_cpus=1)(PPOAgent)
        rows = []
        for w in workers:
            actors = [Agent.remote(f"agent_{i}", prof, budget, i, "model") for i in range(w)]
            ray.get([a.train.remote(256) for a in actors])  # start-up and first rollout, not timed
            t0 = time.perf_counter()
            ray.get([a.train.remote(timesteps) for a in actors])
            wall = time.perf_counter() - t0
            rows.append({"workers": w, "timesteps_per_worker": timesteps, "wall_seconds": wall,
                         "env_steps_per_second": w * timesteps / wall})
            print(f"PPO with {w} worker(s): {rows[-1]['env_steps_per_second']:.0f} env steps/s", file=sys.stderr)
            for a in actors:
                ray.kill(a)
        return rows
    finally:
        ray.shutdown()


def env_speed(quick: bool) -> dict[str, Any]:
    """The env_speed bench's result when there is one, else a measurement here."""
    path = RESULTS_DIR / "env_speed.json"
    if path.is_file() and not quick:
        got = read_result(path)
        return {"source": "bench/results/env_speed.json", "workload": got.get("workload"),
                "n_units": got.get("n_units"), "steps_per_second": got.get("steps_per_second"),
                "steps_per_second_with_masks": got.get("steps_per_second_with_masks"), "machine": got.get("machine")}
    prof = synthetic_profile(6, 3)
    return {"source": "measured here (synthetic 6 units x 3 actions)", "workload": prof.workload, "n_units": 6,
            "steps_per_second_with_masks": env_steps_per_second(prof, 200 if quick else 5000)}


def measure(run: Run) -> None:
    args = run.args
    specs = workload_specs(args.workloads, args.quick)
    run.result.update({"env_speed": env_speed(args.quick),
                       "measurements": measurements_per_second(specs, args.measurements, args.repeats, args.threads),
                       "ppo": ppo_throughput([1, 2], args.ppo_timesteps, 6),
                       "scaling": scaling(args.units, args.actions, args.solver_limit, args.episodes)})


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=["gpt", "cnn", "lstm", "user"], help="for measurements/s")
    ap.add_argument("--measurements", type=int, default=3, help="plans measured per workload (up to 4)")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per measurement, as the search uses")
    ap.add_argument("--ppo-timesteps", type=int, default=4096, help="timed PPO steps per worker")
    ap.add_argument("--units", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="synthetic profile sizes")
    ap.add_argument("--actions", type=int, nargs="+", default=[2, 3], choices=[2, 3], help="actions per unit")
    ap.add_argument("--solver-limit", type=float, default=120.0,
                    help="seconds an exact solve may take (0: no limit, solved in this process)")
    ap.add_argument("--episodes", type=int, default=20000, help="env steps/s: episodes x units at 1 unit")


BENCH = Bench("search_cost", __doc__, options, threads=1,
              quick={"workloads": ["gpt"], "measurements": 2, "repeats": 1, "ppo_timesteps": 256, "units": [4, 8],
                     "actions": [2, 3], "solver_limit": 0.0, "episodes": 400})

if __name__ == "__main__":
    main(BENCH, measure)

"""Env steps per second in model mode, without an agent, on one core.

    python bench/env_speed.py                      # profiles the default gpt workload (~1 min)
    python bench/env_speed.py --workload gpt/tiny  # quicker
    python bench/env_speed.py --profile-json prof.json

Rolls ``--episodes`` episodes with random actions drawn beforehand (so drawing them is not timed),
twice: ``step`` alone, and ``action_masks`` + ``step`` as MaskablePPO calls them, each after 500
episodes of warm-up. Clock: ``time.perf_counter`` around all episodes of one timing, one torch
thread; the load average at the start is recorded beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from env.cost.cost_model import CostModel  # noqa: E402
from env.data.model_profile import ModelProfile  # noqa: E402
from env.data.plan import Action  # noqa: E402
from env.gym.checkpoint_env import CheckpointEnv  # noqa: E402


def load_profile(workload: str, profile_json: str | None) -> ModelProfile:
    if profile_json:
        return ModelProfile.model_validate_json(Path(profile_json).read_text())
    from env.measure.profiler import profile
    from env.units.find import find_units
    from env.workloads.workload import load_workload

    w = load_workload(workload)
    return profile(w, find_units(w.model), repeats=1, baseline=False)


def steps_per_second(env: CheckpointEnv, plans: np.ndarray, masks: bool) -> float:
    """Steps per second over all ``plans`` (one episode each, reset included)."""
    t0 = time.perf_counter()
    for plan in plans.tolist():
        env.reset()
        for a in plan:
            if masks:
                env.action_masks()
            env.step(a)
    return plans.size / (time.perf_counter() - t0)


def measure(run: Run) -> None:
    args = run.args
    prof = load_profile(args.workload, args.profile_json)
    cm = CostModel(prof)
    keep_peak = cm.peak_bytes([prof.actions.index(Action.KEEP)] * cm.n_units)
    env = CheckpointEnv(prof, budget_bytes=int(0.9 * keep_peak))
    plans = np.random.default_rng(0).integers(0, env.action_space.n, size=(args.episodes, env.n_units))
    steps_per_second(env, plans[:500], masks=False)  # warm-up
    run.result.update({"workload": prof.workload, "n_units": env.n_units, "n_actions": int(env.action_space.n),
                       "episodes": args.episodes,
                       "steps_per_second": round(steps_per_second(env, plans, masks=False)),
                       "steps_per_second_with_masks": round(steps_per_second(env, plans, masks=True))})


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workload", default="gpt", help="workload spec to profile (default: gpt)")
    ap.add_argument("--profile-json", help="a saved ModelProfile JSON instead of profiling")
    ap.add_argument("--episodes", type=int, default=20000, help="episodes per timing")


BENCH = Bench("env_speed", __doc__, options, quick={"workload": "gpt/tiny", "episodes": 500}, threads=1)

if __name__ == "__main__":
    main(BENCH, measure)

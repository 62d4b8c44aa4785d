"""Env steps per second in model mode, without an agent, on one core.

    python bench/env_speed.py                      # profiles the default gpt workload (~1 min)
    python bench/env_speed.py --workload gpt/tiny  # quicker
    python bench/env_speed.py --profile-json prof.json

Rolls episodes with random actions drawn beforehand (so drawing them is not timed), twice:
``step`` alone, and ``action_masks`` + ``step`` as MaskablePPO calls them. Writes
``bench/results/env_speed.json`` with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env.cost.cost_model import CostModel  # noqa: E402
from env.data.model_profile import ModelProfile  # noqa: E402
from env.data.plan import Action  # noqa: E402
from env.gym.checkpoint_env import CheckpointEnv  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "env_speed.json"


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
    rows = plans.tolist()
    t0 = time.perf_counter()
    for plan in rows:
        env.reset()
        for a in plan:
            if masks:
                env.action_masks()
            env.step(a)
    return plans.size / (time.perf_counter() - t0)


def machine() -> dict[str, object]:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "numpy": np.__version__, "torch_threads": torch.get_num_threads(),
            "load_average_1m": round(os.getloadavg()[0], 2)}  # other work on the machine meanwhile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gpt", help="workload spec to profile (default: gpt)")
    ap.add_argument("--profile-json", help="a saved ModelProfile JSON instead of profiling")
    ap.add_argument("--episodes", type=int, default=20000, help="episodes per timing")
    ap.add_argument("--out", default=str(RESULTS), help="where to write the JSON result")
    args = ap.parse_args()
    torch.set_num_threads(1)
    prof = load_profile(args.workload, args.profile_json)
    cm = CostModel(prof)
    keep_peak = cm.peak_bytes([prof.actions.index(Action.KEEP)] * cm.n_units)
    env = CheckpointEnv(prof, budget_bytes=int(0.9 * keep_peak))
    plans = np.random.default_rng(0).integers(0, env.action_space.n, size=(args.episodes, env.n_units))
    steps_per_second(env, plans[:500], masks=False)  # warm-up
    result = {
        "workload": prof.workload, "n_units": env.n_units, "n_actions": int(env.action_space.n),
        "episodes": args.episodes,
        "steps_per_second": round(steps_per_second(env, plans, masks=False)),
        "steps_per_second_with_masks": round(steps_per_second(env, plans, masks=True)),
        "machine": machine(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

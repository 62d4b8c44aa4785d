"""PPO agents: one MaskablePPO (sb3-contrib) per memory budget, trained on CheckpointEnv in chunks.

An agent sees only a ModelProfile (plain data) and, in ``measured`` mode, a function that
measures a plan; it never touches Ray. ``search.agent_pool`` runs each agent as a Ray actor and
collects the plans its episodes end on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
from sb3_contrib import MaskablePPO

from env.checkpoint_env import CheckpointEnv
from env.profile import ModelProfile

Measure = Callable[[list[int]], tuple[int, float]]


class PPOAgent:
    """A MaskablePPO agent for one budget; ``train(n)`` runs n more steps and reports new plans."""

    def __init__(self, name: str, profile: dict[str, Any] | ModelProfile, budget_bytes: int, seed: int,
                 reward_mode: str = "model", measure_fn: Measure | None = None, tb_dir: str | None = None,
                 save_path: str | None = None) -> None:
        self.name, self.budget_bytes, self.save_path = name, budget_bytes, save_path
        prof = profile if isinstance(profile, ModelProfile) else ModelProfile.model_validate(profile)
        self.n_units = len(prof.units)
        self.new_plans: dict[tuple[int, ...], dict[str, Any]] = {}
        self.episodes = 0
        self.best_reward = -np.inf
        # hybrid: the agent learns on the cost model; the driver measures candidates between
        # chunks and feeds them back through observe(), which corrects the model's predictions
        env_mode = "measured" if reward_mode == "measured" else "model"
        self.env = CheckpointEnv(profile=prof, budget_bytes=budget_bytes, reward_mode=env_mode,
                                 evaluator=measure_fn, on_plan=self._on_plan)
        n_steps = max(64, (256 // self.n_units) * self.n_units)  # whole episodes per rollout
        if save_path and Path(save_path).is_file():
            self.model = MaskablePPO.load(save_path, env=self.env, tensorboard_log=tb_dir)
        else:
            self.model = MaskablePPO("MlpPolicy", self.env, n_steps=n_steps, batch_size=64, n_epochs=5,
                                     learning_rate=3e-4, gamma=1.0, ent_coef=0.01, seed=seed, verbose=0,
                                     tensorboard_log=tb_dir, device="cpu")

    def _on_plan(self, actions: list[int], info: dict[str, Any]) -> None:
        self.episodes += 1
        self.best_reward = max(self.best_reward, float(info.get("reward", -np.inf)))
        key = tuple(int(a) for a in actions)
        if key not in self.new_plans:
            self.new_plans[key] = {"peak_bytes": int(info["peak_bytes"]), "step_seconds": float(info["step_seconds"]),
                                   "measured": bool(info.get("measured", False))}

    def train(self, timesteps: int) -> dict[str, Any]:
        self.new_plans = {}
        self.model.learn(timesteps, reset_num_timesteps=False, tb_log_name=self.name, progress_bar=False)
        if self.save_path:
            self.model.save(self.save_path)
        plans = [{"actions": list(k), **v} for k, v in self.new_plans.items()]
        return {"name": self.name, "timesteps": int(self.model.num_timesteps), "episodes": self.episodes,
                "best_reward": float(self.best_reward), "plans": plans}

    def observe(self, measurements: list[tuple[list[int], int, float]]) -> None:
        """Measured (actions, peak_bytes, step_seconds): the env's hybrid reward learns from them."""
        self.env.add_measurements(measurements)

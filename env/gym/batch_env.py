"""A checkpoint env conditioned on the micro-batch: each episode plans one micro-batch under one budget.

``MicroBatchEnv`` holds one ``CheckpointEnv`` per micro-batch (each on the profile fitted at that size,
``env.cost.batch_fit``). ``reset`` draws the episode's micro-batch uniformly (from ``self.np_random``;
``options={"micro_batch": b}`` sets it) and the micro-batch's env draws the budget; the episode is that
env's, and its observation carries two more entries, so that one policy learns the plans of every
micro-batch:

| Index   | Observation                                            |
|---------|--------------------------------------------------------|
| 0 .. N  | the micro-batch's ``CheckpointEnv`` observation        |
| N       | log2(micro-batch) / log2(largest micro-batch)          |
| N + 1   | micro-batch / largest micro-batch                      |

Actions, masks and rewards are the micro-batch's env's: at one micro-batch, samples per second go
with the inverse of the step time, which its reward already prices. ``info`` at the end adds
``micro_batch``. The throughput search's agent learns on it (``agents.batch_conditioned``); the
alternative, one agent per micro-batch (``agents.batch_agents``), does without it.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from env.gym.checkpoint_env import CheckpointEnv
from env.gym.features import OBS_BOUND

__all__ = ["MicroBatchEnv"]


class MicroBatchEnv(gym.Env[np.ndarray, np.int64]):
    """``envs[b]``: the env of micro-batch ``b``; every one has the same actions."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, envs: dict[int, CheckpointEnv]) -> None:
        if not envs:
            raise ValueError("MicroBatchEnv needs at least one micro-batch's env")
        self.envs = dict(sorted(envs.items()))
        self.batches = list(self.envs)
        first = self.envs[self.batches[0]]
        if any(e.action_space != first.action_space or e.observation_space != first.observation_space
               for e in self.envs.values()):
            raise ValueError("the micro-batches' envs differ in actions or observations; make them from profiles of "
                             "the same units and actions")
        self.action_space = first.action_space
        self.observation_space = spaces.Box(-OBS_BOUND, OBS_BOUND, shape=(first.observation_space.shape[0] + 2,),
                                            dtype=np.float32)
        self.micro_batch = self.batches[0]
        self._top = max(self.batches)
        self._seeded = False

    @property
    def env(self) -> CheckpointEnv:
        """This episode's micro-batch's env."""
        return self.envs[self.micro_batch]

    def features(self, micro_batch: int) -> list[float]:
        log_top = math.log2(self._top) if self._top > 1 else 1.0
        return [math.log2(micro_batch) / log_top, micro_batch / self._top]

    def _obs(self, inner: np.ndarray) -> np.ndarray:
        return np.concatenate([inner, self.features(self.micro_batch)]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if not self._seeded or seed is not None:  # every micro-batch's env draws its budgets from a seed of ours
            for env in self.envs.values():
                env.reset(seed=int(self.np_random.integers(2**31)))
            self._seeded = True
        options = dict(options or {})
        b = options.pop("micro_batch", None)
        if b is not None and b not in self.envs:
            raise ValueError(f"micro_batch={b} is not one of this env's ({', '.join(map(str, self.batches))})")
        self.micro_batch = int(b) if b is not None else self.batches[int(self.np_random.integers(len(self.batches)))]
        obs, info = self.env.reset(options=options or None)
        return self._obs(obs), {**info, "micro_batch": self.micro_batch}

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated:
            info = {**info, "micro_batch": self.micro_batch}
        return self._obs(obs), reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        return self.env.action_masks()

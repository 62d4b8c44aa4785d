"""The throughput search's agent: one PPO agent conditioned on the micro-batch as well as the budget.

The agent's env is ``env.gym.batch_env.MicroBatchEnv`` (an episode: one micro-batch, one budget; both in
the observation). It learns as ``agents.ppo.PPOAgent`` does: the exact solver's plans at every
micro-batch are cloned into the one policy (``agents.imitation``, the demonstrations of each size
carrying its micro-batch features) until its plans are about as fast as the teacher's, then PPO trains
on episodes whose micro-batch and budget are drawn each time. The plans measured at a micro-batch
correct that micro-batch's cost model (``observe``). ``plans`` asks the policy at every micro-batch and
budget; the caller keeps, per cap, the micro-batch whose plan trains the most samples per second.

Against one agent per micro-batch (``agents.batch_agents``), at equal PPO steps, on the fitted cost
model (``bench/throughput.py --agents``, docs/throughput.md): the same answers on gpt/small (6 units)
and on a layered 48-unit model, 0.5% fewer predicted samples per second on a layered 24-unit one, in
a sixth to a fifth of the training time: one cloning serves every micro-batch."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Sequence

import numpy as np
from sb3_contrib import MaskablePPO
from stable_baselines3.common.logger import Logger

from agents.batch_agents import reachable_range
from agents.exact import FrontierPoint
from agents.imitation import Demonstrations, clone, demo_budgets, demonstrations, teacher_frontier
from agents.ppo import AgentConfig
from env.data.model_profile import ModelProfile
from env.data.types import Indices
from env.gym.batch_env import MicroBatchEnv
from env.gym.checkpoint_env import CheckpointEnv


def _joined(parts: list[Demonstrations]) -> Demonstrations:
    w = np.concatenate([d.weights for d in parts])
    return Demonstrations(np.vstack([d.obs for d in parts]), np.vstack([d.masks for d in parts]),
                          np.concatenate([d.actions for d in parts]), np.concatenate([d.returns for d in parts]),
                          w / w.mean(), sum(d.episodes for d in parts))


class MicroBatchConditionedAgent:
    """One MaskablePPO policy over ``MicroBatchEnv``: plans for every micro-batch of ``profiles`` and budget."""

    def __init__(self, profiles: dict[int, ModelProfile], budgets: dict[int, Sequence[int]], seed: int = 0,
                 config: AgentConfig | None = None) -> None:
        self.cfg = config or AgentConfig()
        envs = {b: CheckpointEnv(p, span, "model") for b, p in sorted(profiles.items())
                if (span := reachable_range(p, budgets[b])) is not None}
        self.env = MicroBatchEnv(envs)
        self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.n_units = next(iter(envs.values())).n_units
        n_steps = self.cfg.episodes_per_rollout * self.n_units
        self.model = MaskablePPO("MlpPolicy", self.env, n_steps=n_steps, batch_size=min(256, n_steps), n_epochs=4,
                                 learning_rate=self.cfg.learning_rate, gamma=1.0, gae_lambda=1.0,
                                 clip_range=self.cfg.clip_range, ent_coef=self.cfg.ent_coef, seed=seed,
                                 policy_kwargs={"net_arch": list(self.cfg.net_arch)}, verbose=0, device="cpu")
        self.model.set_logger(Logger(folder=None, output_formats=[]))
        self.clone_stats: dict[str, Any] | None = None

    def observe(self, micro_batch: int, measured: Sequence[tuple[Indices, int, float]]) -> None:
        """Plans measured at ``micro_batch`` (indices, peak bytes, step seconds): that micro-batch's correction,
        before the (first) cloning, which they change."""
        if micro_batch in self.env.envs and measured:
            self.env.envs[micro_batch].add_measurements([(list(p), peak, s) for p, peak, s in measured])
            self.clone_stats = None  # clone again on the corrected models

    def train(self, timesteps: int) -> dict[str, Any]:
        """Clone the teachers once, then ``timesteps`` PPO steps (whole rollouts); the cloning's stats."""
        if self.clone_stats is None:
            self._clone()
        timesteps = timesteps // self.model.n_steps * self.model.n_steps
        if timesteps > 0:
            self.model.learn(timesteps, reset_num_timesteps=False, progress_bar=False)
        return {"timesteps": int(self.model.num_timesteps), "clone": self.clone_stats}

    def _clone(self) -> None:
        cfg, parts, checks = self.cfg, [], {}
        for b, env in self.env.envs.items():
            frontier = teacher_frontier(env, cfg.teacher_relative, cfg.teacher_floor)
            budgets = demo_budgets(frontier, env.budget_range, cfg.demo_points, cfg.demo_random_budgets, self.rng)
            d = demonstrations(env, frontier, budgets, cfg.time_scale)
            extra = np.tile(np.array(self.env.features(b), dtype=np.float32), (len(d.obs), 1))
            parts.append(dataclasses.replace(d, obs=np.hstack([d.obs, extra])))
            step = max(1, len(budgets) // max(1, cfg.regret_budgets // len(self.env.envs)))
            checks[b] = (frontier, budgets[::step])
        stats = clone(self.model, _joined(parts), lambda: self.regret(checks), cfg.clone_updates, cfg.clone_tolerance,
                      cfg.clone_lr, 256, self.rng, patience=cfg.clone_patience)
        self.clone_stats = dataclasses.asdict(stats)

    def regret(self, checks: dict[int, tuple[list[FrontierPoint], Sequence[int]]]) -> float:
        """Mean over micro-batches and budgets of how much slower the policy's plan is than the teacher's, in
        the micro-batch's baseline seconds, plus its overshoot in baseline peaks."""
        gaps = []
        for b, (frontier, budgets) in checks.items():
            env = self.env.envs[b]
            for budget, info in zip(budgets, self.rollouts(b, budgets)):
                fits = [p for p in frontier if p.peak_bytes <= budget]
                best = fits[-1].step_seconds if fits else frontier[0].step_seconds
                gaps.append(max(0.0, info["step_seconds"] - best) / env.baseline_seconds
                            + max(0, info["peak_bytes"] - budget) / env.baseline_peak)
        return float(np.mean(gaps)) if gaps else 0.0

    def rollouts(self, micro_batch: int, budgets: Sequence[int]) -> list[dict[str, Any]]:
        """The policy's deterministic episode at ``micro_batch`` for each budget (the env's end-of-episode info)."""
        walks = []
        for _ in budgets:
            w = copy.copy(self.env.envs[micro_batch])
            w.on_plan = None
            walks.append(w)
        extra = self.env.features(micro_batch)
        obs = np.stack([np.concatenate([w.reset(options={"budget_bytes": int(x)})[0], extra])
                        for w, x in zip(walks, budgets)]).astype(np.float32)
        infos: list[dict[str, Any]] = []
        for _ in range(self.n_units):
            masks = np.stack([w.action_masks() for w in walks])
            actions, _ = self.model.predict(obs, action_masks=masks, deterministic=True)
            steps = [w.step(int(a)) for w, a in zip(walks, actions)]
            obs = np.stack([np.concatenate([s[0], extra]) for s in steps]).astype(np.float32)
            infos = [s[4] for s in steps]
        return infos

    def plans(self, budgets: dict[int, Sequence[int]]) -> dict[int, list[Indices]]:
        """Per micro-batch, the policy's plan at each of its budgets (clipped into the micro-batch's range)."""
        out = {}
        for b, env in self.env.envs.items():
            low, high = env.budget_range
            asked = sorted({min(max(int(x), low), high) for x in budgets[b]})
            out[b] = list(dict.fromkeys(tuple(i["plan_indices"]) for i in self.rollouts(b, asked)))
        return out

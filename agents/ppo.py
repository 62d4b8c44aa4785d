"""PPO agents conditioned on the memory budget: one agent traces a whole range of the frontier.

An agent is one MaskablePPO (sb3-contrib) policy on a ``CheckpointEnv`` whose episodes each
draw a budget from the agent's range (a ``BudgetShare`` of the reachable budgets, see
``budget_slices``); the budget is in the observation, so the policy learns the plan for every
budget of its range rather than for one. A chunk (``train(timesteps)``):

1. when the cost model's correction changed (first chunk, or ``observe`` brought new
   measurements), the exact solver's plans on the corrected cost model, priced as measured where
   measured and joined by the measured plans that beat them (``teacher_frontier``), are cloned
   into the policy (``agents.imitation``): one demonstration per budget where the teacher's best
   plan changes, until the policy's own plans are as fast as the teacher's (``regret``);
2. PPO trains ``timesteps`` more steps on the env's reward (the corrected cost model in
   ``model``/``hybrid`` mode, measurements in ``measured`` mode), budgets drawn per episode;
3. the report lists the non-dominated plans among the policy's deterministic plans at every
   budget where the solver's best plan changes and at ``report_budgets`` evenly spread ones
   (after cloning and after PPO) and PPO's episodes. Every chunk lists them all again: the
   driver keeps a plan's first proposer.

Cloned budget-conditioned agents come closer to the exact frontier in the same steps than one
agent per budget or PPO alone (docs/measurement.md, "Why the agents are cloned and
budget-conditioned"). In the hybrid loop the agents follow the cost model as corrected by the
measurements (``MeasuredCorrection``), so they are as right as it is.

An agent sees only a ModelProfile (plain data) and, in ``measured`` mode, a function that
measures a plan; it never touches Ray. ``search.engine.agent_pool`` runs each agent as a Ray actor and
collects the plans its episodes end on.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from sb3_contrib import MaskablePPO
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.utils import configure_logger

from agents.exact import FrontierPoint, pareto_points
from agents.imitation import clone, demo_budgets, demonstrations, teacher_frontier
from env.data.model_profile import ModelProfile
from env.data.plan import Action
from env.gym.budget import Budget, BudgetShare, reward_mode_name
from env.gym.checkpoint_env import CheckpointEnv

Measure = Callable[[list[int]], tuple[int, float]]


@dataclass
class AgentConfig:
    net_arch: tuple[int, ...] = (128, 128)
    """hidden layers of the policy and of the value network"""
    learning_rate: float = 1e-4
    """PPO's step size after cloning: small, so that PPO refines the cloned plans"""
    ent_coef: float = 0.001
    """PPO's entropy bonus"""
    clip_range: float = 0.1
    """PPO's clip range"""
    episodes_per_rollout: int = 8
    """whole episodes per PPO rollout (n_steps = this x units)"""
    teacher_relative: float = 0.005
    """the teacher solver's step in peak-state bytes, as a share of how far a state lies below all-keep's"""
    teacher_floor: float = 1e-5
    """the teacher solver's finest step, as a share of the baseline's activation bytes"""
    demo_points: int = 512
    """most frontier points whose budgets are demonstrated"""
    regret_budgets: int = 128
    """demonstrated budgets (evenly spread) at which cloning checks the policy's plans"""
    demo_random_budgets: int = 64
    """budgets drawn uniformly from the range and demonstrated too"""
    clone_updates: int = 3000
    """most minibatch updates (of 256 steps) in one cloning"""
    clone_tolerance: float = 0.01
    """cloning stops once the policy's plans are this close to the teacher's (``PPOAgent.regret``: 1%
    of what the teacher's plans cost over the baseline)"""
    time_scale: float = 0.002
    """step-time ratio below which a plan's cost over the baseline counts as this much (regret, weights)"""
    clone_patience: int = 3
    """cloning stops after this many checks (every 200 updates) without a better regret"""
    clone_lr: float = 3e-3
    """Adam step size of cloning"""
    report_budgets: int = 32
    """budgets evenly spread over the range at which the policy's plan is reported"""


class PPOAgent:
    """A budget-conditioned MaskablePPO agent; ``train(n)`` runs n more steps and reports plans.

    ``budget_bytes``: a ``BudgetShare`` of the reachable budgets (``budget_slices`` gives one per
    agent), None for all of them, a (low, high) range in bytes, or one budget in bytes (as one
    agent per budget did). ``reward_mode`` (str or str-valued Enum): ``model`` and ``hybrid``
    train on the cost model corrected by what ``observe`` gives; ``measured`` measures every new
    plan of PPO's episodes with ``measure_fn``. ``tb_dir``: TensorBoard logs (cloning under
    ``clone/``, PPO under SB3's names) in ``tb_dir/<name>_<k>``. ``save_path``: the policy is
    saved there after every chunk and loaded from there when the file exists (a restarted actor).
    """

    def __init__(self, name: str, profile: dict[str, Any] | ModelProfile, budget_bytes: Budget = None, seed: int = 0,
                 reward_mode: str | Enum = "model", measure_fn: Measure | None = None, tb_dir: str | None = None,
                 save_path: str | None = None, config: AgentConfig | None = None) -> None:
        self.name, self.save_path, self.tb_dir, self.cfg = name, save_path, tb_dir, config or AgentConfig()
        prof = profile if isinstance(profile, ModelProfile) else ModelProfile.model_validate(profile)
        self.n_units = len(prof.units)
        self.rng = np.random.default_rng(seed)
        self.episodes = 0
        self.best_reward = -np.inf
        self.seen: dict[tuple[int, ...], dict[str, Any]] = {}  # this chunk's episode plans
        self.teacher_stale = True
        self.clone_stats: list[dict[str, Any]] = []
        self._teacher_peaks: list[int] = []
        self.incumbents: dict[tuple[int, ...], None] = {}  # measured plans the teacher may demonstrate
        # hybrid: the agent learns on the cost model; the driver measures candidates between
        # chunks and feeds them back through observe(), which corrects the model's predictions
        mode = reward_mode_name("model" if _name(reward_mode) == "hybrid" else reward_mode)
        self.env = CheckpointEnv(profile=prof, budget_bytes=budget_bytes, reward_mode=mode,
                                 evaluator=measure_fn, on_plan=self._on_plan)
        self.env.reset(seed=seed)
        n_steps = self.cfg.episodes_per_rollout * self.n_units
        if save_path and Path(save_path).is_file():
            self.model = MaskablePPO.load(save_path, env=self.env, tensorboard_log=tb_dir, device="cpu")
        else:
            self.model = MaskablePPO("MlpPolicy", self.env, n_steps=n_steps, batch_size=min(256, n_steps),
                                     n_epochs=4, learning_rate=self.cfg.learning_rate, gamma=1.0, gae_lambda=1.0,
                                     clip_range=self.cfg.clip_range, ent_coef=self.cfg.ent_coef, seed=seed,
                                     policy_kwargs={"net_arch": list(self.cfg.net_arch)}, verbose=0,
                                     tensorboard_log=tb_dir, device="cpu")
        # one TensorBoard run per agent: cloning and PPO curves side by side; without a folder, a logger that
        # writes nowhere (SB3's own would leave an empty SB3-<date> folder in the temp folder per agent)
        self.model.set_logger(configure_logger(0, tb_dir, name, reset_num_timesteps=True) if tb_dir
                              else Logger(folder=None, output_formats=[]))

    @property
    def rollout_steps(self) -> int:
        """Environment steps of one PPO rollout: ``train`` runs whole rollouts only, never more steps than asked."""
        return int(self.model.n_steps)

    def timesteps(self) -> int:
        """Environment steps trained so far, those of a policy loaded from ``save_path`` included."""
        return int(self.model.num_timesteps)

    def _on_plan(self, actions: list[int], info: dict[str, Any]) -> None:
        self.episodes += 1
        self.best_reward = max(self.best_reward, float(info["reward"]))
        self.seen.setdefault(tuple(int(a) for a in actions), {
            "peak_bytes": int(info["peak_bytes"]), "step_seconds": float(info["step_seconds"]),
            "measured": bool(info["measured"])})

    # -- training -------------------------------------------------------------------------------

    def train(self, timesteps: int) -> dict[str, Any]:
        """Clone the teacher if the correction changed, train PPO ``timesteps`` steps (0: none; rounded
        down to whole rollouts, so never more than asked), report: ``{name, timesteps, rollout_steps, episodes, best_reward, budget_range: [low, high] bytes, clone:
        the last cloning's stats or None, plans: [{actions, peak_bytes, step_seconds, measured}]}``.
        ``plans`` are the non-dominated ones, by the env's numbers (measured, else the corrected
        prediction), among the policy's plans at the report budgets (after cloning and after
        PPO) and PPO's episodes."""
        self.seen = {}
        budgets = self._clone_teacher() if self.teacher_stale else self._report_budgets()
        plans = self.plans_at(budgets)
        timesteps = timesteps // self.rollout_steps * self.rollout_steps  # PPO learns in whole rollouts
        if timesteps > 0:
            self.model.learn(timesteps, reset_num_timesteps=False, tb_log_name=self.name, progress_bar=False)
            plans.update(self.plans_at(budgets))
        if self.save_path:
            self.model.save(self.save_path)
        for k, v in self.seen.items():
            plans.setdefault(k, v)
        front = pareto_points([(v["peak_bytes"], v["step_seconds"], k) for k, v in plans.items()])
        return {"name": self.name, "timesteps": self.timesteps(), "rollout_steps": self.rollout_steps,
                "episodes": self.episodes,
                "best_reward": float(self.best_reward), "budget_range": list(self.env.budget_range),
                "clone": self.clone_stats[-1] if self.clone_stats else None,
                "plans": [{"actions": list(p.plan), **plans[p.plan]} for p in front]}

    def _clone_teacher(self) -> list[int]:
        """Clone the exact solver's plans on the corrected cost model; the budgets demonstrated."""
        frontier = teacher_frontier(self.env, self.cfg.teacher_relative, self.cfg.teacher_floor, self.incumbents)
        budgets = demo_budgets(frontier, self.env.budget_range, self.cfg.demo_points, self.cfg.demo_random_budgets,
                               self.rng)
        demos = demonstrations(self.env, frontier, budgets, self.cfg.time_scale)
        checked = _spread(budgets, self.cfg.regret_budgets)
        stats = clone(self.model, demos, lambda: self.regret(frontier, checked), self.cfg.clone_updates,
                      self.cfg.clone_tolerance, self.cfg.clone_lr, 256, self.rng, patience=self.cfg.clone_patience)
        self.teacher_stale = False
        self.clone_stats.append({"teacher_points": len(frontier), "budgets": len(budgets), **dataclasses.asdict(stats)})
        if self.tb_dir:
            for key in ("teacher_points", "updates", "accuracy", "regret", "loss", "seconds"):
                self.model.logger.record(f"clone/{key}", self.clone_stats[-1][key])
            self.model.logger.dump(self.model.num_timesteps)
        self._teacher_peaks = [p.peak_bytes for p in frontier]
        return self._report_budgets()

    def regret(self, frontier: Sequence[FrontierPoint], budgets: Sequence[int]) -> float:
        """Mean over the budgets of how much slower the policy's plan is than the teacher's,
        relative to what the teacher's plan costs over the baseline (``|seconds / baseline's - 1|
        + time_scale``), plus its overshoot of the budget (in baseline peaks). Relative, so that
        near the baseline, where plans differ by hundredths of a percent, an error counts."""
        base_peak, base_seconds = self.env.baseline_peak, self.env.correction.corrected_model().step_seconds(
            [self.env.cost_model.action_index(Action.KEEP)] * self.n_units)
        gaps = []
        for budget, info in zip(budgets, self.rollouts(budgets)):
            fits = [p for p in frontier if p.peak_bytes <= budget]
            best = fits[-1].step_seconds if fits else frontier[0].step_seconds
            scale = abs(best / base_seconds - 1.0) + self.cfg.time_scale
            gaps.append(max(0.0, info["step_seconds"] - best) / base_seconds / scale
                        + max(0, info["peak_bytes"] - budget) / base_peak)
        return float(np.mean(gaps))

    def _report_budgets(self) -> list[int]:
        """Where the policy's plans are reported: every peak of the teacher's frontier in the
        range (where the best plan changes) and ``report_budgets`` evenly spread ones."""
        low, high = self.env.budget_range
        grid = np.linspace(low, high, self.cfg.report_budgets).round().astype(int).tolist() if high > low else [low]
        return sorted(set(grid) | {b for b in self._teacher_peaks if low <= b <= high})

    def rollouts(self, budgets: Sequence[int]) -> list[dict[str, Any]]:
        """The policy's deterministic episode at each budget (the env's end-of-episode info), all
        budgets stepped together so that the policy runs once per unit. Predicted by the env's
        corrected cost model (measured if measured), never measured: in ``measured`` mode the
        training episodes do that."""
        walks = []
        for _ in budgets:
            w = copy.copy(self.env)
            w.on_plan, w.reward_mode = None, "model"
            walks.append(w)
        obs = np.stack([w.reset(options={"budget_bytes": int(b)})[0] for w, b in zip(walks, budgets)])
        infos: list[dict[str, Any]] = []
        for _ in range(self.n_units):
            masks = np.stack([w.action_masks() for w in walks])
            actions, _ = self.model.predict(obs, action_masks=masks, deterministic=True)
            steps = [w.step(int(a)) for w, a in zip(walks, actions)]
            obs = np.stack([s[0] for s in steps])
            infos = [s[4] for s in steps]
        return infos

    def plans_at(self, budgets: Sequence[int]) -> dict[tuple[int, ...], dict[str, Any]]:
        """The policy's plans at these budgets, as the report lists them."""
        return {tuple(i["plan_indices"]): {"peak_bytes": i["peak_bytes"], "step_seconds": i["step_seconds"],
                                           "measured": i["measured"]} for i in self.rollouts(budgets)}

    def observe(self, measurements: list[tuple[list[int], int, float]], teach: Sequence[bool] | None = None) -> None:
        """Measured (actions, peak_bytes, step_seconds): they correct the env's cost model, and the
        next ``train`` clones the teacher (the exact plans on the corrected model, priced as
        measured where measured) before PPO goes on. ``teach`` (default all): which of them the
        teacher may also demonstrate where they beat its plans (``teacher_frontier``'s incumbents);
        with ``--no-warm-start`` the driver leaves out the rules' plans, so that every plan an agent
        proposes stays its own find (``search.engine.agent_pool.may_demonstrate``)."""
        teach = [True] * len(measurements) if teach is None else list(teach)
        if len(teach) != len(measurements):
            raise ValueError(f"teach has {len(teach)} flags for {len(measurements)} measurements; give one each")
        new_incumbents = [tuple(int(a) for a in m[0]) for m, t in zip(measurements, teach) if t]
        fresh = any(p not in self.incumbents for p in new_incumbents)
        self.incumbents.update(dict.fromkeys(new_incumbents))
        if self.env.add_measurements(measurements) or fresh:
            self.teacher_stale = True


def _name(mode: str | Enum) -> str:
    return str(mode.value if isinstance(mode, Enum) else mode)


def _spread(values: Sequence[int], count: int) -> list[int]:
    """At most ``count`` of the sorted ``values``, evenly spread, both ends kept."""
    if len(values) <= count:
        return list(values)
    return [values[round(j)] for j in np.linspace(0, len(values) - 1, count)]


def budget_slices(n_agents: int, overlap: float = 0.02) -> list[BudgetShare]:
    """``n_agents`` slices of the reachable budgets, lowest first, each overlapping its
    neighbours by ``overlap`` of the range: one per agent, so that together they cover it."""
    if n_agents < 1:
        raise ValueError(f"n_agents={n_agents}: give at least one agent")
    return [BudgetShare(max(0.0, k / n_agents - overlap), min(1.0, (k + 1) / n_agents + overlap))
            for k in range(n_agents)]

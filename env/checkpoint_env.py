"""The Gymnasium environment: pick each unit's checkpoint action in turn, under a memory budget.

An episode is one plan. The reward is the plan's step time relative to the all-``keep``
baseline when its peak memory fits the agent's budget, and a penalty below every feasible
reward when it does not. Peak and time come from the cost model (``model``), from real
measurements (``measured``), or from the cost model corrected by measurements (``hybrid``).

Besides the env, this file holds the peak-memory walk in the max-plus form the env and the
exact solver (``agents.exact``) both carry unit by unit. The cost model's walk
(``env.cost_model``) is::

    forward:  P = max(P, L + f_rise[i]);  L += f_delta[i]        (i = 0 .. n-1)
    backward: peak over B_{n-1} .. B_0 and the tail, after the level L + post.delta

The backward pass visits the units in reverse, so a forward walk cannot finish it unit by
unit. It can carry ``M = L + R`` instead, where ``R`` is the backward part of the units seen
so far measured from the start of their backward (``R = tail.rise`` before any unit)::

    M' = max(M + f_delta[i] + b_delta[i],  L + f_delta[i] + b_rise[i])
    peak = max(P, L + post.rise, M + post.delta)                  (after the last unit)

Every update is a max of sums, so the units ``k .. n-1`` act on a state as one functional
``peak = max(P, L + cL, M + cM)``; ``suffix_functionals`` keeps the non-dominated ``(cL, cM)``
of every suffix. The lowest peak any completion can reach from a state is then exact, which
is what ``action_masks`` and the exact solver's pruning use.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from env.correction import MeasuredCorrection
from env.cost_model import CostModel
from env.peak_walk import advance, initial_state, lowest_peak, suffix_functionals, unit_terms
from env.plan import Action
from env.profile import ModelProfile

Evaluator = Callable[[list[int]], tuple[int, float]]  # profile action indices -> (peak_bytes, step_seconds)
PlanCallback = Callable[[list[int], dict], None]
REWARD_MODES = ("model", "measured", "hybrid")
OBS_BOUND = 1e6  # observations are ratios of order 1; clipped here so the Box is finite

class CheckpointEnv(gym.Env[np.ndarray, np.int64]):
    """
    ## Description

    Choose an activation-checkpointing action for each decision unit of a model, in execution
    order, so that one training step fits a memory budget as fast as possible. The model is
    seen only through its ``ModelProfile`` (per unit and action: bytes kept, backward rise,
    seconds). One env holds one budget; a set of agents, one per budget spread between the
    lowest reachable peak and the baseline, traces the memory/time Pareto frontier. A budget
    constraint finds every frontier point, including those in non-convex stretches of the
    frontier; maximising a weighted sum ``-(w * memory + (1 - w) * time)`` over any set of
    weights only finds the points on the frontier's convex hull.

    ## Action Space

    ``Discrete(A)`` over the enabled actions (``actions`` argument, default all profiled), in
    the profile's order; for the default profile:

    | Num | Action    | Meaning                                                        |
    |-----|-----------|----------------------------------------------------------------|
    | 0   | keep      | store the unit's activations (no checkpointing)                |
    | 1   | recompute | store its inputs only, rerun its forward in backward           |
    | 2   | selective | store matmul/conv outputs, recompute the cheap ops             |

    ``action_masks()`` (for ``sb3_contrib.MaskablePPO``) allows an action only if some
    completion of the plan still fits the budget on the cost model (exact, see the module
    docstring; scaled by the measured/predicted peak ratio in ``hybrid`` and ``measured``
    modes). If no action fits, it allows the one whose best completion peaks lowest, so the
    mask is never all false.

    ## Observation Space

    ``Box(-1e6, 1e6, (4A + 4,), float32)`` (values clipped to the bounds); "baseline" is the
    all-``keep`` plan on the cost model, "activation" its peak minus the bytes live before
    the step:

    | Index            | Observation                                                      |
    |------------------|------------------------------------------------------------------|
    | 3k, 3k+1, 3k+2   | current unit under action k: kept bytes / baseline activation,   |
    |                  | backward rise / baseline activation, seconds / baseline seconds  |
    | 3A               | position i / n                                                   |
    | 3A+1 .. 4A       | fraction of all n units given action k so far                    |
    | 4A+1             | forward level so far / budget                                    |
    | 4A+2             | lowest peak any completion reaches / budget                      |
    | 4A+3             | budget / baseline peak                                           |

    After the last unit the unit features are 0 and the lowest peak is the plan's own.

    ## Rewards

    0 for every step but the last. At the end, with ``r = step_seconds / baseline seconds``:

    | Plan                   | Reward                                                          |
    |------------------------|-----------------------------------------------------------------|
    | peak <= budget         | ``-min(r, cap)``                                                |
    | peak > budget          | ``-cap - 1 - (peak - budget) / baseline peak``                  |

    ``cap`` is 1.5 times the slowest plan's predicted ratio, so every feasible plan scores
    above every infeasible one and the penalty grows with the overshoot. Peak and time come
    from ``reward_mode``:

    | Mode       | Source                                                                     |
    |------------|----------------------------------------------------------------------------|
    | model      | ``CostModel.predict`` (deterministic); once ``add_measurements`` has given |
    |            | measured plans, corrected by them as in ``hybrid`` (no measuring here)     |
    | measured   | ``evaluator`` for every new plan, cached by plan; the baseline is measured |
    |            | too (once), so ratios compare measurements with measurements               |
    | hybrid     | the prediction corrected by the plans measured so far                      |
    |            | (``env.correction.MeasuredCorrection``: peak times the mean measured/      |
    |            | predicted ratio; time = measured baseline + per-unit extras fitted to the  |
    |            | measurements); a measured plan uses its                                    |
    |            | measurement. A new plan is measured when its corrected prediction fits     |
    |            | the budget and beats the fastest measured feasible plan: only candidates  |
    |            | that would become this agent's best cost a measurement.                    |

    ## Episode End

    Terminates after the last unit (n steps); never truncated. ``info`` at the end:
    ``plan`` (action names), ``plan_indices`` (profile action indices), ``peak_bytes``,
    ``step_seconds``, ``measured`` (bool), ``feasible`` (bool), ``reward_mode``; ``on_plan``
    is called with ``(plan_indices, info)``.

    ## Arguments

    | Argument      | Meaning                                                                  |
    |---------------|--------------------------------------------------------------------------|
    | profile       | ``ModelProfile`` of the workload (must include ``keep``: the baseline)   |
    | budget_bytes  | the agent's memory budget (peak bytes of the whole step)                 |
    | reward_mode   | ``model``, ``measured`` or ``hybrid``                                    |
    | evaluator     | ``f(profile action indices) -> (peak_bytes, step_seconds)``; needed by   |
    |               | ``measured`` and ``hybrid``                                              |
    | actions       | the enabled subset of ``profile.actions`` (default: all)                 |
    | on_plan       | ``f(plan_indices, info)`` called at every episode end                    |

    ``gymnasium.make("CkptSearch-v0", profile=prof, budget_bytes=b)``.

    ## Version History

    * v0: initial version.
    """

    metadata: dict[str, Any] = {"render_modes": [], "deterministic_reward_modes": ("model",)}

    def __init__(self, profile: ModelProfile, budget_bytes: int, reward_mode: str = "model",
                 evaluator: Evaluator | None = None, actions: Sequence[Action] | None = None,
                 on_plan: PlanCallback | None = None, render_mode: str | None = None) -> None:
        self._check_args(profile, budget_bytes, reward_mode, evaluator, actions)
        self.profile, self.budget_bytes, self.reward_mode = profile, int(budget_bytes), reward_mode
        self.evaluator, self.on_plan, self.render_mode = evaluator, on_plan, render_mode
        self.cost_model = cm = CostModel(profile)
        self.enabled = list(actions) if actions is not None else list(profile.actions)
        self._act = [profile.actions.index(a) for a in self.enabled]  # enabled k -> profile index
        n, n_act = cm.n_units, len(self._act)
        self.n_units = n
        keep = [profile.actions.index(Action.KEEP)] * n
        self.baseline_peak, self.baseline_seconds = cm.peak_bytes(keep), cm.step_seconds(keep)
        act_bytes = max(1, self.baseline_peak - profile.base_bytes)
        secs, kept, rise = cm.seconds.tolist(), cm.f_delta.tolist(), cm.b_rise.tolist()
        slowest = cm.fixed_seconds + sum(max(secs[i][a] for a in self._act) for i in range(n))
        self.time_cap = 1.5 * slowest / self.baseline_seconds
        self._budget_ratio = min(self.budget_bytes / self.baseline_peak, OBS_BOUND)
        self._names = [a.value for a in profile.actions]  # Enum.value is slow in the step path
        self._terms = unit_terms(cm, self._act)
        self._suffix = suffix_functionals(profile, self._terms)
        feats = [[v for a in self._act for v in (kept[i][a] / act_bytes, rise[i][a] / act_bytes,
                                                 secs[i][a] / self.baseline_seconds)] for i in range(n)]
        feats = [[min(max(v, -OBS_BOUND), OBS_BOUND) for v in row] for row in feats]
        self._unit_obs: list[list[float]] = feats + [[0.0] * (3 * n_act)]
        self.action_space = spaces.Discrete(n_act)
        self.observation_space = spaces.Box(-OBS_BOUND, OBS_BOUND, shape=(4 * n_act + 4,), dtype=np.float32)
        # measured plans, and the cost model corrected by them (hybrid/measured, add_measurements)
        self.correction = MeasuredCorrection(cm)
        self._best_measured_seconds = float("inf")
        self._reset_walk()

    @staticmethod
    def _check_args(profile: ModelProfile, budget_bytes: int, reward_mode: str,
                    evaluator: Evaluator | None, actions: Sequence[Action] | None) -> None:
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode '{reward_mode}' is not one of {', '.join(REWARD_MODES)}; pick one")
        if reward_mode != "model" and evaluator is None:
            raise ValueError(f"reward_mode '{reward_mode}' needs an evaluator (plan indices -> (peak_bytes, "
                             "step_seconds)); pass evaluator= or use reward_mode='model'")
        if int(budget_bytes) <= 0:
            raise ValueError(f"budget_bytes={budget_bytes} must be a positive number of bytes")
        if Action.KEEP not in profile.actions:
            raise ValueError("the profile has no 'keep' action, which the baseline needs; profile with keep")
        if actions is not None:
            missing = [a for a in actions if a not in profile.actions]
            if missing or not actions or len(set(actions)) != len(actions):
                raise ValueError(f"actions {[str(a) for a in actions]} must be distinct and among the "
                                 f"profiled {', '.join(a.value for a in profile.actions)}; choose from those")

    # -- the walk ---------------------------------------------------------------------------

    def _reset_walk(self) -> None:
        self._i = 0
        self._plan: list[int] = []  # enabled-action indices
        self._counts = [0] * len(self._act)
        self._state = initial_state(self.profile)

    def _learn(self, plan: tuple[int, ...], peak: int, seconds: float) -> None:
        """Take one measured plan into the cache and the correction."""
        if not self.correction.add(plan, peak, seconds):
            return
        if peak <= self.budget_bytes:
            self._best_measured_seconds = min(self._best_measured_seconds, float(seconds))

    @property
    def _measured_baseline(self) -> tuple[int, float] | None:
        return self.correction.baseline

    def _obs(self) -> np.ndarray:
        i, inv_n = self._i, 1.0 / self.n_units
        per_budget = self.correction.peak_ratio / self.budget_bytes
        low = lowest_peak(self._state, self._suffix[i])
        obs = self._unit_obs[i] + [i * inv_n] + [c * inv_n for c in self._counts]
        # the only features a tiny budget can blow up
        obs += [min(self._state[1] * per_budget, OBS_BOUND), min(low * per_budget, OBS_BOUND),
                self._budget_ratio]
        return np.array(obs, dtype=np.float32)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._reset_walk()
        return self._obs(), {}

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = int(action)
        if not 0 <= a < len(self._act):
            raise ValueError(f"action {action} is not in 0..{len(self._act) - 1} "
                             f"({', '.join(x.value for x in self.enabled)})")
        if self._i >= self.n_units:
            raise RuntimeError("step() after the episode ended; call reset() first")
        self._state = advance(self._state, self._terms[self._i][a])
        self._plan.append(a)
        self._counts[a] += 1
        self._i += 1
        if self._i < self.n_units:
            return self._obs(), 0.0, False, False, {}
        reward, info = self._finish()
        return self._obs(), reward, True, False, info

    def action_masks(self) -> np.ndarray:
        """Boolean (A,): actions after which some completion still fits the budget."""
        if self._i >= self.n_units:
            return np.ones(len(self._act), dtype=bool)
        limit = self.budget_bytes / self.correction.peak_ratio
        nxt = self._suffix[self._i + 1]
        lows = [lowest_peak(advance(self._state, t), nxt) for t in self._terms[self._i]]
        allowed = [low <= limit for low in lows]
        if not any(allowed):
            allowed[lows.index(min(lows))] = True
        return np.array(allowed, dtype=bool)

    # -- the reward -------------------------------------------------------------------------

    def _finish(self) -> tuple[float, dict]:
        plan = [self._act[k] for k in self._plan]
        peak, seconds, measured = self._evaluate(plan)
        base_seconds = self._measured_baseline[1] if self._measured_baseline else self.baseline_seconds
        base_peak = self._measured_baseline[0] if self._measured_baseline else self.baseline_peak
        feasible = peak <= self.budget_bytes
        if feasible:
            reward = -min(seconds / base_seconds, self.time_cap)
        else:
            reward = -self.time_cap - 1.0 - (peak - self.budget_bytes) / base_peak
        info = {"plan": [self._names[a] for a in plan], "plan_indices": plan,
                "peak_bytes": int(peak), "step_seconds": float(seconds), "measured": measured,
                "feasible": feasible, "reward_mode": self.reward_mode}
        if self.on_plan is not None:
            self.on_plan(plan, info)
        return float(reward), info

    def _evaluate(self, plan: list[int]) -> tuple[int, float, bool]:
        known = self.correction.measured.get(tuple(plan))
        if known is not None:
            return known + (True,)
        if self.reward_mode == "model":
            if not self.correction.measured:  # O(n): cheaper than a cache of every plan seen
                pred = self.cost_model.predict(plan)
                return pred.peak_bytes, pred.step_seconds, False
            return self.correction.predict(plan) + (False,)  # corrected by add_measurements()
        if self._measured_baseline is None:
            self._measure([self.profile.actions.index(Action.KEEP)] * self.n_units)
        if self.reward_mode == "measured":
            return self._measure(plan) + (True,)
        peak, seconds = self.correction.predict(plan)
        if peak <= self.budget_bytes and seconds < self._best_measured_seconds:
            return self._measure(plan) + (True,)
        return peak, seconds, False  # not cached: the correction moves as measurements arrive

    def add_measurements(self, measurements: Sequence[tuple[Sequence[int], int, float]]) -> None:
        """Plans measured by the caller, as (profile action indices, peak_bytes, step_seconds).

        They are answered by their measurement from now on, and correct every prediction
        (``self.correction``), in ``model`` mode too: the search's hybrid reward, where the
        driver measures between training chunks so that measuring never shares the CPU with
        training. The all-``keep`` plan among them becomes the baseline of the time ratio.
        """
        for plan, peak, seconds in measurements:
            self._learn(tuple(int(a) for a in plan), int(peak), float(seconds))

    def _measure(self, plan: list[int]) -> tuple[int, float]:
        """Measure a plan once (cached), and correct the cost model with it."""
        key = tuple(plan)
        if key in self.correction.measured:
            return self.correction.measured[key]
        assert self.evaluator is not None  # checked in __init__ for these modes
        peak, seconds = self.evaluator(list(plan))
        self._learn(key, int(peak), float(seconds))
        return int(peak), float(seconds)

"""The Gymnasium environment: pick each unit's checkpoint action in turn, under a memory budget.

An episode is one plan. The reward is the plan's step time relative to the all-``keep``
baseline when its peak memory fits the episode's budget, and a penalty below every feasible
reward when it does not. Peak and time come from the cost model (``model``; corrected by the
measured plans given to ``add_measurements``) or from real measurements (``measured``). An env
holds one budget or a range of budgets, one drawn per episode, so that one policy conditioned
on the budget can learn the whole memory/time frontier.

The env walks the cost model's peak unit by unit in the max-plus form of ``env.cost.peak_walk``
(the exact solver carries the same state), so the lowest peak any completion of the plan so far
can reach is exact: that is what ``action_masks`` use. The observation is built by
``env.gym.features``; budgets are parsed by ``env.gym.budget``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from env.cost.correction import MeasuredCorrection
from env.cost.cost_model import CostModel
from env.data.model_profile import ModelProfile
from env.data.plan import Action
from env.gym.budget import Budget, BudgetShare, check_env_args, parse_budget, reward_mode_name
from env.gym.features import N_GLOBAL_OBS, N_UNIT_OBS, OBS_BOUND, Features, Walk, budget_code

__all__ = ["CheckpointEnv"]

Evaluator = Callable[[list[int]], tuple[int, float]]  # profile action indices -> (peak_bytes, step_seconds)
PlanCallback = Callable[[list[int], dict], None]


class CheckpointEnv(gym.Env[np.ndarray, np.int64]):
    """
    ## Description

    Choose an activation-checkpointing action for each decision unit of a model, in execution
    order, so that one training step fits a memory budget as fast as possible. The model is
    seen only through its ``ModelProfile`` (per unit and action: bytes kept, backward rise,
    seconds). The budget is one number, or a range from which each episode draws its own (in
    bytes, or a ``BudgetShare`` of the reachable range): the observation carries the budget, so
    one policy can serve every budget of the range and trace that stretch of the memory/time
    Pareto frontier alone. A budget constraint finds every frontier point,
    including those in non-convex stretches of the frontier; maximising a weighted sum
    ``-(w * memory + (1 - w) * time)`` over any set of weights only finds the points on the
    frontier's convex hull.

    ## Action Space

    ``Discrete(A)`` over the enabled actions (``actions`` argument, default all profiled), in
    the profile's order; for the default profile:

    | Num | Action    | Meaning                                                        |
    |-----|-----------|----------------------------------------------------------------|
    | 0   | keep      | store the unit's activations (no checkpointing)                |
    | 1   | recompute | store its inputs only, rerun its forward in backward           |
    | 2   | selective | store matmul/conv outputs, recompute the cheap ops             |
    | 3   | chain     | recompute with the unit before it as one region that keeps     |
    |     |           | only the region's input (profiles where units chain)           |
    | 4   | chunked   | the loss unit's head and loss over chunks of tokens, each      |
    |     |           | recomputed in backward (profiles with a loss unit)             |
    | 5   | block     | recompute the unit's parent module as one region, with the     |
    |     |           | parent's other units (profiles whose units are a parent's)     |

    ``chain`` continues the region of the unit before it: it follows ``recompute`` or ``chain``,
    on a unit the profile says can chain onto the one before it (``chain_links``); anywhere
    else it is taken as ``recompute`` (it starts a region), so that an agent without masks
    still ends on a valid plan; ``chunked`` anywhere but on a loss unit (``chunk_units``) is
    taken as ``keep``. ``block`` on the first unit of a span (``block_spans``: all the units of
    one parent) makes the span's other units ``block`` whatever is chosen there; elsewhere it is
    taken as ``keep``. ``action_masks()`` (for ``sb3_contrib.MaskablePPO``) allows an
    action only if it can follow and some completion of the plan still fits the budget on the
    cost model (exact, see the module docstring; scaled by the mean measured/predicted peak
    ratio once plans are measured). If no action fits, it allows the one whose best completion
    peaks lowest, so the mask is never all false.

    ## Observation Space

    ``Box(-1e6, 1e6, (11A + 26,), float32)`` (values clipped to the bounds). Every entry is a
    ratio to the whole model, the budget, the baseline or the bytes still to save, not tied to
    the unit's position, so what a policy learns on one stretch of the model carries to the
    others. "Baseline" is the all-``keep`` plan on the cost model, "activation" its peak minus
    the bytes live before the step, "extra seconds" an action's seconds minus keeping the
    unit's (corrected by the measured plans once the baseline is measured). "Savable" is the
    peak if every unit from here keeps minus the lowest peak reachable from here; the slack
    entries divide by it (at least 0.1% of the activation) and are clipped to +-4, so that near
    a decision they read in units of what is left to decide. "Lookahead" prices action k as
    its extra seconds plus the cheapest single later unit whose action alone (every other
    later unit keeping) brings the peak within the budget, with each later unit's saving taken
    from the all-keep plan: exact where one unit's change is enough (budgets near the
    baseline's), a hint elsewhere:

    | Index     | Observation (current unit i under enabled action k)                        |
    |-----------|----------------------------------------------------------------------------|
    | 10k       | kept bytes / baseline activation                                           |
    | 10k+1     | backward rise / baseline activation                                        |
    | 10k+2     | extra seconds / baseline seconds                                           |
    | 10k+3     | rank of this unit's bytes saved per extra second under k among all units,  |
    |           | in [0, 1] (1: the most bytes per second; 0 for an action saving nothing)   |
    | 10k+4     | lowest peak any completion reaches after k / budget                        |
    | 10k+5     | (lowest peak after k - budget) / savable                                   |
    | 10k+6     | (peak after k if every later unit keeps - budget) / savable                |
    | 10k+7     | 1 if that peak (k, then every later unit keeps) fits the budget, else 0    |
    | 10k+8     | 1 if k has the lowest lookahead price (the first such k), else 0           |
    | 10k+9     | (k's lookahead price - the lowest) / 0.1% of the baseline seconds, in 0..4 |
    | 10A       | position i / n                                                             |
    | 10A+1 ..  | fraction of all n units given action k so far (A entries)                  |
    | 11A+1     | forward level so far / budget                                              |
    | 11A+2     | lowest peak any completion reaches from here / budget                      |
    | 11A+3     | peak if every unit from here keeps / budget                                |
    | 11A+4     | budget / baseline peak                                                     |
    | 11A+5     | budget's place between the lowest reachable peak (0) and the baseline (1)  |
    | 11A+6     | extra seconds of the plan so far / baseline seconds                        |
    | 11A+7     | (peak if every unit from here keeps - budget) / savable: the share of what |
    |           | can still be saved that must be (<= 0: nothing)                            |
    | 11A+8 ..  | sin, cos of pi 2^j x for the budget's place x, j = 0..7: which plan is best |
    |           | changes at many budgets a few bytes apart; these let a policy's decisions  |
    |           | change as sharply (at 10 units, 3 rather than 67 of 110 frontier budgets   |
    |           | off the teacher's plan after cloning)                                      |
    | 11A+24    | 1 if a chain region is open and this unit can continue it, else 0          |
    | 11A+25    | what that region recomputes at once so far (its units' kept bytes) /       |
    |           | baseline activation; 0 when none is open                                   |

    Peaks are scaled by the mean measured/predicted peak ratio. After the last unit the unit
    features are 0 and the peaks are the plan's own. For an action that cannot follow (a chain
    that continues no region) entries 10k+4 .. 10k+6 read 4 and 10k+7 reads 0.

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
    |            | measured plans, a measured plan scores its measurement and the others the  |
    |            | prediction corrected by them (``env.cost.correction.MeasuredCorrection``). The  |
    |            | search's hybrid reward is this mode with the driver's measurements.        |
    | measured   | ``evaluator`` for every new plan, cached by plan; the baseline is measured |
    |            | too (once), so ratios compare measurements with measurements               |

    ## Episode Start

    ``reset`` draws the episode's budget uniformly from ``budget_range`` (from ``self.np_random``;
    one number when ``budget_bytes`` is); ``reset(options={"budget_bytes": b})`` sets it instead.
    ``info`` holds ``budget_bytes``.

    ## Episode End

    Terminates after the last unit (n steps); never truncated. ``info`` at the end:
    ``plan`` (action names), ``plan_indices`` (profile action indices), ``peak_bytes``,
    ``step_seconds``, ``measured`` (bool), ``feasible`` (bool), ``budget_bytes``, ``reward``,
    ``reward_mode``; ``on_plan`` is called with ``(plan_indices, info)``.

    ## Arguments

    | Argument      | Meaning                                                                  |
    |---------------|--------------------------------------------------------------------------|
    | profile       | ``ModelProfile`` of the workload (must include ``keep``: the baseline)   |
    | budget_bytes  | the memory budget (peak bytes of the whole step), a (low, high) range in |
    |               | bytes, a ``BudgetShare`` of the reachable range, or None: all of it      |
    | reward_mode   | ``model`` or ``measured`` (str or str-valued Enum)                       |
    | evaluator     | ``f(profile action indices) -> (peak_bytes, step_seconds)``; needed by   |
    |               | ``measured``                                                             |
    | actions       | the enabled subset of ``profile.actions`` (default: all)                 |
    | on_plan       | ``f(plan_indices, info)`` called at every episode end                    |

    ``gymnasium.make("CkptSearch-v2", profile=prof, budget_bytes=b)``.

    ## Version History

    * v2: ``chain`` (regions of units recomputed at once) where the profile has it; masks and
      peaks follow the open region. ``block`` (a parent module recomputed whole) where the profile
      has spans; a profile without them gives the same episodes as before.
    * v1: budget ranges drawn per episode; observations relative to the model and the budget
      (efficiency rank, peaks after each action, slack in units of what is still savable,
      one-unit lookahead, budget's place and its Fourier code, extra seconds so far); time
      features follow the measured corrections; the ``hybrid`` mode left to the driver
      (``model`` plus ``add_measurements``).
    * v0: initial version.
    """

    metadata: dict[str, Any] = {"render_modes": [], "deterministic_reward_modes": ("model",)}

    def __init__(self, profile: ModelProfile, budget_bytes: Budget, reward_mode: str | Enum = "model",
                 evaluator: Evaluator | None = None, actions: Sequence[Action] | None = None,
                 on_plan: PlanCallback | None = None, render_mode: str | None = None) -> None:
        mode = reward_mode_name(reward_mode)
        check_env_args(profile, mode, evaluator is not None, actions)
        self._budget_arg = parse_budget(budget_bytes)
        self.profile, self.reward_mode = profile, mode
        self.evaluator, self.on_plan, self.render_mode = evaluator, on_plan, render_mode
        self.cost_model = cm = CostModel(profile)
        self.enabled = list(actions) if actions is not None else list(profile.actions)
        self._act = [profile.actions.index(a) for a in self.enabled]  # enabled k -> profile index
        self.n_units = n = cm.n_units
        self._keep = keep = profile.actions.index(Action.KEEP)
        self._keep_k = self._act.index(keep) if keep in self._act else 0  # what 'chunked' off the loss unit becomes
        self._features = Features(profile, cm, self._act, keep)
        self.baseline_peak, self.baseline_seconds = self._features.baseline_peak, cm.step_seconds([keep] * n)
        secs = cm.seconds.tolist()
        slowest = cm.fixed_seconds + sum(max(secs[i][a] for a in self._act) for i in range(n))
        self.time_cap = 1.5 * slowest / self.baseline_seconds
        self._names = [a.value for a in profile.actions]  # Enum.value is slow in the step path
        self.lowest_reachable = self._features.lowest_reachable
        n_act = len(self._act)
        self.action_space = spaces.Discrete(n_act)
        self.observation_space = spaces.Box(-OBS_BOUND, OBS_BOUND, shape=((N_UNIT_OBS + 1) * n_act + N_GLOBAL_OBS,),
                                            dtype=np.float32)
        # measured plans, and the cost model corrected by them (measured mode, add_measurements)
        self.correction = MeasuredCorrection(cm)
        self._features.refresh_times(self.correction.corrected_model())
        self.budget_bytes = self.budget_range[0]  # this episode's budget (reset draws it from the range)
        self._reset_walk()

    @property
    def enabled_indices(self) -> list[int]:
        """The profile action index of each enabled action, in the env's action order."""
        return list(self._act)

    @property
    def budget_range(self) -> tuple[int, int]:
        """(low, high) bytes the episodes' budgets are drawn from; for a ``BudgetShare`` (None: the
        whole range), between the lowest reachable peak and the baseline's, both scaled by the
        measured/predicted peak ratio."""
        if not isinstance(self._budget_arg, BudgetShare):
            return self._budget_arg
        ratio, share = self.correction.peak_ratio, self._budget_arg
        low, span = self.lowest_reachable * ratio, (self.baseline_peak - self.lowest_reachable) * ratio
        return max(1, round(low + share.low * span)), max(1, round(low + share.high * span))

    # -- the walk ---------------------------------------------------------------------------

    def _reset_walk(self) -> None:
        self._code = budget_code(self._budget_place)
        self._walk = Walk(self._features.walk.initial(), len(self._act))
        self._walk.lows, self._walk.keeps = self._features.peaks_after(self._walk)

    def _obs(self) -> np.ndarray:
        return self._features.observe(self._walk, self.budget_bytes, self._budget_place, self._code, self.correction)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if options and "budget_bytes" in options:
            budget = int(options["budget_bytes"])
            if budget <= 0:
                raise ValueError(f"options budget_bytes={budget} must be a positive number of bytes")
            self.budget_bytes = budget
        else:
            low, high = self.budget_range
            self.budget_bytes = low if low == high else int(self.np_random.integers(low, high, endpoint=True))
        self._reset_walk()
        return self._obs(), {"budget_bytes": self.budget_bytes}

    @property
    def _budget_place(self) -> float:
        """The budget between the lowest reachable peak (0) and the baseline's (1)."""
        ratio = self.correction.peak_ratio
        span = max(1.0, (self.baseline_peak - self.lowest_reachable) * ratio)
        return (self.budget_bytes - self.lowest_reachable * ratio) / span

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict]:
        a, walk = int(action), self._walk
        if not 0 <= a < len(self._act):
            raise ValueError(f"action {action} is not in 0..{len(self._act) - 1} "
                             f"({', '.join(x.value for x in self.enabled)})")
        if walk.i >= self.n_units:
            raise RuntimeError("step() after the episode ended; call reset() first")
        after = self._features.walk.step(walk.i, a, walk.state)
        if after[:2] == (None, None):  # a chain that continues no region starts one; inside a block span the unit
            w = self._features.walk  # is block; block or chunked anywhere else keeps (Action Space)
            a = w.k_block if walk.state[2] > walk.i else w.k_rec if a == w.k_chain else self._keep_k
            after = w.step(walk.i, a, walk.state)
        walk.state = after
        walk.extra_seconds += self._features.extra[walk.i][a]
        walk.plan.append(a)
        walk.counts[a] += 1
        walk.i += 1
        walk.lows, walk.keeps = self._features.peaks_after(walk)
        if walk.i < self.n_units:
            return self._obs(), 0.0, False, False, {}
        reward, info = self._finish()
        return self._obs(), reward, True, False, info

    def action_masks(self) -> np.ndarray:
        """Boolean (A,): actions after which some completion still fits the budget."""
        if self._walk.i >= self.n_units:
            return np.ones(len(self._act), dtype=bool)
        lows, scaled = self._walk.lows, self.correction.scaled_peak
        allowed = [scaled(low) <= self.budget_bytes for low in lows]  # as the reward prices the plan
        if not any(allowed):
            allowed[lows.index(min(lows))] = True
        return np.array(allowed, dtype=bool)

    # -- the reward -------------------------------------------------------------------------

    def _finish(self) -> tuple[float, dict]:
        plan = [self._act[k] for k in self._walk.plan]
        peak, seconds, measured = self._evaluate(plan)
        baseline = self.correction.baseline  # (peak, seconds) measured, once the baseline is
        base_seconds = baseline[1] if baseline else self.baseline_seconds
        base_peak = baseline[0] if baseline else self.baseline_peak
        feasible = peak <= self.budget_bytes
        if feasible:
            reward = -min(seconds / base_seconds, self.time_cap)
        else:
            reward = -self.time_cap - 1.0 - (peak - self.budget_bytes) / base_peak
        info = {"plan": [self._names[a] for a in plan], "plan_indices": plan,
                "peak_bytes": int(peak), "step_seconds": float(seconds), "measured": measured,
                "feasible": feasible, "budget_bytes": self.budget_bytes, "reward": float(reward),
                "reward_mode": self.reward_mode}
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
        if self.correction.baseline is None:
            self._measure([self._keep] * self.n_units)
        return self._measure(plan) + (True,)

    def add_measurements(self, measurements: Sequence[tuple[Sequence[int], int, float]]) -> int:
        """Plans measured by the caller, as (profile action indices, peak_bytes, step_seconds);
        returns how many were new.

        They are answered by their measurement from now on, and correct every prediction
        (``self.correction``): the search's hybrid reward, where the driver measures between
        training chunks so that measuring never shares the CPU with training. The all-``keep``
        plan among them becomes the baseline of the time ratio.
        """
        new = sum(self.correction.add(tuple(int(a) for a in plan), int(peak), float(seconds))
                  for plan, peak, seconds in measurements)
        if new:
            self._features.refresh_times(self.correction.corrected_model())
        return new

    def _measure(self, plan: list[int]) -> tuple[int, float]:
        """Measure a plan once (cached), and correct the cost model with it."""
        key = tuple(plan)
        if key in self.correction.measured:
            return self.correction.measured[key]
        assert self.evaluator is not None  # checked in __init__ for this mode
        peak, seconds = self.evaluator(list(plan))
        self.correction.add(key, int(peak), float(seconds))
        self._features.refresh_times(self.correction.corrected_model())
        return int(peak), float(seconds)

"""The Gymnasium environment: pick each unit's checkpoint action in turn, under a memory budget.

An episode is one plan. The reward is the plan's step time relative to the all-``keep``
baseline when its peak memory fits the episode's budget, and a penalty below every feasible
reward when it does not. Peak and time come from the cost model (``model``; corrected by the
measured plans given to ``add_measurements``) or from real measurements (``measured``). An env
holds one budget or a range of budgets, one drawn per episode, so that one policy conditioned
on the budget can learn the whole memory/time frontier.

Besides the env, this file holds the peak-memory walk in the max-plus form the env and the
exact solver (``agents.exact``) both carry unit by unit. The cost model's walk
(``env.cost.cost_model``) is::

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

import bisect
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from env.cost.correction import MeasuredCorrection
from env.cost.cost_model import CostModel
from env.cost.peak_walk import advance, initial_state, lowest_peak, suffix_functionals, unit_terms
from env.data.model_profile import ModelProfile
from env.data.plan import Action

Evaluator = Callable[[list[int]], tuple[int, float]]  # profile action indices -> (peak_bytes, step_seconds)
PlanCallback = Callable[[list[int], dict], None]
REWARD_MODES = ("model", "measured")
OBS_BOUND = 1e6  # observations are ratios of order 1; clipped here so the Box is finite
N_UNIT_OBS = 10  # observations per enabled action
N_FOURIER = 8  # sin and cos of the budget's place at frequencies 1, 2, 4, .. 2^(N_FOURIER-1) half-turns
N_GLOBAL_OBS = 8 + 2 * N_FOURIER  # observations after the per-action ones and the action counts
SLACK_BOUND = 4.0  # slack features are clipped to +-this: past it, only the sign matters


@dataclass(frozen=True)
class BudgetShare:
    """Budgets as shares of the reachable range: 0 is the lowest reachable peak, 1 the all-keep
    baseline's (in measured bytes once plans are measured: both scale with the mean measured/
    predicted peak ratio). ``BudgetShare(0.5, 1.0)``: the upper half of the frontier."""

    low: float = 0.0
    high: float = 1.0


Budget = int | tuple[int, int] | BudgetShare | None  # one budget, a (low, high) range in bytes, a share, or all


def reward_mode_name(mode: str | Enum) -> str:
    """``model`` or ``measured`` from a str or a str-valued Enum member; a clear error otherwise."""
    name = mode.value if isinstance(mode, Enum) else mode
    if name not in REWARD_MODES:
        raise ValueError(f"reward_mode {name!r} is not one of {', '.join(REWARD_MODES)}; pick one (the search's "
                         "hybrid reward is 'model' plus measurements given to add_measurements)")
    return str(name)


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

    ``action_masks()`` (for ``sb3_contrib.MaskablePPO``) allows an action only if some
    completion of the plan still fits the budget on the cost model (exact, see the module
    docstring; scaled by the mean measured/predicted peak ratio once plans are measured). If no
    action fits, it allows the one whose best completion peaks lowest, so the mask is never all
    false.

    ## Observation Space

    ``Box(-1e6, 1e6, (11A + 24,), float32)`` (values clipped to the bounds). Every entry is a
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

    Peaks are scaled by the mean measured/predicted peak ratio. After the last unit the unit
    features are 0 and the peaks are the plan's own.

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

    ``gymnasium.make("CkptSearch-v1", profile=prof, budget_bytes=b)``.

    ## Version History

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
        self._budget_arg = self._check_args(profile, budget_bytes, mode, evaluator, actions)
        self.profile, self.reward_mode = profile, mode
        self.evaluator, self.on_plan, self.render_mode = evaluator, on_plan, render_mode
        self.cost_model = cm = CostModel(profile)
        self.enabled = list(actions) if actions is not None else list(profile.actions)
        self._act = [profile.actions.index(a) for a in self.enabled]  # enabled k -> profile index
        n = cm.n_units
        self.n_units = n
        keep = profile.actions.index(Action.KEEP)
        self.baseline_peak, self.baseline_seconds = cm.peak_bytes([keep] * n), cm.step_seconds([keep] * n)
        secs = cm.seconds.tolist()
        slowest = cm.fixed_seconds + sum(max(secs[i][a] for a in self._act) for i in range(n))
        self.time_cap = 1.5 * slowest / self.baseline_seconds
        self._names = [a.value for a in profile.actions]  # Enum.value is slow in the step path
        self._terms = unit_terms(cm, self._act)
        self._suffix = suffix_functionals(profile, self._terms)
        self._keep_suffix = suffix_functionals(profile, unit_terms(cm, [keep]))  # one functional each
        self.lowest_reachable = lowest_peak(initial_state(profile), self._suffix[0])
        self._keep = keep
        self._act_bytes = max(1, self.baseline_peak - profile.base_bytes)
        self._saved = self._single_savings(profile, cm, keep)
        n_act = len(self._act)
        self.action_space = spaces.Discrete(n_act)
        self.observation_space = spaces.Box(-OBS_BOUND, OBS_BOUND, shape=((N_UNIT_OBS + 1) * n_act + N_GLOBAL_OBS,),
                                            dtype=np.float32)
        # measured plans, and the cost model corrected by them (measured mode, add_measurements)
        self.correction = MeasuredCorrection(cm)
        self._time_features()
        self.budget_bytes = self.budget_range[0]  # this episode's budget (reset draws it from the range)
        self._reset_walk()

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

    @staticmethod
    def _check_args(profile: ModelProfile, budget_bytes: Budget, reward_mode: str, evaluator: Evaluator | None,
                    actions: Sequence[Action] | None) -> tuple[int, int] | BudgetShare:
        if reward_mode != "model" and evaluator is None:
            raise ValueError(f"reward_mode '{reward_mode}' needs an evaluator (plan indices -> (peak_bytes, "
                             "step_seconds)); pass evaluator= or use reward_mode='model'")
        if budget_bytes is None or isinstance(budget_bytes, BudgetShare):
            budget_range: tuple[int, int] | BudgetShare = budget_bytes or BudgetShare()
            if not 0.0 <= budget_range.low <= budget_range.high <= 1.0:
                raise ValueError(f"budget_bytes={budget_bytes} must have 0 <= low <= high <= 1 (0: the lowest "
                                 "reachable peak, 1: the baseline's)")
        else:
            low, high = (budget_bytes, budget_bytes) if np.isscalar(budget_bytes) else tuple(budget_bytes)  # type: ignore[arg-type]
            if int(low) <= 0 or int(high) < int(low):
                raise ValueError(f"budget_bytes={budget_bytes} must be a positive number of bytes, a (low, high) "
                                 "range with 0 < low <= high, a BudgetShare, or None for the whole reachable range")
            budget_range = (int(low), int(high))
        if Action.KEEP not in profile.actions:
            raise ValueError("the profile has no 'keep' action, which the baseline needs; profile with keep")
        if actions is not None:
            missing = [a for a in actions if a not in profile.actions]
            if missing or not actions or len(set(actions)) != len(actions):
                raise ValueError(f"actions {[str(a) for a in actions]} must be distinct and among the "
                                 f"profiled {', '.join(a.value for a in profile.actions)}; choose from those")
        return budget_range

    def _single_savings(self, profile: ModelProfile, cm: CostModel, keep: int) -> list[list[int]]:
        """saved[j][k]: bytes the all-keep peak drops by when unit j alone takes enabled action k."""
        keep_terms = unit_terms(cm, [keep])
        state, saved = initial_state(profile), []
        for j in range(self.n_units):
            nxt = self._keep_suffix[j + 1]
            saved.append([self.baseline_peak - lowest_peak(advance(state, t), nxt) for t in self._terms[j]])
            state = advance(state, keep_terms[j][0])
        return saved

    def _time_features(self) -> None:
        """The features that depend on step times, from the cost model corrected by the measured
        plans (the profile's own times until the baseline is measured): each action's extra
        seconds over keeping, the units' efficiency ranks, and the lookahead's price lists."""
        cm, keep, n = self.correction.corrected_model(), self._keep, self.n_units
        secs = cm.seconds.tolist()
        self._base_seconds = cm.step_seconds([keep] * n)
        self._extra = [[secs[i][a] - secs[i][keep] for a in self._act] for i in range(n)]
        self._unit_obs = self._unit_features(cm)
        # later[j]: the single changes among units j..n-1 as (saved bytes ascending, and the
        # cheapest extra seconds of any change saving at least that many bytes)
        self._later: list[tuple[list[int], list[float]]] = [([], [])] * (n + 1)
        saved, extra = np.zeros(0, dtype=np.int64), np.zeros(0)
        for j in range(n - 1, -1, -1):
            saved = np.concatenate([np.array(self._saved[j], dtype=np.int64), saved])
            extra = np.concatenate([np.array(self._extra[j]), extra])
            order = np.argsort(saved, kind="stable")
            cheapest = np.minimum.accumulate(extra[order][::-1])[::-1]
            self._later[j] = (saved[order].tolist(), cheapest.tolist())

    def _unit_features(self, cm: CostModel) -> list[list[float]]:
        """Per unit, the budget-free part of its observation: 4 numbers per enabled action, the
        others (peaks after the action, lookahead) filled in per step; zeros after the last unit."""
        n, act_bytes, keep = self.n_units, self._act_bytes, self._keep
        kept, rise = cm.f_delta.tolist(), cm.b_rise.tolist()
        ranks = []
        for k, a in enumerate(self._act):  # bytes saved per extra second, ranked over the units
            saved = np.array([kept[i][keep] - kept[i][a] for i in range(n)], dtype=float)
            extra = np.array([max(self._extra[i][k], 1e-9) for i in range(n)])
            score = np.where(saved > 0, saved / extra, -np.inf)
            order = np.argsort(np.argsort(score, kind="stable"), kind="stable")
            ranks.append(np.where(saved > 0, (order + 1) / n, 0.0))
        rows = []
        for i in range(n):
            row = []
            for k, a in enumerate(self._act):
                row += [kept[i][a] / act_bytes, rise[i][a] / act_bytes, self._extra[i][k] / self._base_seconds,
                        float(ranks[k][i])] + [0.0] * (N_UNIT_OBS - 4)
            rows.append([min(max(v, -OBS_BOUND), OBS_BOUND) for v in row])
        return rows + [[0.0] * (N_UNIT_OBS * len(self._act))]

    def _cheapest_later(self, need_bytes: float) -> float:
        """Fewest extra seconds of one change among the units after the current one that saves
        ``need_bytes`` of the all-keep peak (0 if nothing is needed; inf if no single change does)."""
        saved, cheapest = self._later[self._i + 1]
        best = 0.0 if need_bytes <= 0 else float("inf")
        at = bisect.bisect_left(saved, need_bytes)
        return min(best, cheapest[at]) if at < len(saved) else best

    # -- the walk ---------------------------------------------------------------------------

    def _reset_walk(self) -> None:
        place = self._budget_place
        self._budget_code = [f(math.pi * 2**j * place) for j in range(N_FOURIER) for f in (math.sin, math.cos)]
        self._i = 0
        self._plan: list[int] = []  # enabled-action indices
        self._counts = [0] * len(self._act)
        self._extra_seconds = 0.0
        self._state = initial_state(self.profile)
        self._lows, self._keeps = self._peaks_after()

    def _peaks_after(self) -> tuple[list[int], list[int]]:
        """After each enabled action at the current unit: the lowest peak any completion reaches,
        and the peak if every later unit keeps."""
        if self._i >= self.n_units:
            return [], []
        nxt, keep = self._suffix[self._i + 1], self._keep_suffix[self._i + 1]
        states = [advance(self._state, t) for t in self._terms[self._i]]
        return [lowest_peak(s, nxt) for s in states], [lowest_peak(s, keep) for s in states]

    @property
    def _measured_baseline(self) -> tuple[int, float] | None:
        return self.correction.baseline

    def _obs(self) -> np.ndarray:
        i, inv_n = self._i, 1.0 / self.n_units
        ratio, scaled = self.correction.peak_ratio, self.correction.scaled_peak
        per_budget = ratio / self.budget_bytes
        limit = self.budget_bytes / ratio  # the budget in the cost model's bytes
        low_here = lowest_peak(self._state, self._suffix[i])
        all_keep = lowest_peak(self._state, self._keep_suffix[i])
        per_savable = 1.0 / max(all_keep - low_here, 1e-3 * self._act_bytes, 1.0)
        unit = list(self._unit_obs[i])
        for k, (low, keeps) in enumerate(zip(self._lows, self._keeps)):
            unit[N_UNIT_OBS * k + 4] = min(low * per_budget, OBS_BOUND)
            unit[N_UNIT_OBS * k + 5] = _clip((low - limit) * per_savable)
            unit[N_UNIT_OBS * k + 6] = _clip((keeps - limit) * per_savable)
            unit[N_UNIT_OBS * k + 7] = 1.0 if scaled(keeps) <= self.budget_bytes else 0.0  # as the masks judge it
        if self._i < self.n_units:
            prices = [self._extra[i][k] + self._cheapest_later(keeps - limit) for k, keeps in enumerate(self._keeps)]
            best = min(prices)
            first = prices.index(best)
            for k, price in enumerate(prices):
                unit[N_UNIT_OBS * k + 8] = 1.0 if k == first else 0.0
                gap = 0.0 if price == best else (price - best) / (1e-3 * self._base_seconds)  # inf - inf: equal
                unit[N_UNIT_OBS * k + 9] = min(gap, SLACK_BOUND)
        obs = unit + [i * inv_n] + [c * inv_n for c in self._counts]
        # the only features a tiny budget can blow up
        obs += [min(self._state[1] * per_budget, OBS_BOUND), min(low_here * per_budget, OBS_BOUND),
                min(all_keep * per_budget, OBS_BOUND), min(self.budget_bytes / (self.baseline_peak * ratio), OBS_BOUND),
                min(max(self._budget_place, -OBS_BOUND), OBS_BOUND),
                self._extra_seconds / self._base_seconds, _clip((all_keep - limit) * per_savable)]
        obs += self._budget_code
        return np.array(obs, dtype=np.float32)

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
        a = int(action)
        if not 0 <= a < len(self._act):
            raise ValueError(f"action {action} is not in 0..{len(self._act) - 1} "
                             f"({', '.join(x.value for x in self.enabled)})")
        if self._i >= self.n_units:
            raise RuntimeError("step() after the episode ended; call reset() first")
        self._state = advance(self._state, self._terms[self._i][a])
        self._extra_seconds += self._extra[self._i][a]
        self._plan.append(a)
        self._counts[a] += 1
        self._i += 1
        self._lows, self._keeps = self._peaks_after()
        if self._i < self.n_units:
            return self._obs(), 0.0, False, False, {}
        reward, info = self._finish()
        return self._obs(), reward, True, False, info

    def action_masks(self) -> np.ndarray:
        """Boolean (A,): actions after which some completion still fits the budget."""
        if self._i >= self.n_units:
            return np.ones(len(self._act), dtype=bool)
        lows, scaled = self._lows, self.correction.scaled_peak
        allowed = [scaled(low) <= self.budget_bytes for low in lows]  # as the reward prices the plan
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
        if self._measured_baseline is None:
            self._measure([self.profile.actions.index(Action.KEEP)] * self.n_units)
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
            self._time_features()
        return new

    def _measure(self, plan: list[int]) -> tuple[int, float]:
        """Measure a plan once (cached), and correct the cost model with it."""
        key = tuple(plan)
        if key in self.correction.measured:
            return self.correction.measured[key]
        assert self.evaluator is not None  # checked in __init__ for this mode
        peak, seconds = self.evaluator(list(plan))
        self.correction.add(key, int(peak), float(seconds))
        self._time_features()
        return int(peak), float(seconds)


def _clip(x: float) -> float:
    return min(max(x, -SLACK_BOUND), SLACK_BOUND)

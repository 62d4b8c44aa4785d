"""What ``CheckpointEnv`` observes: the features of the current unit's actions and of the plan so far.

``Features`` is built once per profile and enabled actions (the peak walk, chains included, with
its suffixes' functionals, and each unit's single-change savings) and refreshed whenever measurements
correct the step times (extra seconds, efficiency ranks, the lookahead's price lists). ``Walk``
is one episode's state. The table of what each entry means is ``CheckpointEnv``'s docstring.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from env.cost.correction import MeasuredCorrection
from env.cost.cost_model import CostModel
from env.cost.peak_walk import PeakWalk, States, advance, initial_state, lowest_peak, suffix_functionals, unit_terms
from env.data.model_profile import ModelProfile

OBS_BOUND = 1e6  # observations are ratios of order 1; clipped here so the Box is finite
N_UNIT_OBS = 10  # observations per enabled action
N_FOURIER = 8  # sin and cos of the budget's place at frequencies 1, 2, 4, .. 2^(N_FOURIER-1) half-turns
N_GLOBAL_OBS = 10 + 2 * N_FOURIER  # observations after the per-action ones and the action counts
SLACK_BOUND = 4.0  # slack features are clipped to +-this: past it, only the sign matters
UNREACHABLE = 2**62  # the peak after an action that cannot follow (a chain that continues no region): never fits


def _clip(x: float) -> float:
    return min(max(x, -SLACK_BOUND), SLACK_BOUND)


def budget_code(place: float) -> list[float]:
    """sin, cos of pi 2^j x for the budget's place x, j = 0 .. N_FOURIER-1."""
    return [f(math.pi * 2**j * place) for j in range(N_FOURIER) for f in (math.sin, math.cos)]


@dataclass
class Walk:
    """One episode so far: the unit to decide, the plan (enabled-action indices), the peak walk's states
    (closed, and open while a region may continue: ``env.cost.peak_walk``), and after each enabled
    action at the current unit the lowest reachable peak and the all-keep peak (``UNREACHABLE``
    after an action that cannot follow)."""

    state: States
    n_actions: int
    i: int = 0
    plan: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    extra_seconds: float = 0.0
    lows: list[int] = field(default_factory=list)
    keeps: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * self.n_actions


class Features:
    """The profile's per-unit terms and the observation built from them (see ``CheckpointEnv``)."""

    def __init__(self, profile: ModelProfile, cm: CostModel, act: list[int], keep: int) -> None:
        n = cm.n_units
        self.profile, self.n_units, self.act, self.keep = profile, n, act, keep
        self.baseline_peak = cm.peak_bytes([keep] * n)
        self.walk = PeakWalk(cm, act)
        self.terms = self.walk.terms
        self.keep_suffix = suffix_functionals(profile, unit_terms(cm, [keep]))  # one functional each
        low = self.walk.lowest(0, self.walk.initial())
        assert low is not None, "the enabled actions always complete a plan from the start"
        self.lowest_reachable = low
        self.act_bytes = max(1, self.baseline_peak - profile.base_bytes)
        self.saved = self._single_savings(cm)

    def _single_savings(self, cm: CostModel) -> list[list[int]]:
        """saved[j][k]: bytes the all-keep peak drops by when unit j alone takes enabled action k (0
        for a chain, which cannot follow a kept unit, and a block, which no unit takes alone)."""
        keep_terms = unit_terms(cm, [self.keep])
        state, saved = initial_state(self.profile), []
        for j in range(self.n_units):
            nxt = self.keep_suffix[j + 1]
            saved.append([0 if k in (self.walk.k_chain, self.walk.k_block) else self.baseline_peak - lowest_peak(advance(state, t), nxt)
                          for k, t in enumerate(self.terms[j])])
            state = advance(state, keep_terms[j][0])
        return saved

    def refresh_times(self, cm: CostModel) -> None:
        """The features that depend on step times, from ``cm`` (the cost model corrected by the measured
        plans): each action's extra seconds over keeping, the units' efficiency ranks, and the
        lookahead's price lists."""
        keep, n = self.keep, self.n_units
        secs = cm.seconds.tolist()
        self.base_seconds = cm.step_seconds([keep] * n)
        self.extra = [[secs[i][a] - secs[i][keep] for a in self.act] for i in range(n)]
        self.unit_obs = self._unit_features(cm)
        # later[j]: the single changes among units j..n-1 as (saved bytes ascending, and the
        # cheapest extra seconds of any change saving at least that many bytes)
        self.later: list[tuple[list[int], list[float]]] = [([], [])] * (n + 1)
        saved, extra = np.zeros(0, dtype=np.int64), np.zeros(0)
        for j in range(n - 1, -1, -1):
            saved = np.concatenate([np.array(self.saved[j], dtype=np.int64), saved])
            extra = np.concatenate([np.array(self.extra[j]), extra])
            order = np.argsort(saved, kind="stable")
            cheapest = np.minimum.accumulate(extra[order][::-1])[::-1]
            self.later[j] = (saved[order].tolist(), cheapest.tolist())

    def _unit_features(self, cm: CostModel) -> list[list[float]]:
        """Per unit, the budget-free part of its observation: 4 numbers per enabled action, the
        others (peaks after the action, lookahead) filled in per step; zeros after the last unit."""
        n, act_bytes, keep = self.n_units, self.act_bytes, self.keep
        kept, rise = cm.f_delta.tolist(), cm.b_rise.tolist()
        ranks = []
        for k, a in enumerate(self.act):  # bytes saved per extra second, ranked over the units
            saved = np.array([kept[i][keep] - kept[i][a] for i in range(n)], dtype=float)
            extra = np.array([max(self.extra[i][k], 1e-9) for i in range(n)])
            score = np.where(saved > 0, saved / extra, -np.inf)
            order = np.argsort(np.argsort(score, kind="stable"), kind="stable")
            ranks.append(np.where(saved > 0, (order + 1) / n, 0.0))
        rows = []
        for i in range(n):
            row = []
            for k, a in enumerate(self.act):
                row += [kept[i][a] / act_bytes, rise[i][a] / act_bytes, self.extra[i][k] / self.base_seconds,
                        float(ranks[k][i])] + [0.0] * (N_UNIT_OBS - 4)
            rows.append([min(max(v, -OBS_BOUND), OBS_BOUND) for v in row])
        return rows + [[0.0] * (N_UNIT_OBS * len(self.act))]

    def peaks_after(self, walk: Walk) -> tuple[list[int], list[int]]:
        """After each enabled action at the walk's unit: the lowest peak any completion reaches, and
        the peak if every later unit keeps (``UNREACHABLE`` for an action that cannot follow)."""
        i = walk.i
        if i >= self.n_units:
            return [], []
        lows, keeps, keep = [], [], self.keep_suffix[i + 1]
        for k in range(len(self.act)):
            after = self.walk.step(i, k, walk.state)
            low = self.walk.lowest(i + 1, after)
            lows.append(UNREACHABLE if low is None else low)
            keeps.append(UNREACHABLE if after[0] is None else lowest_peak(after[0], keep))
        return lows, keeps

    def _cheapest_later(self, i: int, need_bytes: float) -> float:
        """Fewest extra seconds of one change among the units after unit ``i`` that saves ``need_bytes``
        of the all-keep peak (0 if nothing is needed; inf if no single change does)."""
        saved, cheapest = self.later[i + 1]
        best = 0.0 if need_bytes <= 0 else float("inf")
        at = bisect.bisect_left(saved, need_bytes)
        return min(best, cheapest[at]) if at < len(saved) else best

    def observe(self, walk: Walk, budget_bytes: int, place: float, code: list[float],
                correction: MeasuredCorrection) -> np.ndarray:
        """The observation at the walk's unit for this episode's budget (its ``place`` in the reachable
        range and that place's Fourier ``code``)."""
        i, inv_n = walk.i, 1.0 / self.n_units
        ratio, scaled = correction.peak_ratio, correction.scaled_peak
        per_budget = ratio / budget_bytes
        limit = budget_bytes / ratio  # the budget in the cost model's bytes
        closed = walk.state[0]
        assert closed is not None, "every action the env takes leaves a closed state"
        low_here = self.walk.lowest(i, walk.state)
        assert low_here is not None, "the walk only takes actions after which a plan completes"
        all_keep = lowest_peak(closed, self.keep_suffix[i])
        per_savable = 1.0 / max(all_keep - low_here, 1e-3 * self.act_bytes, 1.0)
        unit = list(self.unit_obs[i])
        for k, (low, keeps) in enumerate(zip(walk.lows, walk.keeps)):
            if low == UNREACHABLE:  # as far over the budget as a slack reads; 1e6 would swamp a policy's inputs
                unit[N_UNIT_OBS * k + 4: N_UNIT_OBS * k + 8] = [SLACK_BOUND, SLACK_BOUND, SLACK_BOUND, 0.0]
                continue
            unit[N_UNIT_OBS * k + 4] = min(low * per_budget, OBS_BOUND)
            unit[N_UNIT_OBS * k + 5] = _clip((low - limit) * per_savable)
            unit[N_UNIT_OBS * k + 6] = _clip((keeps - limit) * per_savable)
            unit[N_UNIT_OBS * k + 7] = 1.0 if scaled(keeps) <= budget_bytes else 0.0  # as the masks judge it
        if i < self.n_units:
            prices = [self.extra[i][k] + self._cheapest_later(i, keeps - limit) for k, keeps in enumerate(walk.keeps)]
            best = min(prices)
            first = prices.index(best)
            for k, price in enumerate(prices):
                unit[N_UNIT_OBS * k + 8] = 1.0 if k == first else 0.0
                gap = 0.0 if price == best else (price - best) / (1e-3 * self.base_seconds)  # inf - inf: equal
                unit[N_UNIT_OBS * k + 9] = min(gap, SLACK_BOUND)
        obs = unit + [i * inv_n] + [c * inv_n for c in walk.counts]
        # the only features a tiny budget can blow up
        obs += [min(closed[1] * per_budget, OBS_BOUND), min(low_here * per_budget, OBS_BOUND),
                min(all_keep * per_budget, OBS_BOUND), min(budget_bytes / (self.baseline_peak * ratio), OBS_BOUND),
                min(max(place, -OBS_BOUND), OBS_BOUND),
                walk.extra_seconds / self.base_seconds, _clip((all_keep - limit) * per_savable)]
        obs += code
        opened = walk.state[1] if i < self.n_units and self.walk.may_chain[i] else None
        obs += [0.0, 0.0] if opened is None else [1.0, min((opened[2] - opened[1]) / self.act_bytes, OBS_BOUND)]
        return np.array(obs, dtype=np.float32)

"""The cost model corrected by measured plans: what the hybrid reward and the search's choice of
what to measure next believe about plans not measured yet.

- Peak: the prediction times the mean measured/predicted ratio (the cost model's peak is
  exact or within a few percent; one factor is enough).
- Time, once the all-keep baseline is measured: that measurement plus, per unit, the extra
  seconds its action adds over keeping it. The cost model's step time is such a sum already
  (``fixed + sum_i seconds[i][a_i]``), but its per-unit extras can be off by more than the gap
  between neighbouring frontier plans (e.g. recomputing a model's first blocks measured 10%
  cheaper than profiled). So the extras are fitted to the measured plans by ridge regression,
  pulled towards the profile's extras scaled by their least-squares slope: with few
  measurements the correction is that slope alone, with many it learns each unit's cost. The
  pull is the prior of a Bayesian fit: a measured step time errs by ``TIME_NOISE`` of the
  baseline's, a unit's extra lies within ``EXTRA_SPREAD`` of the scaled profile's, so a small
  extra needs many plans to move it and timing noise cannot (a fixed pull let 2% noise cost the
  corrected frontier 0.9% of its hypervolume at 48 units, this one 0.3%: simulated on the recorded
  48-unit gpt profile, ``bench/profiles``); no
  extra is fitted below a tenth of the profile's (recomputing never makes a step faster, noise
  can make it look so). A
  plan predicted slower than the baseline never looks faster than the measured baseline
  through a global factor, which a plain measured/predicted ratio did under timing noise.
- Before any measurement: the cost model's own prediction.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from env.cost.cost_model import CostModel
from env.data.plan import Action

Plan = tuple[int, ...]


FLOOR_SHARE = 0.1
"""No action's fitted extra time over keeping a unit falls below this share of the profile's
(scaled) extra. Recomputing, offloading or selectively recomputing a unit adds work to the step.
Unbounded, timing noise fitted negative extras (22 of 144 on a 48-unit search with 30 measured
plans): the corrected model priced plans that recompute those units faster than the baseline,
the exact solver on it left the all-keep plan off its frontier, and no agent proposed it; at
exactly zero, such a plan ties the baseline's time at less memory and still pushes it off."""


TIME_NOISE = 0.02
"""A measured plan's step time (a median of a few steps) errs by about this share of the baseline's
on these CPUs (the quotes' median spread of six samples is 2-5%)."""

EXTRA_SPREAD = 0.5
"""A unit's true extra time under an action lies within about this share of the profile's extra,
scaled by the measured slope: how far one measurement may move it."""


class MeasuredCorrection:
    """``add`` measured plans (profile action indices); ``predict`` any plan's (peak, seconds)."""

    def __init__(self, cost_model: CostModel, noise: float = TIME_NOISE, spread: float = EXTRA_SPREAD) -> None:
        self.cm, self.noise, self.spread = cost_model, float(noise), float(spread)
        n, n_actions = cost_model.n_units, len(cost_model.profile.actions)
        self.keep = cost_model.action_index(Action.KEEP)
        self.keep_plan: Plan = (self.keep,) * n
        self.pred_base_seconds = cost_model.step_seconds(list(self.keep_plan))
        # the profile's extra seconds of unit i under action a over keeping it, at least zero (n, A): the
        # prior's shape (recomputing never makes a step faster; a profile can time it so)
        self.pred_extra = np.maximum(cost_model.seconds - cost_model.seconds[:, [self.keep]], 0.0)
        self._cols = [(i, a) for i in range(n) for a in range(n_actions) if a != self.keep]
        self._col = {c: k for k, c in enumerate(self._cols)}
        # the columns whose action the profile timed no slower than keeping the unit (``_widths``)
        self._unknown = np.array([self.pred_extra[i, a] <= 0 for i, a in self._cols], dtype=bool)
        self._col_action = np.array([a for _, a in self._cols], dtype=int)
        self.measured: dict[Plan, tuple[int, float]] = {}
        self._peak_ratio_sum = 0.0  # of measured/predicted peaks: peak_ratio is read per action by the env's masks
        # fitted per-unit extras (n x A, python lists: faster to index on the hot path than numpy),
        # or a time ratio before the baseline is measured; None when a measurement made it stale
        self._time_fit: list[list[float]] | float | None = None

    @property
    def baseline(self) -> tuple[int, float] | None:
        """The measured all-keep plan, (peak_bytes, step_seconds)."""
        return self.measured.get(self.keep_plan)

    @property
    def peak_ratio(self) -> float:
        """Mean measured/predicted peak; 1 before any measurement."""
        return self._peak_ratio_sum / len(self.measured) if self.measured else 1.0

    def scaled_peak(self, predicted_peak: float) -> int:
        """A cost-model peak in measured bytes, as ``predict`` gives it: what a budget is compared
        with (the env's masks, the teacher's plans), so that a plan predicted at exactly the budget
        fits it everywhere."""
        return round(predicted_peak * self.peak_ratio)

    def add(self, plan: Sequence[int], peak_bytes: int, step_seconds: float) -> bool:
        """Take one measured plan; False if it was known already."""
        key = tuple(int(a) for a in plan)
        if key in self.measured:
            return False
        self.measured[key] = (int(peak_bytes), float(step_seconds))
        self._peak_ratio_sum += peak_bytes / self.cm.peak_bytes(list(key))
        self._time_fit = None
        return True

    def predict(self, plan: Sequence[int]) -> tuple[int, float]:
        """(peak_bytes, step_seconds): measured if measured, else the corrected prediction."""
        key = tuple(plan)
        known = self.measured.get(key)
        if known is not None:
            return known
        peak = self.scaled_peak(self.cm.peak_bytes(list(key)))
        fit, base = self._fitted(), self.baseline
        if base is None or isinstance(fit, float):  # no baseline measured yet
            return peak, self.cm.step_seconds(list(key)) * float(fit)
        return peak, base[1] + sum(fit[i][a] for i, a in enumerate(key))

    def _fitted(self) -> list[list[float]] | float:
        """The time correction, fitted once per new measurement: per-unit extras (n, A) once the
        baseline is measured, else the mean measured/predicted time ratio (1 before any)."""
        if self._time_fit is None:
            base = self.baseline
            if base is not None:
                self._time_fit = self._fit(base[1]).tolist()
            else:
                ratios = [s / self.cm.step_seconds(list(p)) for p, (_, s) in self.measured.items()]
                self._time_fit = sum(ratios) / len(ratios) if ratios else 1.0
        return self._time_fit

    def corrected_model(self) -> CostModel:
        """A copy of the cost model whose step times are this correction's (peaks as profiled):
        the exact solver on it gives the frontier the measurements point to. The cost model
        itself before the baseline is measured."""
        fit, base = self._fitted(), self.baseline
        if base is None or isinstance(fit, float):
            return self.cm
        return self.cm.with_step_seconds(np.array(fit), base[1])

    def _fit(self, base_seconds: float) -> np.ndarray:
        """Per-unit extras: ridge regression of measured extras on which action each unit takes."""
        plans = [p for p in self.measured if p != self.keep_plan]
        X = np.zeros((len(plans), len(self._cols)))
        for r, p in enumerate(plans):
            for i, a in enumerate(p):
                if a != self.keep:
                    X[r, self._col[(i, a)]] = 1.0
        y = np.array([self.measured[p][1] - base_seconds for p in plans])  # measured extras
        profiled = np.array([self.pred_extra[i, a] for i, a in self._cols])
        # the slope from the plans the profile prices in full: an action it timed at nothing (see
        # ``_widths``) would put its measured cost on everyone's prior
        told = ~X[:, self._unknown].any(axis=1)
        rows = told if told.any() else np.ones(len(plans), dtype=bool)
        w0 = profiled * self._slope(X[rows] @ profiled, y[rows], base_seconds)
        if plans:
            floor = np.maximum(FLOOR_SHARE * w0, 1e-6 * base_seconds)  # strictly above keep: it breaks the tie
            # each extra's pull towards the prior: noise variance over the prior's (a Gaussian prior)
            pull = (self.noise * base_seconds) ** 2 / np.maximum(self.spread * self._widths(w0), 1e-4 * base_seconds) ** 2
            w = floor + _ridge_nonnegative(X, y - X @ floor, w0 - floor, pull)
        else:
            w = w0
        out = np.zeros_like(self.pred_extra)
        for k, (i, a) in enumerate(self._cols):
            out[i, a] = w[k]
        return out

    def _widths(self, w0: np.ndarray) -> np.ndarray:
        """How far each extra may lie from its prior, before ``spread``: the prior itself, except
        where the profile timed the action no slower than keeping the unit; there it says nothing
        of the extra's size, which is taken as the median of the action's other priors. At zero
        the prior held the extra at zero against any measurement: a recorded hf/gpt2 search whose
        profile timed the last two blocks' recompute cheaper than their keep (a profiling artefact
        since mended, ``env.measure.profiler._timed``) priced an unmeasured plan recomputing the fifth and
        selectively recomputing the sixth at the baseline's 1.02 s with 33 plans measured, one of
        them, recomputing both, at 1.32 s; each measured plan predicted from the others erred by
        8.4% (median), with this width 4.4%."""
        unknown = self._unknown
        if not unknown.any():
            return w0
        actions = self._col_action
        out = w0.copy()
        for a in set(actions[unknown].tolist()):
            known = w0[(actions == a) & ~unknown]
            out[(actions == a) & unknown] = float(np.median(known)) if known.size else 0.0
        return out

    def _slope(self, predicted: np.ndarray, measured: np.ndarray, base_seconds: float) -> float:
        """Least squares through the origin of the plans' measured extras on their predicted ones
        (the profile's, each at least zero, as the prior scales them); with no other plan measured,
        the baseline's own measured/predicted ratio. Unclipped, a profile that timed a few
        recomputes faster than keeping (noise) predicted the frontier's plans, which the exact
        solver builds from exactly those, at or below the baseline: the slope fell to 0 against
        their measured extras and the prior with it, and 46 measured plans fitted 96 extras alone
        (measured on the 48-unit gpt profile: the corrected frontier 0.91 of the profile's
        hypervolume on noise-free times)."""
        square = float(predicted @ predicted)
        if square <= 0:
            return base_seconds / self.pred_base_seconds
        return max(0.0, float(measured @ predicted) / square)


def _ridge_nonnegative(X: np.ndarray, y: np.ndarray, w0: np.ndarray, ridge: np.ndarray) -> np.ndarray:
    """argmin |X w - y|^2 + sum_k ridge_k (w_k - w0_k)^2 subject to w >= 0, by active sets: solve, pin the
    negative coordinates to 0, solve for the rest, until none is negative (each pass pins at least
    one more; with none free the answer is all zeros)."""
    free = np.ones(len(w0), dtype=bool)
    while True:
        Xf = X[:, free]
        w = np.zeros(len(w0))
        w[free] = np.linalg.solve(Xf.T @ Xf + np.diag(ridge[free]), Xf.T @ y + ridge[free] * w0[free])
        negative = w < 0
        if not negative.any():
            return w
        free &= ~negative

"""A model's profile at any micro-batch, fitted per unit from profiles at two or more batch sizes.

Every number of a ``ModelProfile`` (``env.data.model_profile``) is fitted as a line in the micro-batch
``b``: each unit's forward and backward segment under each action (net bytes, rise, seconds), the
``pre``/``post``/``tail`` segments and the bytes live before the step. Activations, their gradients
and the batch itself grow in proportion to ``b`` over a constant (weights, gradients, optimizer
state); a step's time grows as ``b`` times the work per sample over a fixed cost (kernel launches,
the optimizer). With two profiles the line goes through both; with more it is least squares. A time's
line keeps both its fixed cost and its cost per sample at 0 or above (``_time_line``): two profiles
timed minutes apart on a drifting machine can put the larger one more than proportionally slower, and
the line through them then crosses 0 above micro-batch 1, pricing small micro-batches at almost nothing
(gpt/small profiled at 4 and 16: recompute everything predicted at 14 ms at micro-batch 1, measured
75 ms, and every candidate the search measured under the lowest cap was at micro-batch 1).
``BatchFit.profile_at(b)`` returns the profile the cost model, the exact solver and the agents read
at ``b`` (the measured one where ``b`` was profiled); bytes are rounded and rises and seconds kept at
0 or above. Torch-free.

``check_at`` compares what the fit predicts at a batch against plans measured there (on the cost
model of ``profile_at(b)``): the relative peak and time errors, which the throughput search records
for every batch it measured on and never fitted on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from env.cost.cost_model import CostModel
from env.cost.line_fit import fit_line
from env.data.errors import MeasurementError
from env.data.model_profile import ModelProfile, Segment, UnitCost

__all__ = ["BatchFit", "FitCheck"]


@dataclass(frozen=True)
class FitCheck:
    """One plan measured at a micro-batch against the fit's prediction there."""

    micro_batch: int
    plan: str  # what the plan is (``all keep``, ``lowest peak``, a digest)
    fitted: bool  # the batch is one the fit was made from (then the prediction is the profile's own)
    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_seconds: float
    measured_seconds: float | None  # None: only the peak was measured

    @property
    def peak_error(self) -> float:
        return self.predicted_peak_bytes / self.measured_peak_bytes - 1

    @property
    def time_error(self) -> float | None:
        return None if self.measured_seconds is None else self.predicted_seconds / self.measured_seconds - 1


def _time_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line with both at 0 or above (a fixed cost and a cost per
    sample): the free line where it has them, else the better of the line through 0 and the constant,
    each kept at 0 or above (the two-parameter non-negative least squares, in closed form)."""
    intercept, slope = fit_line(x, y)
    if intercept >= 0 and slope >= 0:
        return intercept, slope
    bounded = [(0.0, max(0.0, float(x @ y / (x @ x)))), (max(0.0, float(y.mean())), 0.0)]
    return min(bounded, key=lambda line: float(((line[0] + line[1] * x - y) ** 2).sum()))


class BatchFit:
    """Per-unit lines in the micro-batch through the profiles of ``profiles`` (batch size -> profile)."""

    def __init__(self, profiles: dict[int, ModelProfile]) -> None:
        if len(profiles) < 2:
            raise MeasurementError(f"a fit in the micro-batch needs profiles at 2 or more batch sizes, got "
                                   f"{sorted(profiles)}; profile the workload at another micro-batch")
        first = profiles[min(profiles)]
        for b, p in profiles.items():
            if (p.units, p.actions, p.fingerprint) != (first.units, first.actions, first.fingerprint):
                raise MeasurementError(f"the profile at micro-batch {b} has other units, actions or model than the one "
                                       f"at {min(profiles)}; profile every batch size with the same units and actions")
        self.profiles = dict(sorted(profiles.items()))
        self.template = first
        x = np.array(list(self.profiles), dtype=float)
        table = np.array([_numbers(p) for p in self.profiles.values()], dtype=float)  # (batches, numbers)
        seconds = _seconds_columns(first)
        self.lines = np.array([(_time_line if k in seconds else fit_line)(x, table[:, k])
                               for k in range(table.shape[1])])  # (numbers, 2)

    @property
    def batches(self) -> list[int]:
        """The micro-batches it was fitted on."""
        return list(self.profiles)

    def profile_at(self, micro_batch: int) -> ModelProfile:
        """The profile at ``micro_batch``: the measured one if profiled there, else the fitted one."""
        if micro_batch in self.profiles:
            return self.profiles[micro_batch]
        values = self.lines[:, 0] + self.lines[:, 1] * micro_batch
        return _rebuilt(self.template, values, micro_batch)

    def cost_model(self, micro_batch: int) -> CostModel:
        return CostModel(self.profile_at(micro_batch))

    def check_at(self, micro_batch: int, plan: Sequence[int], label: str, measured_peak_bytes: int,
                 measured_seconds: float) -> FitCheck:
        """The fit's prediction of ``plan`` (profile action indices) at ``micro_batch`` against its measurement
        (``measured_seconds`` infinite: no step was timed)."""
        predicted = self.cost_model(micro_batch).predict(list(plan))
        return FitCheck(micro_batch, label, micro_batch in self.profiles, predicted.peak_bytes,
                        int(measured_peak_bytes), predicted.step_seconds,
                        float(measured_seconds) if math.isfinite(measured_seconds) else None)


def _segments(p: ModelProfile) -> list[Segment]:
    """Every segment of a profile in a fixed order: pre, post, tail, then per action per unit fwd and bwd."""
    out = [p.pre, p.post, p.tail]
    for a in p.actions:
        for c in p.costs[a]:
            out += [c.fwd, c.bwd]
    return out


def _numbers(p: ModelProfile) -> list[float]:
    """The profile's numbers in ``_segments`` order, three per segment, then the bytes live before the step."""
    return [v for s in _segments(p) for v in (s.delta_bytes, s.rise_bytes, s.seconds)] + [p.base_bytes]


def _seconds_columns(p: ModelProfile) -> set[int]:
    """Where ``_numbers`` puts the segments' seconds."""
    return {3 * k + 2 for k in range(len(_segments(p)))}


def _rebuilt(template: ModelProfile, values: np.ndarray, micro_batch: int) -> ModelProfile:
    """``template`` with its numbers replaced by ``values`` (``_numbers`` order)."""
    segs = [Segment(delta_bytes=int(round(d)), rise_bytes=max(0, int(round(r))), seconds=max(0.0, float(s)))
            for d, r, s in values[:-1].reshape(-1, 3)]
    pre, post, tail, rest = segs[0], segs[1], segs[2], segs[3:]
    n = len(template.units)
    costs = {a: [UnitCost(fwd=rest[2 * (k * n + i)], bwd=rest[2 * (k * n + i) + 1]) for i in range(n)]
             for k, a in enumerate(template.actions)}
    return template.model_copy(update={
        "batch_shape": f"micro-batch {micro_batch} (fitted)", "base_bytes": int(round(values[-1])),
        "pre": pre, "post": post, "tail": tail, "costs": costs, "baseline": None})

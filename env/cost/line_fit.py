"""A least-squares line in the micro-batch, with a flat line said exactly.

Every fit that decides something (does a peak grow with the batch, is a cost per sample positive)
reads the sign of a fitted slope. Least squares computes a flat line's slope as a rounding residue
(numpy 2.4's ``polyfit([8, 16], [100, 100], 1)`` gives +9.2e-16, earlier releases 0 or a negative
residue), so the sign of a slope on flat data is noise. ``fit_line`` returns exactly 0 for a slope
whose rise over the fitted range is below ``FLAT_RTOL`` of the largest value fitted: far below any
real growth here (at 1e-9, a peak of 10 GB is flat within 10 bytes over the whole range, and a step of
1 s within a nanosecond), far above float64's rounding (about 1e-16 of the values). Torch-free.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

__all__ = ["FLAT_RTOL", "Line", "fit_line"]

FLAT_RTOL = 1e-9  # a slope whose rise over the fitted range is below this share of the largest |value| is 0


class Line(NamedTuple):
    intercept: float
    slope: float

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> Line:
    """The least-squares line through (x, y) (through both points when there are two); a slope within
    ``FLAT_RTOL`` of flat is exactly 0, with the mean of ``y`` as the intercept. Needs 2+ distinct x."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(np.unique(xs)) < 2:
        raise ValueError(f"a line needs values at 2 or more distinct x, got x={sorted(set(xs.tolist()))}")
    slope, intercept = np.polyfit(xs, ys, 1)
    rise = abs(float(slope)) * float(xs.max() - xs.min())
    if rise <= FLAT_RTOL * float(np.abs(ys).max()):
        return Line(float(ys.mean()), 0.0)
    return Line(float(intercept), float(slope))

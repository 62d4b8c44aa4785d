"""Fitted lines whose slope decides something: a flat line's slope is exactly 0, whatever rounding residue
least squares leaves (``env.cost.line_fit``), in each place that reads its sign."""

from __future__ import annotations

import numpy as np
import pytest

from dashboard.pricing import PricingError, fit_scaling
from env.cost.batch_fit import _time_line
from env.cost.line_fit import FLAT_RTOL, fit_line
from env.data.measured import MeasuredPlan
from search.engine.throughput.peers import Contender, FitSearch, guess

# flat values on which numpy's least squares leaves a positive slope residue here (7.9e-10 and 9.3e-19):
# read by sign, each passed as growing before fit_line
FLAT_BYTES = ([2, 4, 8], [123_456_789] * 3)
FLAT_SECONDS = ([4, 16], [0.15, 0.15])


@pytest.mark.parametrize("x, y", [FLAT_BYTES, FLAT_SECONDS, ([8, 16], [100, 100]), ([2, 4], [1e6, 1e6])])
def test_a_flat_line_has_exactly_zero_slope_and_the_mean_as_intercept(x, y) -> None:
    line = fit_line(x, y)
    assert line.slope == 0.0 and line.intercept == pytest.approx(np.mean(y), rel=1e-15)


def test_real_growth_however_small_keeps_its_slope() -> None:
    # one byte a sample on a 1 GB peak: a rise of 6 bytes over 2..8, 6e-9 of the values, above FLAT_RTOL
    line = fit_line([2, 4, 8], [1e9 + 2, 1e9 + 4, 1e9 + 8])
    assert line.slope == pytest.approx(1.0, rel=1e-3)
    assert 6 / 1e9 > FLAT_RTOL
    assert fit_line([2, 4], [10.0, 30.0]) == pytest.approx((-10.0, 10.0))


def test_a_line_needs_two_distinct_sizes() -> None:
    with pytest.raises(ValueError, match="2 or more distinct"):
        fit_line([4, 4], [1.0, 2.0])


def test_the_price_page_refuses_a_flat_peak_as_not_growing() -> None:
    points = [{"batch_size": b, "peak_bytes": p, "step_seconds": 0.1} for b, p in zip(*FLAT_BYTES)]
    with pytest.raises(PricingError, match="does not grow"):
        fit_scaling(points)


def test_a_flat_time_line_in_the_batch_fit_is_a_constant() -> None:
    intercept, slope = _time_line(np.array(FLAT_SECONDS[0], float), np.array(FLAT_SECONDS[1], float))
    assert slope == 0.0 and intercept == pytest.approx(0.15)


def _measured(peak_bytes: int) -> MeasuredPlan:
    return MeasuredPlan(workload="w", batch_shape="b", digest="d", actions=["keep"], peak_bytes=peak_bytes,
                        live_before_bytes=0, step_seconds_samples=[0.1], clock="thread-cpu", device="cpu",
                        torch_version="2")


def test_the_ladder_reads_flat_peaks_by_its_prior_not_as_a_line() -> None:
    """Flat measured peaks: the next micro-batch comes from the prior scaled to them (36e6 bytes a sample here:
    16 fits a 1e9 cap), not from a line whose residue slope calls every size a fit (64)."""
    sizes, cap = [2, 4, 8, 16, 32, 64], 10**9
    search = FitSearch(Contender("rule:all", "recompute everything"), cap)
    search.seen = {b: _measured(p) for b, p in zip(*FLAT_BYTES)}
    search.fits = (8, search.seen[8])
    assert guess(search, lambda peak, b: peak, lambda b: b * 10**6, sizes) == 16

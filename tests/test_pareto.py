"""Pareto utilities: non-dominance and hypervolume on the normalised axes."""

from __future__ import annotations

import numpy as np
import pytest

from search.records.pareto import REFERENCE, hypervolume, nondominated, normalise, reference_point


def test_nondominated_drops_dominated_and_repeated_points() -> None:
    pts = [(1.0, 2.0), (2.0, 1.0), (1.0, 2.0), (2.0, 2.0), (1.5, 1.5), (3.0, 0.5)]
    assert nondominated(pts).tolist() == [True, True, False, False, True, True]
    assert nondominated(np.zeros((0, 2))).tolist() == []


def test_hypervolume_of_known_staircase() -> None:
    # to ref (1.1, 2.0): (0.5, 1.5) adds 0.3 * 0.5 until x = 0.8, then (0.8, 1.2) adds 0.3 * 0.8
    assert hypervolume([(0.5, 1.5), (0.8, 1.2)]) == pytest.approx(0.39)
    assert hypervolume([(0.5, 1.5), (0.8, 1.2), (0.9, 1.9)]) == pytest.approx(0.39)  # dominated: nothing
    assert hypervolume([(1.2, 1.0)]) == 0.0  # beyond the reference
    assert hypervolume([]) == 0.0


def test_baseline_normalises_to_one_and_reference_scales() -> None:
    pts = normalise([(2e9, 0.5), (1e9, 0.75)], baseline_peak_bytes=2e9, baseline_seconds=0.5)
    np.testing.assert_allclose(pts, [[1.0, 1.0], [0.5, 1.5]])
    assert reference_point(2e9, 0.5) == pytest.approx((2.2e9, 1.0))
    assert hypervolume(pts, REFERENCE) == pytest.approx(0.1 * 1.0 + 0.5 * 0.5)
    with pytest.raises(ValueError, match="must be positive"):
        normalise([(1, 1)], 0, 1)


def test_the_readable_frontier_leaves_out_a_lower_plan_that_is_slower_beyond_the_noise() -> None:
    from search.records.pareto import readable

    mib = 2**20
    # 47.89 MiB at 304 ms beside 47.91 MiB at 260 ms (a 48-unit search's first two rows), then two real steps
    peaks = [47.89 * mib, 47.91 * mib, 60 * mib, 80 * mib]
    seconds = [0.304, 0.260, 0.230, 0.200]
    assert readable(peaks, seconds, memory_tolerance=0.1 * mib, noise=0.02) == [False, True, True, True]
    # within the noise in time, or further than the tolerance in memory: both kept
    assert readable(peaks, [0.262, 0.260, 0.230, 0.200], 0.1 * mib, 0.02) == [True] * 4
    assert readable(peaks, seconds, memory_tolerance=0.01 * mib, noise=0.02) == [True] * 4
    # a chain of near points: a point is left out only for a kept one within the tolerance that beats it
    close = [10 * mib, 10.05 * mib, 10.1 * mib]
    assert readable(close, [0.30, 0.28, 0.26], 0.06 * mib, 0.02) == [True, False, True]

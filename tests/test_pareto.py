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

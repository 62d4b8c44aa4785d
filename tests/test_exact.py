"""The exact frontier equals brute force over every plan, on random synthetic profiles."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.exact import FrontierPoint, exact_frontier, pareto_points
from bench.synthetic import layered_profile
from env.cost.cost_model import CostModel
from env.data.plan import Action
from tests.profiles import synthetic_profile

ACTIONS = [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE]


def brute_force(cm: CostModel) -> list[FrontierPoint]:
    plans = itertools.product(range(len(cm.profile.actions)), repeat=cm.n_units)
    return pareto_points([(cm.peak_bytes(p), cm.step_seconds(p), p) for p in plans])


def _values(points: list[FrontierPoint]) -> list[tuple[int, float]]:
    return [(p.peak_bytes, p.step_seconds) for p in points]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_units=st.integers(1, 10), n_actions=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_exact_equals_brute_force(n_units: int, n_actions: int, seed: int) -> None:
    cm = CostModel(synthetic_profile(n_units, n_actions, seed))
    exact = exact_frontier(cm)
    assert _values(exact) == _values(brute_force(cm))
    for point in exact:  # each point's plan really has that peak and time
        pred = cm.predict(list(point.plan))
        assert (pred.peak_bytes, pred.step_seconds) == (point.peak_bytes, point.step_seconds)


@pytest.mark.parametrize("seed", range(2))
def test_exact_equals_brute_force_ten_units_three_actions(seed: int) -> None:
    cm = CostModel(synthetic_profile(10, 3, seed))
    assert _values(exact_frontier(cm)) == _values(brute_force(cm))


def test_frontier_sorted_and_strictly_non_dominated() -> None:
    cm = CostModel(synthetic_profile(8, 3, seed=7))
    points = exact_frontier(cm)
    assert len(points) >= 2
    peaks = [p.peak_bytes for p in points]
    times = [p.step_seconds for p in points]
    assert peaks == sorted(set(peaks)) and times == sorted(set(times), reverse=True)


def test_restricted_actions_only_use_them() -> None:
    cm = CostModel(synthetic_profile(6, 3, seed=3))
    points = exact_frontier(cm, actions=[0, 2])
    assert points and all(set(p.plan) <= {0, 2} for p in points)
    plans = itertools.product([0, 2], repeat=6)
    ref = pareto_points([(cm.peak_bytes(p), cm.step_seconds(p), p) for p in plans])
    assert _values(points) == _values(ref)


def test_relative_steps_keep_the_frontier_within_a_tenth_of_a_percent() -> None:
    from search.records.pareto import hypervolume, normalise

    prof = layered_profile(24, seed=0)
    cm = CostModel(prof)
    keep = [0] * 24
    base = (cm.peak_bytes(keep), cm.step_seconds(keep))
    exact, approx = exact_frontier(cm), exact_frontier(cm, relative=0.005)
    assert len(approx) < len(exact)
    for p in approx:  # real plans, with their own numbers
        assert (p.peak_bytes, p.step_seconds) == (cm.peak_bytes(p.plan), pytest.approx(cm.step_seconds(p.plan)))
    ratio = hypervolume(normalise([(p.peak_bytes, p.step_seconds) for p in approx], *base)) / hypervolume(
        normalise([(p.peak_bytes, p.step_seconds) for p in exact], *base))
    assert 0.999 <= ratio <= 1.0
    assert approx[0].peak_bytes == exact[0].peak_bytes and approx[-1].step_seconds == exact[-1].step_seconds
    assert _values(exact_frontier(cm, relative=0.0)) == _values(exact)

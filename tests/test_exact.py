"""The exact frontier equals brute force over every plan, on random synthetic profiles."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.exact import FrontierPoint, exact_frontier, pareto_points
from bench.synthetic import layered_profile
from env.cost.cost_model import CostModel
from env.cost.peak_walk import PeakWalk
from env.data.plan import Action
from tests.profiles import synthetic_profile, with_blocks, with_chains

ACTIONS = [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE]


def brute_force(cm: CostModel) -> list[FrontierPoint]:
    """Every valid plan (chains only after recompute or chain, where the profile's links allow), walked whole."""
    plans = itertools.product(range(len(cm.profile.actions)), repeat=cm.n_units)
    return pareto_points([(cm.peak_bytes(p), cm.step_seconds(p), p) for p in plans if cm.chain_error(p) is None])


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


# ---------------------------------------------------------------------------------------------
# Chains: regions of recompute + chain units, where the profile's links allow them


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_units=st.integers(1, 6), n_actions=st.integers(2, 3), seed=st.integers(0, 2**32 - 1))
def test_exact_equals_brute_force_with_chains(n_units: int, n_actions: int, seed: int) -> None:
    cm = CostModel(synthetic_profile(n_units, n_actions, seed, chains=True))
    exact = exact_frontier(cm)
    assert _values(exact) == _values(brute_force(cm))
    for point in exact:  # each point's plan is a valid plan with that peak and time
        assert cm.chain_error(point.plan) is None
        pred = cm.predict(list(point.plan))
        assert (pred.peak_bytes, pred.step_seconds) == (point.peak_bytes, point.step_seconds)


GRADED = [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.LIGHT]  # 'light': the graded selective action


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_units=st.integers(1, 5), chains=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_exact_equals_brute_force_with_the_graded_action(n_units: int, chains: bool, seed: int) -> None:
    """With 'light' among the actions (and chains or not), the exact frontier is still every plan's: brute force."""
    cm = CostModel(synthetic_profile(n_units, len(GRADED), seed, chains=chains, actions=GRADED))
    light = cm.profile.actions.index(Action.LIGHT)
    exact = exact_frontier(cm)
    assert _values(exact) == _values(brute_force(cm))
    for point in exact:
        assert cm.chain_error(point.plan) is None
        pred = cm.predict(list(point.plan))
        assert (pred.peak_bytes, pred.step_seconds) == (point.peak_bytes, point.step_seconds)
    without = exact_frontier(cm, actions=[k for k in range(len(cm.profile.actions)) if k != light])
    assert all(light not in p.plan for p in without)
    assert _values(without) == _values(brute_force_over(cm, [k for k in range(len(cm.profile.actions)) if k != light]))


def brute_force_over(cm: CostModel, allowed: list[int]) -> list[FrontierPoint]:
    """Brute force over the plans that use only the ``allowed`` profile actions."""
    plans = itertools.product(allowed, repeat=cm.n_units)
    return pareto_points([(cm.peak_bytes(p), cm.step_seconds(p), p) for p in plans if cm.chain_error(p) is None])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_units=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_the_walk_gives_every_prefix_its_lowest_reachable_peak(n_units: int, seed: int) -> None:
    """What the env's masks read: from the states after any valid prefix, the lowest peak of its
    completions; an invalid prefix (a chain after no region, or across units that do not chain) has none."""
    check_walk(CostModel(synthetic_profile(n_units, 3, seed, chains=True)))


def check_walk(cm: CostModel) -> None:
    """After every prefix of every plan (valid or not), the walk's lowest peak is its valid completions' lowest."""
    walk, n_acts = PeakWalk(cm, list(range(len(cm.profile.actions)))), len(cm.profile.actions)
    plans = list(itertools.product(range(n_acts), repeat=cm.n_units))
    peaks = {p: cm.peak_bytes(p) for p in plans if cm.chain_error(p) is None}
    for plan in plans:
        states = walk.initial()
        for i, a in enumerate(plan):
            states = walk.step(i, a, states)
            completions = [v for p, v in peaks.items() if p[:i + 1] == plan[:i + 1]]
            assert walk.lowest(i + 1, states) == (min(completions) if completions else None), (plan, i)
            if not completions:
                break


def test_chains_reach_below_per_unit_recompute_on_a_stack_of_blocks() -> None:
    """On layered profiles where every unit chains, the space with chains contains the one without
    (never a higher lowest peak), reaches lower on some, and without chain gives the same frontier."""
    lower = 0
    for seed in range(4):
        plain = CostModel(layered_profile(12, seed=seed))
        chained = CostModel(with_chains(plain.profile))
        low_plain, low_chained = exact_frontier(plain)[0], exact_frontier(chained)[0]
        assert low_chained.peak_bytes <= low_plain.peak_bytes
        if low_chained.peak_bytes < low_plain.peak_bytes:
            lower += 1
            assert chained.chain in low_chained.plan
            assert chained.predict(list(low_chained.plan)).peak_bytes == low_chained.peak_bytes
        no_chain = [a for a in range(len(chained.profile.actions)) if a != chained.chain]
        assert _values(exact_frontier(chained, actions=no_chain)) == _values(exact_frontier(plain))
    assert lower >= 1


def test_warm_start_measures_the_exact_plan_at_each_peers_peak_before_spreading() -> None:
    from search.engine.archive import spread_picks
    from search.engine.phases.exact import AIM_MARGIN, aimed_picks, warm_start_picks

    cm = CostModel(layered_profile(16, seed=3))
    exact = [p.plan for p in exact_frontier(cm)]
    assert len(exact) > 12
    spread = spread_picks(exact, 4)
    gaps = [p for p in exact if p not in spread]  # a peer that peaks exactly at a plan the spread skips
    at = [gaps[len(gaps) // 3], gaps[2 * len(gaps) // 3]]
    peaks = [cm.peak_bytes(list(p)) for p in at]

    def predict(p):
        return cm.peak_bytes(list(p)), cm.step_seconds(list(p))

    picks = warm_start_picks(predict, exact, peaks, 4)
    for peak in peaks:  # the frontier's fastest plan within each peer's peak (less the margin) comes first
        fastest = min((p for p in exact if cm.peak_bytes(list(p)) <= peak * (1 - AIM_MARGIN)),
                      key=lambda p: cm.step_seconds(list(p)))
        assert fastest in picks[:2] and fastest not in spread
    assert not set(at) & set(picks[:2])  # priced at exactly a peer's peak: the price may err above it
    assert len(picks) == len(set(picks)) == 4 and set(picks[2:]) <= set(exact)
    # a plan measured already is not aimed at again; no peers: the spread alone, as without peers
    known = picks[0]
    assert known not in warm_start_picks(predict, exact, peaks[:1], 4, measured={known})[:1]
    assert warm_start_picks(predict, exact, [], 4) == spread
    assert warm_start_picks(predict, exact, peaks, 1) == picks[:1]
    assert aimed_picks(predict, exact, peaks) == picks[:2]  # the aim alone, lowest peer first (the whole-model pass)


def test_the_whole_model_pass_aims_at_the_peers_that_no_plan_measured_either_way_answers() -> None:
    from env.data.measured import MeasuredPlan
    from env.data.types import MIB
    from search.engine.phases.whole_model import unanswered

    def record(mib: float, ms: float, oom: bool = False) -> MeasuredPlan:
        return MeasuredPlan(workload="w", batch_shape="x", digest=f"{mib}", actions=[], peak_bytes=int(mib * MIB),
                            live_before_bytes=0, step_seconds_samples=[] if oom else [ms / 1e3], clock="thread-cpu",
                            device="cpu", torch_version="t", oom=oom)

    ours = [record(187.3, 1345), record(244.8, 1276), record(302.3, 1159), record(150.0, 900, oom=True)]
    peers = [record(195.5, 1447),  # answered: 187.3 MiB at 1345 ms
             record(231.4, 1231),  # faster than everything of ours at or below its peak (hf/llama, budget 0.5)
             record(454.7, 1506),  # answered
             record(120.0, 2000),  # lower than all of ours: no plan of ours answers it
             record(100.0, 0, oom=True)]  # out of memory: nothing to answer
    assert unanswered(peers, ours) == [int(231.4 * MIB), int(120.0 * MIB)]
    assert unanswered(peers, ours + [record(231.4, 1231)]) == [int(120.0 * MIB)]  # as fast at its peak: answered


def test_the_whole_model_pass_sends_the_aimed_plans_as_whole_model_jobs_an_evaluator_takes() -> None:
    from env.data.codec import PlanCodec
    from env.data.types import PlanSource
    from search.engine.phases.whole_model import aimed_jobs

    codec = PlanCodec(["a", "b", "c"], ["keep", "recompute", "chain"], "fp")
    jobs = aimed_jobs(codec, [(0, 1, 2), (1, 1, 0)])
    assert [(j.item, j.source, j.micro_batch) for j in jobs] == [
        (("keep", "recompute", "chain"), "exact", 0), (("recompute", "recompute", "keep"), "exact", 0)]
    for job in jobs:  # as Evaluator.evaluate_whole_model reads them: a plan of the codec, a known source
        assert codec.indices(job.item) in {(0, 1, 2), (1, 1, 0)}
        assert PlanSource(job.source).kind == PlanSource.EXACT.kind


# ---------------------------------------------------------------------------------------------
# Blocks: every unit of a span 'block', the span recomputed as one region


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_units=st.integers(1, 6), chains=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(n_units=5, chains=False, seed=11957432)  # a span's seconds summed in another order: off in the last bit
def test_exact_equals_brute_force_with_blocks(n_units: int, chains: bool, seed: int) -> None:
    """With 'block' among the actions (and chains or not), the exact frontier is every valid plan's: brute force;
    a plan with a span partly 'block', or a 'block' outside every span, is no plan."""
    cm = CostModel(with_blocks(synthetic_profile(n_units, 3, seed, chains=chains), seed))
    exact = exact_frontier(cm)
    assert _values(exact) == _values(brute_force(cm))
    block = cm.profile.actions.index(Action.BLOCK)
    for point in exact:
        assert cm.chain_error(point.plan) is None
        pred = cm.predict(list(point.plan))
        assert (pred.peak_bytes, pred.step_seconds) == (point.peak_bytes, point.step_seconds)
    outside = [i for i in range(n_units) if not any(a <= i < b for a, b in cm.spans)]
    if outside:
        plan = [0] * n_units
        plan[outside[0]] = block
        assert "this profile found no parent" in cm.chain_error(plan)
    for start, stop in cm.spans:
        plan = [0] * n_units
        plan[start] = block
        assert "make every unit of the parent block, or none" in cm.chain_error(plan)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_units=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_the_walk_gives_every_prefix_its_lowest_reachable_peak_with_blocks(n_units: int, seed: int) -> None:
    """As above with chains and blocks: inside a span only 'block' follows a 'block', and its states' lowest peak
    is its completions' lowest."""
    check_walk(CostModel(with_blocks(synthetic_profile(n_units, 3, seed, chains=True), seed)))

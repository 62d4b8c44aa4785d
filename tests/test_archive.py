"""ParetoArchive: frontier of measured plans, credit to every proposer, measurement candidates."""

from __future__ import annotations

from env.data.measured import MeasuredPlan
from env.data.types import SourceKind
from search.engine.archive import ParetoArchive, spread_picks


def _result(digest: str, peak: int, seconds: float, source: str = "agent_0", oom: bool = False) -> MeasuredPlan:
    return MeasuredPlan(workload="w", batch_shape="b", digest=digest, actions=["keep"], sources=[source],
                        peak_bytes=peak, live_before_bytes=0, step_seconds_samples=[seconds], clock="wall",
                        device="cpu", torch_version="t", oom=oom)


def test_frontier_keeps_non_dominated_measured_plans_by_memory():
    a = ParetoArchive()
    for r in [_result("a", 100, 1.0), _result("b", 50, 2.0), _result("c", 80, 2.5), _result("d", 10, 9.0, oom=True)]:
        a.add(r)
    assert [r.digest for r in a.frontier()] == ["b", "a"]  # c is dominated by b; d never ran


def test_an_agent_that_proposes_a_rules_plan_is_credited():
    a = ParetoArchive()
    a.add(_result("r", 50, 2.0, source="rule:all"))
    assert a.frontier(kinds=(SourceKind.AGENT,)) == []
    a.propose((1,), "r", "agent_1", 50, 2.0)
    assert [r.digest for r in a.frontier(kinds=(SourceKind.AGENT,))] == ["r"]


def test_candidates_fill_the_limit_from_later_fronts_and_skip_measured_plans():
    a = ParetoArchive()
    preds = {(0,): (100, 1.0), (1,): (50, 2.0), (2,): (110, 1.1), (3,): (60, 2.2), (4,): (120, 1.2)}
    for idx, (peak, secs) in preds.items():
        a.propose(idx, f"d{idx[0]}", "agent_0", peak, secs)
    a.add(_result("d1", 50, 2.0))
    digest = lambda idx: f"d{idx[0]}"  # noqa: E731
    assert a.candidates(1, digest) == [(3,)]  # the lowest-memory end of the unmeasured first front
    first_two = a.candidates(2, digest)
    assert set(first_two) == {(0,), (3,)}  # the unmeasured first front
    assert set(a.candidates(4, digest)) == {(0,), (3,), (2,), (4,)}  # then the next fronts
    assert a.candidates(0, digest) == []


def test_candidates_ranked_by_a_corrected_prediction():
    """The search ranks the pool by the cost model corrected with its measurements: a plan the
    profile overprices joins the first front once the correction knows better."""
    a = ParetoArchive()
    for idx, (peak, secs) in {(0,): (100, 1.0), (2,): (100, 1.5), (3,): (60, 2.2)}.items():
        a.propose(idx, f"d{idx[0]}", "agent_0", peak, secs)
    digest = lambda idx: f"d{idx[0]}"  # noqa: E731
    assert set(a.candidates(2, digest)) == {(0,), (3,)}
    corrected = {(0,): (100, 1.0), (2,): (100, 0.8), (3,): (60, 2.2)}
    assert set(a.candidates(2, digest, corrected.__getitem__)) == {(2,), (3,)}


def test_with_a_baseline_candidates_go_where_the_measured_frontier_has_a_gap():
    """Proposals crowd the frontier's ends; the one plan predicted in the middle adds most
    hypervolume to what is measured, so it is measured first, then the next largest gain."""
    a = ParetoArchive()
    base = _result("base", 100, 1.0)
    for r in (base, _result("low", 30, 1.8)):
        a.add(r)
    preds = {(1,): (32, 1.7), (2,): (34, 1.65), (3,): (36, 1.6), (4,): (60, 1.3),
             (5,): (93, 1.03), (6,): (95, 1.02), (7,): (97, 1.01), (8,): (62, 1.9)}  # 8: dominated, never first
    for idx, (peak, secs) in preds.items():
        a.propose(idx, f"d{idx[0]}", "agent_0", peak, secs)
    digest = lambda idx: f"d{idx[0]}"  # noqa: E731
    assert a.candidates(1, digest) == [(1,)]  # without the baseline: the lowest-memory end of the front
    assert a.candidates(1, digest, baseline=base) == [(4,)]  # the gap in the middle
    picked = a.candidates(3, digest, baseline=base)
    assert picked[0] == (4,) and (8,) not in picked and len(picked) == 3
    # once no predicted point adds hypervolume, the fronts fill the limit as before
    assert len(a.candidates(len(preds), digest, baseline=base)) == len(preds)


def test_spread_picks_keeps_both_ends():
    assert spread_picks(list(range(10)), 3) == [0, 4, 9]
    assert spread_picks([1, 2], 5) == [1, 2]


def test_candidates_fill_the_agents_own_frontier_where_a_rule_already_sits():
    """A rule measured at the low end adds that point to the whole frontier, not to the agents':
    the agents' plan there is measured when the gain counts against their own frontier only, so
    that no rule is left beyond the agents' frontier for want of a measurement."""
    a = ParetoArchive()
    base = _result("base", 100, 1.0, source="rule:none")
    for r in (base, _result("all", 30, 1.5, source="rule:all"), _result("mid", 60, 1.2)):
        a.add(r)
    preds = {(1,): (30, 1.45), (2,): (80, 1.1)}
    for idx, (peak, secs) in preds.items():
        a.propose(idx, f"d{idx[0]}", "agent_0", peak, secs)
    digest = lambda idx: f"d{idx[0]}"  # noqa: E731
    # against every measured plan, the agents' low plan adds only the sliver it beats the rule by
    assert a.candidates(1, digest, baseline=base) == [(2,)]
    assert a.candidates(1, digest, baseline=base, known_kinds=(SourceKind.AGENT,)) == [(1,)]


def test_contenders_are_the_plans_that_missed_the_frontier_by_less_than_the_noise():
    """A plan one slow median put just off the frontier gets measured again; one far off does not,
    and never more than the frontier has points; against the agents' own frontier, a plan a rule
    dominates is one."""
    a = ParetoArchive()
    for r in [_result("fast", 100, 1.0), _result("lean", 50, 2.0), _result("near", 60, 2.03),
              _result("nearer", 110, 1.01), _result("far", 70, 2.5), _result("ruled", 58, 2.05),
              _result("rule", 45, 1.5, source="rule:all")]:
        a.add(r)
    agents = (SourceKind.AGENT,)
    assert [r.digest for r in a.contenders(0.02)] == ["nearer"]  # the rule dominates lean, near, ruled, far by 25%+
    assert [r.digest for r in a.contenders(0.02, kinds=agents)] == ["nearer", "near"]  # 1.0%, 1.5%
    assert [r.digest for r in a.contenders(0.03, kinds=agents)] == ["nearer", "near"]  # ruled's 2.5%: capped
    assert [r.digest for r in a.contenders(0.3, kinds=agents)] == ["nearer", "near"]
    a.add(_result("more", 30, 3.0))  # a third point on the agents' frontier: room for a third contender
    assert [r.digest for r in a.contenders(0.03, kinds=agents)] == ["nearer", "near", "ruled"]
    assert a.contenders(0.0, kinds=agents) == []


def test_only_the_plans_no_agent_and_no_warm_start_proposed_are_the_rules_own() -> None:
    from search.engine.agent_pool import _rule_only

    assert _rule_only(_result("a", 1, 1.0, "rule:every_2"))
    assert not _rule_only(_result("a", 1, 1.0, "exact")) and not _rule_only(_result("a", 1, 1.0, "agent_1"))
    assert not _rule_only(_result("a", 1, 1.0, "rule:all").proposed_by("agent_0"))  # an agent found it too


def test_with_warm_start_the_teacher_may_demonstrate_the_rules_plans_too() -> None:
    from search.engine.agent_pool import may_demonstrate

    rule, mine = _result("a", 1, 1.0, "rule:segments_2"), _result("b", 1, 1.0, "agent_0")
    assert may_demonstrate(rule, warm_start=True) and not may_demonstrate(rule, warm_start=False)
    assert may_demonstrate(mine, warm_start=False) and may_demonstrate(_result("c", 1, 1.0, "exact"), warm_start=False)


def test_the_agents_answer_to_a_rule_beyond_their_frontier_is_measured_first():
    """A rule measured beyond the agents' frontier: the agents' plan predicted to fit its memory
    within the run's noise of its time is measured before the plans that add more hypervolume (it
    adds only a sliver between the agents' neighbouring plans); a plan predicted slower than that
    is no answer, and with the rule matched the hypervolume ranking alone decides."""
    a = ParetoArchive()
    base = _result("base", 100, 1.0, source="rule:none")
    for r in (base, _result("every_2", 60, 1.20, source="rule:every_2"), _result("low", 30, 1.6),
              _result("mid", 58, 1.25)):
        a.add(r)
    # mid: more time at less memory; no agent plan fits the baseline's time, none is predicted to
    assert [r.digest for r in a.rivals(("agent",))] == ["every_2", "base"]
    preds = {(1,): (59, 1.22), (2,): (45, 1.3), (3,): (60, 1.30)}
    for idx, (peak, secs) in preds.items():
        a.propose(idx, f"d{idx[0]}", "agent_0", peak, secs)
    digest = lambda idx: f"d{idx[0]}"  # noqa: E731
    by_volume = a.candidates(1, digest, baseline=base, known_kinds=(SourceKind.AGENT,))
    assert by_volume == [(2,)]  # 1.7% off the rule: no answer within a margin of 0
    assert a.candidates(1, digest, baseline=base, known_kinds=(SourceKind.AGENT,), margin=0.02) == [(1,)]
    assert a.candidates(2, digest, baseline=base, known_kinds=(SourceKind.AGENT,), margin=0.02) == [(1,), (2,)]
    # the rule matched by a measured agent plan: the hypervolume alone ranks the rest
    a.add(_result("d1", 59, 1.19))
    assert [r.digest for r in a.rivals(("agent",))] == ["base"]
    assert a.candidates(1, digest, baseline=base, known_kinds=(SourceKind.AGENT,), margin=0.02) == [(2,)]

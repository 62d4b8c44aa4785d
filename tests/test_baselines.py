"""Rule plans: exact action patterns for every rule, as their sources define them."""

from __future__ import annotations

import pytest

from agents.baselines import baseline_rules, checkpoint_sequential_plan, sequential_segments, sqrt_n_plan
from env.data.plan import Action

KRS = [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE]


def test_rule_names_and_patterns_for_six_units() -> None:
    rules = baseline_rules(6, KRS, seed=0)
    assert list(rules)[:3] == ["none", "all", "every_2"]
    assert set(rules) == {"none", "all", "sqrt_n", "all_selective", "random_0", "random_1", "random_2",
                          *(f"every_{n}" for n in range(2, 7)), *(f"segments_{k}" for k in range(2, 7))}
    assert rules["none"] == [0] * 6 and rules["all"] == [1] * 6 and rules["all_selective"] == [2] * 6
    assert rules["every_2"] == [1, 0, 1, 0, 1, 0]
    assert rules["every_3"] == [1, 0, 0, 1, 0, 0]
    assert rules["every_6"] == [1, 0, 0, 0, 0, 0]
    assert rules["segments_2"] == [1, 1, 1, 0, 0, 0]
    assert rules["segments_3"] == [1, 1, 1, 1, 0, 0]
    assert rules["segments_4"] == [1, 1, 1, 0, 0, 0]  # size 6 // 4 = 1: three checkpointed, the rest kept
    assert rules["sqrt_n"] == [1, 1, 0, 1, 1, 0]  # round(sqrt 6) = 2 segments of 3; their last units kept


def test_checkpoint_sequential_cuts_like_torch() -> None:
    assert sequential_segments(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert checkpoint_sequential_plan(10, 3, keep=0, recompute=1) == [1] * 6 + [0] * 4
    assert sqrt_n_plan(9, keep=0, recompute=1) == [1, 1, 0, 1, 1, 0, 1, 1, 0]
    assert sqrt_n_plan(1, keep=0, recompute=1) == [0]


def test_random_plans_are_seeded_and_cover_the_actions() -> None:
    a, b, c = (baseline_rules(40, KRS, seed=s, n_random=2) for s in (1, 1, 2))
    assert a["random_0"] == b["random_0"] and a["random_0"] != c["random_0"]
    assert a["random_0"] != a["random_1"] and set(a["random_0"]) == {0, 1, 2}


def test_rules_follow_the_action_list_given() -> None:
    rules = baseline_rules(4, [Action.RECOMPUTE, Action.KEEP], seed=0, n_random=0)
    assert rules["none"] == [1] * 4 and rules["every_2"] == [0, 1, 0, 1]
    assert "all_selective" not in rules
    only_keep = baseline_rules(3, [Action.KEEP], seed=0, n_random=1)
    assert set(only_keep) == {"none", "random_0"} and only_keep["random_0"] == [0, 0, 0]
    with pytest.raises(ValueError, match="n_units=0"):
        baseline_rules(0, KRS)


KRSC = KRS + [Action.CHAIN]


def test_with_chains_the_segment_rules_are_regions_as_checkpoint_sequential_runs_them() -> None:
    rules = baseline_rules(6, KRSC, seed=0, links=[False] + [True] * 5)
    assert rules["segments_2"] == [1, 3, 3, 0, 0, 0]  # one region of 3 blocks keeping only its input, the rest kept
    assert rules["segments_3"] == [1, 3, 1, 3, 0, 0]
    assert rules["segments_4"] == [1, 1, 1, 0, 0, 0]  # segments of one unit: a region of one is a recompute
    assert rules["sqrt_n"] == [1, 3, 3, 1, 3, 3]  # Chen et al.: every segment a region, only its input kept
    assert rules["every_2"] == [1, 0, 1, 0, 1, 0] and rules["all"] == [1] * 6  # the per-unit rules stay


def test_a_region_is_cut_where_units_do_not_chain() -> None:
    links = [False, True, False, True, False, True]  # pairs: 0-1, 2-3, 4-5 (a norm and its attention, ...)
    rules = baseline_rules(6, KRSC, seed=0, links=links)
    assert rules["segments_2"] == [1, 3, 1, 0, 0, 0]
    assert rules["sqrt_n"] == [1, 3, 1, 1, 1, 3]  # segments 0-2 and 3-5, each cut where a link is missing


def test_without_links_the_rules_are_as_before() -> None:
    assert baseline_rules(6, KRSC, seed=0, n_random=0) == {k: v for k, v in baseline_rules(6, KRS, seed=0).items()
                                                           if not k.startswith("random")}


def test_random_plans_with_chains_are_valid_plans() -> None:
    from env.data.plan import chain_error

    links = [False, True, True, False, True, True] * 5
    rules = baseline_rules(30, KRSC, seed=3, n_random=20, links=links)
    units = [f"u{i}" for i in range(30)]
    chained = 0
    for j in range(20):
        plan = rules[f"random_{j}"]
        assert chain_error(units, [KRSC[a] for a in plan]) is None
        assert all(links[i] for i, a in enumerate(plan) if a == 3)
        chained += plan.count(3)
    assert chained > 0
    assert baseline_rules(40, KRS, seed=1, n_random=2)["random_0"] == baseline_rules(40, KRS, seed=1)["random_0"]


def test_blocks_n_recompute_every_nth_parent_whole_and_random_plans_draw_no_block() -> None:
    """torchtitan's layer policy where units are a parent's: ``blocks_n`` gives 'block' to every unit of every
    n-th span from the first; a random plan never draws 'block', which takes a whole span."""
    acts = [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.BLOCK]
    rules = baseline_rules(7, acts, seed=0, n_random=20, spans=[(0, 2), (2, 4), (4, 6)])
    b, k = 3, 0
    assert rules["blocks_1"] == [b] * 6 + [k] and rules["blocks_2"] == [b, b, k, k, b, b, k]
    assert rules["blocks_3"] == [b, b] + [k] * 5 and "blocks_4" not in rules
    assert all(b not in plan for name, plan in rules.items() if name.startswith("random_"))
    assert not any(name.startswith("blocks_") for name in baseline_rules(7, acts, seed=0))  # no spans, no rule

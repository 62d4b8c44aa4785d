"""CheckpointEnv: API checks, same-seed determinism, rewards, exact masks, budgets, reward modes, PPO."""

from __future__ import annotations

import itertools
import warnings
from enum import Enum

import gymnasium
import numpy as np
import pytest
import torch

import env  # noqa: F401  (registers CkptSearch-v2)
from agents.exact import exact_frontier
from bench.synthetic import layered_profile
from env.cost.cost_model import CostModel
from env.data.model_profile import ModelProfile
from env.data.plan import Action
from env.gym.checkpoint_env import BudgetShare, CheckpointEnv
from env.gym.features import N_FOURIER, N_GLOBAL_OBS, N_UNIT_OBS
from tests.profiles import synthetic_profile, with_blocks


@pytest.fixture(scope="module")
def gpt_tiny() -> ModelProfile:
    from env.measure.profiler import profile
    from env.units.find import find_units
    from env.workloads.workload import load_workload

    w = load_workload("gpt/tiny")
    return profile(w, find_units(w.model), [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.CHAIN], repeats=1,
                   baseline=False)  # blocks chain: four actions


def _mid_budget(prof: ModelProfile) -> int:
    """Halfway between the lowest reachable peak and the all-keep peak."""
    cm = CostModel(prof)
    lowest = exact_frontier(cm)[0].peak_bytes
    return (lowest + cm.peak_bytes([prof.actions.index(Action.KEEP)] * cm.n_units)) // 2


def _rollout(e: gymnasium.Env, plan: list[int]) -> tuple[float, dict]:
    e.reset()
    for a in plan:
        _, reward, terminated, truncated, info = e.step(a)
    assert terminated and not truncated
    return float(reward), info


@pytest.mark.parametrize("which", ["synthetic", "chains", pytest.param("gpt_tiny", marks=pytest.mark.slow)])
def test_checkers_pass_in_model_mode(which: str, request: pytest.FixtureRequest) -> None:
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    prof = {"synthetic": lambda: synthetic_profile(6, 3, seed=11),
            "chains": lambda: synthetic_profile(6, 3, seed=11, chains=True),
            "gpt_tiny": lambda: request.getfixturevalue(which)}[which]()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        gym_check(gymnasium.make("CkptSearch-v2", profile=prof, budget_bytes=_mid_budget(prof)).unwrapped)
        sb3_check(CheckpointEnv(prof, _mid_budget(prof)))
    assert [str(w.message) for w in record] == []


def test_make_builds_the_registered_env() -> None:
    prof = synthetic_profile(5, 3, seed=1)
    e = gymnasium.make("CkptSearch-v2", profile=prof, budget_bytes=10**6)
    obs, _ = e.reset(seed=0)
    assert isinstance(e.unwrapped, CheckpointEnv)
    assert obs.shape == ((N_UNIT_OBS + 1) * 3 + N_GLOBAL_OBS,) == (59,) and e.action_space.n == 3
    assert e.get_wrapper_attr("action_masks")().shape == (3,)


def test_same_seed_envs_match_step_by_step() -> None:
    prof = synthetic_profile(6, 3, seed=2)
    envs = [CheckpointEnv(prof, _mid_budget(prof)) for _ in range(2)]
    rng = np.random.default_rng(0)
    for episode in range(20):
        obs = [e.reset(seed=episode)[0] for e in envs]
        np.testing.assert_array_equal(obs[0], obs[1])
        for _ in range(6):
            a = int(rng.integers(3))
            (o1, r1, t1, _, i1), (o2, r2, t2, _, i2) = envs[0].step(a), envs[1].step(a)
            np.testing.assert_array_equal(o1, o2)
            assert (r1, t1, i1) == (r2, t2, i2)
    assert t1 and i1["plan_indices"] and len(i1["plan"]) == 6


def test_reward_and_info_come_from_the_cost_model() -> None:
    prof = synthetic_profile(6, 3, seed=4)
    cm = CostModel(prof)
    budget = _mid_budget(prof)
    e = CheckpointEnv(prof, budget)
    rewards = {}
    for plan in itertools.product(range(3), repeat=6):
        reward, info = _rollout(e, list(plan))
        pred = cm.predict(list(plan))
        assert (info["peak_bytes"], info["step_seconds"]) == (pred.peak_bytes, pred.step_seconds)
        assert info["feasible"] == (pred.peak_bytes <= budget) and info["measured"] is False
        assert info["plan"] == [prof.actions[a].value for a in plan]
        if info["feasible"]:
            assert reward == pytest.approx(-pred.step_seconds / e.baseline_seconds)
        rewards[plan] = (reward, info["feasible"], pred.peak_bytes)
    feasible = [r for r, f, _ in rewards.values() if f]
    infeasible = sorted((peak, r) for r, f, peak in rewards.values() if not f)
    assert feasible and infeasible and max(r for _, r in infeasible) < min(feasible)
    assert all(a[1] >= b[1] for a, b in zip(infeasible, infeasible[1:]))  # more overshoot, lower reward


def test_masks_allow_exactly_the_actions_some_completion_fits() -> None:
    prof = synthetic_profile(5, 3, seed=5)
    cm = CostModel(prof)
    budget = _mid_budget(prof)
    e = CheckpointEnv(prof, budget)
    peaks = {p: cm.peak_bytes(p) for p in itertools.product(range(3), repeat=5)}
    for prefix_len in range(5):
        for prefix in itertools.product(range(3), repeat=prefix_len):
            e.reset()
            for a in prefix:
                e.step(a)
            lows = [min(v for p, v in peaks.items() if p[:prefix_len + 1] == prefix + (a,)) for a in range(3)]
            expected = [low <= budget for low in lows]
            if not any(expected):
                expected[int(np.argmin(lows))] = True
            assert e.action_masks().tolist() == expected


def test_the_graded_action_is_one_more_choice_priced_and_masked_from_the_profile() -> None:
    """With 'light' profiled, the env offers it as one more action: every plan's reward and info are the cost
    model's, and the masks allow exactly the actions some completion fits (brute force over 4**4 plans)."""
    actions = [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.LIGHT]
    prof = synthetic_profile(4, 4, seed=6, actions=actions)
    cm = CostModel(prof)
    budget = _mid_budget(prof)
    e = CheckpointEnv(prof, budget)
    assert e.action_space.n == 4 and e.enabled == actions
    peaks = {p: cm.peak_bytes(p) for p in itertools.product(range(4), repeat=4)}
    for plan in peaks:
        reward, info = _rollout(e, list(plan))
        assert (info["peak_bytes"], info["step_seconds"]) == (peaks[plan], cm.step_seconds(list(plan)))
        assert info["plan"] == [actions[a].value for a in plan]
    for prefix_len in range(4):
        for prefix in itertools.product(range(4), repeat=prefix_len):
            e.reset()
            for a in prefix:
                e.step(a)
            lows = [min(v for p, v in peaks.items() if p[:prefix_len + 1] == prefix + (a,)) for a in range(4)]
            expected = [low <= budget for low in lows]
            if not any(expected):
                expected[int(np.argmin(lows))] = True
            assert e.action_masks().tolist() == expected
    light_only = CheckpointEnv(prof, budget, actions=[Action.KEEP, Action.LIGHT])
    assert light_only.action_space.n == 2 and _rollout(light_only, [1] * 4)[1]["plan"] == ["light"] * 4


@pytest.mark.parametrize("seed", [5, 8])
def test_masks_with_chains_allow_exactly_the_actions_that_can_follow_and_fit(seed: int) -> None:
    """A chain only where it continues a region (after recompute or chain, on a unit that chains),
    and any action only if some valid completion fits the budget."""
    prof = synthetic_profile(5, 3, seed=seed, chains=True)
    cm = CostModel(prof)
    budget = _mid_budget(prof)
    e = CheckpointEnv(prof, budget)
    assert e.action_space.n == 4
    assert sum(m[3] for m in check_masks(e, cm, budget)) > 0  # some chain allowed


def check_masks(e: CheckpointEnv, cm: CostModel, budget: int) -> list[list[bool]]:
    """After every valid prefix, the env's masks allow exactly the actions some valid completion of which fits the
    budget (the lowest-peaking one where none does); every mask, in order."""
    n_acts, n = len(cm.profile.actions), cm.n_units
    peaks = {p: cm.peak_bytes(p) for p in itertools.product(range(n_acts), repeat=n) if cm.chain_error(p) is None}
    masks = []
    for prefix_len in range(n):
        for prefix in {p[:prefix_len] for p in peaks}:
            e.reset()
            for a in prefix:
                e.step(a)
            lows = [min((v for p, v in peaks.items() if p[:prefix_len + 1] == prefix + (a,)), default=None)
                    for a in range(n_acts)]
            expected = [low is not None and low <= budget for low in lows]
            if not any(expected):
                expected[min((low, a) for a, low in enumerate(lows) if low is not None)[1]] = True
            assert e.action_masks().tolist() == expected, prefix
            masks.append(expected)
    return masks


def test_a_chain_that_continues_no_region_is_taken_as_recompute() -> None:
    prof = synthetic_profile(4, 3, seed=8, chains=True)
    e = CheckpointEnv(prof, 10**9)
    e.reset()
    assert not e.action_masks()[3]  # the first unit cannot chain
    for _ in range(4):
        *_, info = e.step(3)
    names = info["plan"]
    assert names[0] == "recompute" and CostModel(prof).chain_error(info["plan_indices"]) is None
    assert info["peak_bytes"] == CostModel(prof).predict(info["plan_indices"]).peak_bytes


@pytest.mark.parametrize("seed", range(3))
def test_masks_with_blocks_allow_exactly_the_actions_that_can_follow_and_fit(seed: int) -> None:
    """'block' only on a span's first unit, and inside a span only 'block'; any action only if some valid
    completion fits the budget. A block chosen elsewhere is kept, and inside a span every unit is block."""
    prof = with_blocks(synthetic_profile(5, 3, seed=seed, chains=True), seed=seed + 1)
    cm = CostModel(prof)
    block = prof.actions.index(Action.BLOCK)
    budget = _mid_budget(prof)
    e = CheckpointEnv(prof, budget)
    check_masks(e, cm, budget)
    for start, stop in prof.block_spans:  # unmasked: a block at a span's start makes the whole span block
        e = CheckpointEnv(prof, 10**12)
        e.reset()
        for i in range(5):
            *_, info = e.step(block if i == start else 0)
        assert info["plan_indices"][start:stop] == [block] * (stop - start)
        assert cm.chain_error(info["plan_indices"]) is None
    outside = [i for i in range(5) if not any(a <= i < b for a, b in prof.block_spans)]
    if outside:
        e.reset()
        for _ in range(5):
            *_, info = e.step(block if _ == outside[0] else 1)
        assert info["plan"][outside[0]] == "keep"


def test_action_subset_and_observation_features() -> None:
    prof = synthetic_profile(4, 3, seed=6)
    cm = CostModel(prof)
    budget = 10**9
    e = CheckpointEnv(prof, budget, actions=[Action.KEEP, Action.SELECTIVE])
    obs, info = e.reset()
    u, g = N_UNIT_OBS, 2 * (N_UNIT_OBS + 1) + 1  # per-action block; first entry after position and counts
    assert e.action_space.n == 2 and obs.shape == (g + N_GLOBAL_OBS - 1,) and info == {"budget_bytes": budget}
    peaks = {p: cm.peak_bytes(p) for p in itertools.product((0, 2), repeat=4)}
    keep_all = cm.peak_bytes([0] * 4)
    for k, a in enumerate((0, 2)):  # the first unit under each action
        assert obs[u * k] == pytest.approx(cm.f_delta[0, a] / (e.baseline_peak - prof.base_bytes), rel=1e-6)
        assert obs[u * k + 2] == pytest.approx((cm.seconds[0, a] - cm.seconds[0, 0]) / e.baseline_seconds, abs=1e-7)
        assert obs[u * k + 4] == pytest.approx(min(v for p, v in peaks.items() if p[0] == a) / budget, rel=1e-6)
        after_k_keep = cm.peak_bytes([a, 0, 0, 0])
        assert obs[u * k + 7] == float(after_k_keep <= budget) == 1.0  # a budget that everything fits
    assert obs[g + 2] == pytest.approx(keep_all / budget, rel=1e-6)  # every unit keeps
    assert obs[g + 3] == pytest.approx(budget / e.baseline_peak, rel=1e-6)
    assert obs[g + 6] == -4.0  # nothing needs saving: the slack, clipped
    assert obs[8] == 1.0 and obs[u + 8] == 0.0  # lookahead: keep is cheapest when nothing is needed
    for a in [1, 1, 0, 1]:
        obs, _, _, _, info = e.step(a)
    assert info["plan"] == ["selective", "selective", "keep", "selective"]
    assert info["plan_indices"] == [2, 2, 0, 2] and info["budget_bytes"] == budget
    assert obs[:g - 3].tolist() == [0.0] * (g - 3) and obs[g - 3] == 1.0 and obs[g - 2:g].tolist() == [0.25, 0.75]
    own = cm.peak_bytes([2, 2, 0, 2])
    assert obs[g + 1] == pytest.approx(own / budget, rel=1e-6) and obs[g + 2] == pytest.approx(own / budget, rel=1e-6)
    extra = cm.step_seconds([2, 2, 0, 2]) - cm.step_seconds([0] * 4)
    assert obs[g + 5] == pytest.approx(extra / e.baseline_seconds, rel=1e-5)


def test_slack_and_lookahead_point_at_the_one_unit_that_fits_a_budget_just_below_the_baseline() -> None:
    prof = layered_profile(8, seed=1)
    cm = CostModel(prof)
    e = CheckpointEnv(prof, 10**9, actions=[Action.KEEP, Action.RECOMPUTE])
    plans = {j: [1 if i == j else 0 for i in range(8)] for j in range(8)}
    saves = {j: e.baseline_peak - cm.peak_bytes(p) for j, p in plans.items()}
    fits = [j for j in range(8) if saves[j] > 0]
    cheapest = min(fits, key=lambda j: cm.step_seconds(plans[j]))
    assert len(fits) > 2 and cheapest != min(fits, key=lambda j: -saves[j])  # not simply the biggest saving
    budget = e.baseline_peak - min(saves[j] for j in fits)  # every unit that saves anything alone fits
    obs, _ = e.reset(options={"budget_bytes": budget})
    u = N_UNIT_OBS
    for i in range(8):
        assert obs[u + 8] == float(i == cheapest), f"unit {i}"  # the lookahead recomputes the cheapest unit
        if i <= cheapest:  # keeping every unit from here does not fit; keeping this one, then the cheapest does
            assert obs[7] == 0.0 and obs[8] == float(i < cheapest)
        obs, *_ = e.step(1 if i == cheapest else 0)
    assert obs[(N_UNIT_OBS + 1) * 2 + 1 + 6] == -4.0  # after the cheapest: nothing left to save (clipped slack)


def test_efficiency_rank_orders_units_by_bytes_saved_per_extra_second() -> None:
    prof = synthetic_profile(8, 3, seed=3)
    cm = CostModel(prof)
    e = CheckpointEnv(prof, 10**9)
    saved = cm.f_delta[:, 0] - cm.f_delta[:, 1]
    extra = np.maximum(cm.seconds[:, 1] - cm.seconds[:, 0], 1e-9)
    ranks = []
    obs, _ = e.reset()
    for i in range(8):
        ranks.append(float(obs[N_UNIT_OBS * 1 + 3]))
        obs, *_ = e.step(0)
    saving = [i for i in range(8) if saved[i] > 0]
    assert all(ranks[i] == 0.0 for i in range(8) if saved[i] <= 0)
    assert sorted(saving, key=lambda i: ranks[i]) == sorted(saving, key=lambda i: saved[i] / extra[i])
    assert max(ranks) == 1.0 and min(ranks[i] for i in saving) > 0


def test_budget_range_draws_one_budget_per_episode() -> None:
    prof = synthetic_profile(5, 3, seed=7)
    cm = CostModel(prof)
    low, high = _mid_budget(prof), cm.peak_bytes([0] * 5)
    envs = [CheckpointEnv(prof, (low, high)) for _ in range(2)]
    drawn = [[e.reset(seed=s)[1]["budget_bytes"] for s in range(30)] for e in envs]
    assert drawn[0] == drawn[1] and all(low <= b <= high for b in drawn[0]) and len(set(drawn[0])) > 20
    e = envs[0]
    for budget in (low, high):
        obs, info = e.reset(options={"budget_bytes": budget})
        assert info["budget_bytes"] == budget == e.budget_bytes
        g = (N_UNIT_OBS + 1) * 3 + 1
        assert obs[g + 3] == pytest.approx(budget / e.baseline_peak, rel=1e-6)
        place = (budget - e.lowest_reachable) / (high - e.lowest_reachable)
        assert obs[g + 4] == pytest.approx(place, abs=1e-6)
        # sin, cos of the place at 1, 2, 4, .. half-turns: sharp budget boundaries for a policy
        code = obs[g + 7:g + 7 + 2 * N_FOURIER]
        assert code.shape == (2 * N_FOURIER,)
        assert code[0::2] == pytest.approx(np.sin(np.pi * 2.0 ** np.arange(N_FOURIER) * place), abs=1e-5)
        assert code[1::2] == pytest.approx(np.cos(np.pi * 2.0 ** np.arange(N_FOURIER) * place), abs=1e-5)
        for a in [0] * 5:
            _, _, done, _, info = e.step(a)
        assert done and info["budget_bytes"] == budget and info["feasible"] == (high <= budget)


def test_reward_mode_accepts_a_str_valued_enum() -> None:
    class Reward(str, Enum):
        MODEL = "model"
        HYBRID = "hybrid"

    prof = synthetic_profile(3, 3, seed=0)
    assert CheckpointEnv(prof, 10**6, reward_mode=Reward.MODEL).reward_mode == "model"
    with pytest.raises(ValueError, match="'hybrid' is not one of model, measured"):
        CheckpointEnv(prof, 10**6, reward_mode=Reward.HYBRID)


def test_measured_mode_calls_the_evaluator_once_per_plan() -> None:
    prof = synthetic_profile(4, 2, seed=8)
    cm = CostModel(prof)
    calls: list[tuple[int, ...]] = []

    def evaluator(plan: list[int]) -> tuple[int, float]:
        calls.append(tuple(plan))
        pred = cm.predict(plan)
        return pred.peak_bytes + 100, pred.step_seconds * 2

    seen: list[list[int]] = []
    e = CheckpointEnv(prof, 10**9, reward_mode="measured", evaluator=evaluator,
                      on_plan=lambda plan, info: seen.append(plan))
    for plan in ([1, 0, 1, 0], [1, 0, 1, 0], [0, 0, 0, 1]):
        reward, info = _rollout(e, plan)
        assert info["measured"] and info["peak_bytes"] == cm.peak_bytes(plan) + 100
        assert reward == pytest.approx(-cm.step_seconds(plan) / cm.step_seconds([0] * 4))
    assert calls == [(0, 0, 0, 0), (1, 0, 1, 0), (0, 0, 0, 1)]  # baseline first, each plan once
    assert seen == [[1, 0, 1, 0], [1, 0, 1, 0], [0, 0, 0, 1]]


def test_model_mode_after_measurements_answers_from_the_correction() -> None:
    prof = synthetic_profile(5, 2, seed=4)
    cm = CostModel(prof)
    keep = (0,) * 5
    e = CheckpointEnv(prof, 10**12)
    measured = [keep, (1, 0, 0, 0, 0), (0, 1, 1, 0, 0)]
    e.add_measurements([(p, cm.peak_bytes(p) + 7, 1.1 * cm.step_seconds(p)) for p in measured])
    for p in itertools.product(range(2), repeat=5):
        _, info = _rollout(e, list(p))
        assert info["measured"] == (p in measured)
        assert (info["peak_bytes"], info["step_seconds"]) == pytest.approx(e.correction.predict(p))
    _, info = _rollout(e, [1, 0, 0, 0, 0])
    assert info["step_seconds"] == pytest.approx(1.1 * cm.step_seconds((1, 0, 0, 0, 0)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(reward_mode="fast"), "reward_mode 'fast'"),
    (dict(reward_mode="hybrid"), "reward_mode 'hybrid'"),
    (dict(budget_bytes=(10, 5)), "0 < low <= high"),
    (dict(reward_mode="measured"), "needs an evaluator"),
    (dict(budget_bytes=0), "budget_bytes=0"),
    (dict(actions=[Action.OFFLOAD]), "among the profiled"),
])
def test_bad_arguments_are_refused(kwargs: dict, match: str) -> None:
    args = dict(profile=synthetic_profile(3, 3, seed=0), budget_bytes=10**6) | kwargs
    with pytest.raises(ValueError, match=match):
        CheckpointEnv(**args)


@pytest.mark.slow
def test_maskable_ppo_beats_random_plans_on_gpt_tiny(gpt_tiny: ModelProfile) -> None:
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.logger import Logger

    budget = _mid_budget(gpt_tiny)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small MLP: one thread is faster than two on a shared machine
    try:
        model = MaskablePPO("MlpPolicy", CheckpointEnv(gpt_tiny, budget), n_steps=256, batch_size=64,
                            seed=0, device="cpu", verbose=0)
        model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's own would leave an SB3-<date> temp folder
        model.learn(2048)
    finally:
        torch.set_num_threads(threads)
    e = CheckpointEnv(gpt_tiny, budget)
    obs, _ = e.reset(seed=0)
    done = False
    while not done:
        action, _ = model.predict(obs, action_masks=e.action_masks(), deterministic=True)
        obs, reward, done, _, info = e.step(action)
    rng = np.random.default_rng(0)
    random_rewards = [_rollout(e, rng.integers(0, 3, size=e.n_units).tolist())[0] for _ in range(200)]
    assert info["feasible"] and reward > np.mean(random_rewards)
    assert reward >= np.percentile(random_rewards, 90)


def test_budget_share_spans_the_reachable_range_in_measured_bytes() -> None:
    prof = layered_profile(6, seed=5)
    cm = CostModel(prof)
    e = CheckpointEnv(prof, BudgetShare(0.25, 0.5))
    lowest, base = exact_frontier(cm)[0].peak_bytes, cm.peak_bytes([0] * 6)
    assert e.lowest_reachable == lowest
    assert e.budget_range == (round(lowest + 0.25 * (base - lowest)), round(lowest + 0.5 * (base - lowest)))
    assert CheckpointEnv(prof, None).budget_range == (lowest, base)
    e.add_measurements([([0] * 6, int(1.1 * base), 1.0)])  # measured peaks 10% above the profile's
    assert e.budget_range == pytest.approx((1.1 * (lowest + 0.25 * (base - lowest)),
                                            1.1 * (lowest + 0.5 * (base - lowest))), abs=2)
    with pytest.raises(ValueError, match="0 <= low <= high <= 1"):
        CheckpointEnv(prof, BudgetShare(0.5, 1.5))


def test_a_plan_fits_its_own_predicted_peak_in_the_masks_as_in_the_reward() -> None:
    """The masks compare a budget with peaks in measured bytes as the reward does: a plan at
    exactly its own predicted peak is never masked (rounding the scaled peak down masked the
    teacher's plan at its own budget, and cloning then fitted actions the policy could not take)."""
    prof = layered_profile(6, seed=5)
    cm = CostModel(prof)
    e = CheckpointEnv(prof, None)
    base = cm.peak_bytes([0] * 6)
    e.add_measurements([([0] * 6, round(base * 1.0020967598), 1.0)])
    ratio = e.correction.peak_ratio
    plans = [list(p.plan) for p in exact_frontier(cm)]
    rounded_down = [p for p in plans if e.correction.scaled_peak(cm.peak_bytes(p)) < cm.peak_bytes(p) * ratio]
    assert rounded_down  # the case that was masked
    for plan in plans:
        budget = e.correction.predict(plan)[0]
        e.reset(options={"budget_bytes": budget})
        for a in plan:
            assert e.action_masks()[a], (plan, budget)
            *_, info = e.step(a)
        assert info["feasible"] and info["peak_bytes"] == budget

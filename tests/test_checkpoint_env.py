"""CheckpointEnv: API checks, same-seed determinism, rewards, exact masks, reward modes, PPO."""

from __future__ import annotations

import itertools
import warnings

import gymnasium
import numpy as np
import pytest
import torch

import env  # noqa: F401  (registers CkptSearch-v0)
from agents.exact import exact_frontier
from env.checkpoint_env import CheckpointEnv
from env.cost_model import CostModel
from env.plan import Action
from env.profile import ModelProfile
from tests.profiles import synthetic_profile


@pytest.fixture(scope="module")
def gpt_tiny() -> ModelProfile:
    from env.profile import profile
    from env.units import find_units
    from env.workloads import load_workload

    w = load_workload("gpt/tiny")
    return profile(w, find_units(w.model), repeats=1, baseline=False)


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


@pytest.mark.parametrize("which", ["synthetic", pytest.param("gpt_tiny", marks=pytest.mark.slow)])
def test_checkers_pass_in_model_mode(which: str, request: pytest.FixtureRequest) -> None:
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    prof = synthetic_profile(6, 3, seed=11) if which == "synthetic" else request.getfixturevalue(which)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        gym_check(gymnasium.make("CkptSearch-v0", profile=prof, budget_bytes=_mid_budget(prof)).unwrapped)
        sb3_check(CheckpointEnv(prof, _mid_budget(prof)))
    assert [str(w.message) for w in record] == []


def test_make_builds_the_registered_env() -> None:
    prof = synthetic_profile(5, 3, seed=1)
    e = gymnasium.make("CkptSearch-v0", profile=prof, budget_bytes=10**6)
    obs, _ = e.reset(seed=0)
    assert isinstance(e.unwrapped, CheckpointEnv)
    assert obs.shape == (4 * 3 + 4,) and e.action_space.n == 3
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


def test_action_subset_and_observation_features() -> None:
    prof = synthetic_profile(4, 3, seed=6)
    e = CheckpointEnv(prof, 10**9, actions=[Action.KEEP, Action.SELECTIVE])
    obs, _ = e.reset()
    assert e.action_space.n == 2 and obs.shape == (12,)
    _, info = _rollout(e, [1, 1, 0, 1])
    assert info["plan"] == ["selective", "selective", "keep", "selective"]
    assert info["plan_indices"] == [2, 2, 0, 2]
    assert obs[6] == 0.0 and obs[-1] == pytest.approx(10**9 / e.baseline_peak)


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


def test_hybrid_mode_corrects_the_model_with_measurements() -> None:
    prof = synthetic_profile(4, 2, seed=9)
    cm = CostModel(prof)
    calls: list[tuple[int, ...]] = []

    def evaluator(plan: list[int]) -> tuple[int, float]:
        calls.append(tuple(plan))
        pred = cm.predict(plan)
        return int(pred.peak_bytes * 1.5), pred.step_seconds * 1.25

    e = CheckpointEnv(prof, 10**9, reward_mode="hybrid", evaluator=evaluator)
    plans = sorted(itertools.product(range(2), repeat=4), key=cm.step_seconds, reverse=True)
    infos = [_rollout(e, list(p))[1] for p in plans]  # slowest first
    # measured: the baseline, then every plan faster than the fastest measured one (all fit)
    expected = [p for p in plans if cm.step_seconds(p) < cm.step_seconds((0, 0, 0, 0))]
    assert calls == [(0, 0, 0, 0)] + expected
    assert [i["measured"] for i in infos] == [p in calls for p in plans]
    assert 0 < len(expected) < len(plans) - 1
    e2 = CheckpointEnv(prof, 10**9, reward_mode="hybrid", evaluator=evaluator)
    _rollout(e2, list(plans[-1]))  # the fastest: measured, after which nothing beats it
    reward, info = _rollout(e2, list(plans[0]))
    assert not info["measured"] and info["step_seconds"] == pytest.approx(cm.step_seconds(plans[0]) * 1.25)
    assert abs(info["peak_bytes"] - cm.peak_bytes(plans[0]) * 1.5) <= 1


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

    budget = _mid_budget(gpt_tiny)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small MLP: one thread is faster than two on a shared machine
    try:
        model = MaskablePPO("MlpPolicy", CheckpointEnv(gpt_tiny, budget), n_steps=256, batch_size=64,
                            seed=0, device="cpu", verbose=0)
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

"""PPOAgent: cloned plans are the exact frontier's, measurements move them, the driver's interface."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import numpy as np
import pytest

from agents.exact import exact_frontier
from agents.ppo import AgentConfig, PPOAgent
from bench.synthetic import layered_profile
from tests.profiles import with_chains
from env.cost.correction import MeasuredCorrection
from env.cost.cost_model import CostModel
from env.data.model_profile import ModelProfile
from env.data.plan import Action
from search.records.pareto import hypervolume, normalise


class Reward(str, Enum):
    MODEL = "model"
    HYBRID = "hybrid"


def _points(plans: list[dict]) -> set[tuple[int, float]]:
    return {(p["peak_bytes"], round(p["step_seconds"], 12)) for p in plans}


def _hv(points: list[tuple[int, float]], cm: CostModel) -> float:
    keep = [cm.action_index(Action.KEEP)] * cm.n_units
    return hypervolume(normalise(points, cm.peak_bytes(keep), cm.step_seconds(keep)))


def test_one_agent_reports_every_exact_frontier_point_on_8_units() -> None:
    prof = layered_profile(8, seed=0)
    cm = CostModel(prof)
    exact = exact_frontier(cm)
    report = PPOAgent("agent_0", prof.model_dump(mode="json"), None, seed=0, reward_mode=Reward.HYBRID).train(0)
    assert report["name"] == "agent_0" and report["timesteps"] == 0 and report["clone"]["regret"] <= 0.01
    assert {(p.peak_bytes, round(p.step_seconds, 12)) for p in exact} <= _points(report["plans"])
    assert all(p["measured"] is False for p in report["plans"])


def test_one_agent_reports_every_exact_frontier_point_with_chains_on_8_units() -> None:
    """Chains in the action space: the agent is cloned from the exact frontier over plans with chain
    regions, its plans are valid (a chain only after recompute or chain), reach the lowest exact
    point (which needs a region) and trace the frontier."""
    prof = with_chains(layered_profile(8, seed=2))
    cm = CostModel(prof)
    exact = exact_frontier(cm)
    assert cm.chain in exact[0].plan  # the lowest plan needs a region (layered seed 2: below every per-unit plan)
    report = PPOAgent("agent_0", prof.model_dump(mode="json"), None, seed=0, reward_mode=Reward.HYBRID).train(0)
    assert report["clone"]["regret"] <= 0.01
    assert all(cm.chain_error(p["actions"]) is None for p in report["plans"])
    points = _points(report["plans"])
    assert (exact[0].peak_bytes, round(exact[0].step_seconds, 12)) in points
    assert _hv(sorted(points), cm) >= 0.999 * _hv([(p.peak_bytes, p.step_seconds) for p in exact], cm)


def _slower_truth(prof: ModelProfile, seed: int) -> ModelProfile:
    """The profile with each unit's recompute/selective backward seconds scaled by 0.3x..3x: what
    measurements would show where the profile's times are off."""
    rng = np.random.default_rng(seed)
    costs = {a: [c.model_copy(deep=True) for c in prof.costs[a]] for a in prof.actions}
    for a in (Action.RECOMPUTE, Action.SELECTIVE):
        for i, c in enumerate(costs[a]):
            extra = c.bwd.seconds - prof.costs[Action.KEEP][i].bwd.seconds
            c.bwd.seconds = prof.costs[Action.KEEP][i].bwd.seconds + extra * float(rng.uniform(0.3, 3.0))
    return prof.model_copy(update={"costs": costs})


def _slowdown(plans: list[dict], cm: CostModel) -> float:
    """Mean over the exact frontier's points on ``cm`` of the fastest plan within the point's peak
    (peak and seconds from ``cm``) over the point's seconds: 1 when the plans trace the frontier."""
    points = [(cm.peak_bytes(p["actions"]), cm.step_seconds(p["actions"])) for p in plans]
    return float(np.mean([min(s for b, s in points if b <= f.peak_bytes) / f.step_seconds
                          for f in exact_frontier(cm) if any(b <= f.peak_bytes for b, _ in points)]))


def test_measurements_move_the_plans_to_the_corrected_frontier() -> None:
    prof = layered_profile(10, seed=2)
    truth = CostModel(_slower_truth(prof, seed=0))
    agent = PPOAgent("agent_0", prof, None, seed=0, reward_mode="model")
    before = agent.train(0)["plans"]
    keep = [0] * 10
    plans = [keep] + [[a if i == j else 0 for i in range(10)] for j in range(10) for a in (1, 2)]
    measured = [(p, truth.peak_bytes(p), truth.step_seconds(p)) for p in plans]
    agent.observe(measured)
    assert agent.teacher_stale
    after = agent.train(0)["plans"]
    correction = MeasuredCorrection(CostModel(prof))  # what the driver believes after these measurements
    for p, peak, seconds in measured:
        correction.add(p, peak, seconds)
    corrected = correction.corrected_model()
    assert _slowdown(after, corrected) < 1.003  # the plans follow the corrected cost model's frontier (teacher: 1.0013)
    # which is nearer the truth (1.0083 -> 1.0062 here: one measurement of each unit's change moves a unit's
    # extra seconds part of the way to the measured ones, as far as the correction's noise prior lets one do)
    assert _slowdown(after, truth) < _slowdown(before, truth) - 0.002
    by_plan = {tuple(p["actions"]): p for p in after}
    assert by_plan[tuple(keep)]["measured"]  # a measured plan is reported with its measurement
    assert by_plan[tuple(keep)]["step_seconds"] == truth.step_seconds(keep)


def test_one_budget_agent_reports_plans_that_fit_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = layered_profile(12, seed=3)
    cm = CostModel(prof)
    exact = exact_frontier(cm)
    budget = exact[len(exact) // 2].peak_bytes
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    report = PPOAgent("agent_1", prof, budget, seed=1, reward_mode="model").train(256)
    assert not list(tmp_path.glob("SB3-*")), "an agent without a TensorBoard folder wrote a log folder anyway"
    fitting = [p for p in report["plans"] if p["peak_bytes"] <= budget]
    assert 0 < report["timesteps"] <= 256  # whole rollouts (8 episodes of 12 units), never more than asked
    assert fitting and report["episodes"] >= report["timesteps"] // 12
    fastest = min(p["step_seconds"] for p in fitting)
    assert fastest <= exact[len(exact) // 2].step_seconds * 1.001


def test_measured_mode_measures_episodes_only(tmp_path: Path) -> None:
    prof = layered_profile(6, seed=4)
    cm = CostModel(prof)
    calls: list[tuple[int, ...]] = []

    def measure(plan: list[int]) -> tuple[int, float]:
        calls.append(tuple(plan))
        return cm.peak_bytes(plan), 1.1 * cm.step_seconds(plan)

    save = tmp_path / "agent.zip"
    agent = PPOAgent("agent_2", prof, None, seed=2, reward_mode="measured", measure_fn=measure,
                     tb_dir=str(tmp_path / "tb"), save_path=str(save), config=AgentConfig(episodes_per_rollout=4))
    report = agent.train(48)
    assert len(calls) == len(set(calls)) and calls[0] == (0,) * 6  # the baseline first, each plan once
    assert report["episodes"] >= 48 // 6 and len(calls) <= report["episodes"] + 1
    measured = [p for p in report["plans"] if p["measured"]]
    assert measured and all(tuple(p["actions"]) in calls for p in measured)
    assert all(p["step_seconds"] == pytest.approx(1.1 * cm.step_seconds(p["actions"])) for p in measured)
    assert save.is_file() and list((tmp_path / "tb").glob("agent_2_*/events.out.tfevents.*"))
    again = PPOAgent("agent_2", prof, None, seed=2, reward_mode="measured", measure_fn=measure, save_path=str(save))
    assert again.model.num_timesteps == report["timesteps"]  # a restarted actor goes on from the saved policy


def _off_frontier_plan(cm: CostModel, front: list, rng: np.random.Generator) -> tuple[tuple[int, ...], int, float]:
    """A plan the cost model prices over 2% slower than the frontier at its peak, near the middle of
    the frontier: (plan, its peak, the frontier's fastest seconds at that peak)."""
    mid = front[len(front) // 2].peak_bytes
    while True:
        q = tuple(int(a) for a in rng.integers(0, len(cm.profile.actions), cm.n_units))
        peak = cm.peak_bytes(list(q))
        fits = [f.step_seconds for f in front if f.peak_bytes <= peak]
        if fits and cm.step_seconds(list(q)) > 1.02 * fits[-1] and abs(peak - mid) < 0.1 * mid:
            return q, peak, fits[-1]


def test_the_teacher_prices_measured_plans_as_measured_and_takes_up_incumbents() -> None:
    """A plan measured faster than the teacher's plans at its memory is demonstrated (when it may
    be), and a solver plan measured slower is priced at its measurement, as the reward prices it.
    Before, the teacher was the exact frontier of the corrected model, an additive fit that smooths
    over single measurements: neither moved it."""
    from agents.imitation import teacher_frontier
    from env.gym.checkpoint_env import CheckpointEnv

    prof = layered_profile(10, seed=2)
    cm = CostModel(prof)
    front = exact_frontier(cm)
    q, peak, best = _off_frontier_plan(cm, front, np.random.default_rng(0))
    slow = front[len(front) // 3]
    truth = [(tuple(p.plan), p.peak_bytes, p.step_seconds * (1.05 if p is slow else 1.0)) for p in front]
    env = CheckpointEnv(profile=prof, budget_bytes=None, reward_mode="model")
    env.add_measurements(truth + [(q, peak, 0.98 * best)])
    plain, taught = teacher_frontier(env, 0.0, 1e-5), teacher_frontier(env, 0.0, 1e-5, [q])
    assert q not in {p.plan for p in plain} and q in {p.plan for p in taught}
    measured = env.correction.measured
    for f in (plain, taught):
        assert all(p.step_seconds == measured[p.plan][1] for p in f if p.plan in measured)
        assert all(p.step_seconds != pytest.approx(slow.step_seconds) for p in f if p.plan == slow.plan)


def test_an_agent_proposes_the_incumbents_it_may_and_never_a_rules_plan() -> None:
    prof = layered_profile(10, seed=2)
    cm = CostModel(prof)
    front = exact_frontier(cm)
    q, peak, best = _off_frontier_plan(cm, front, np.random.default_rng(0))
    measured = [(list(p.plan), p.peak_bytes, p.step_seconds) for p in front] + [(list(q), peak, 0.98 * best)]
    plans = {}
    for teach in (True, False):
        agent = PPOAgent("agent_0", prof, None, seed=0, reward_mode="model")
        agent.observe(measured, [True] * len(front) + [teach])
        plans[teach] = {tuple(p["actions"]) for p in agent.train(0)["plans"]}
    assert q in plans[True] and q not in plans[False]
    with pytest.raises(ValueError, match="give one each"):
        agent.observe(measured, [True])

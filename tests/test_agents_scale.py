"""Budget-conditioned agents reach the exact frontier on a 64-unit profile of varied units.

The yardstick is the exact frontier's hypervolume on the cost model (baseline-normalised axes,
``search.records.pareto.REFERENCE``). The exact solver needs ~2 minutes on this profile (4903 frontier
points), so its hypervolume is a constant here, computed with::

    python -c "from bench.synthetic import layered_profile; from env.cost.cost_model import CostModel; \
from agents.exact import exact_frontier; from search.records.pareto import hypervolume, normalise; \
cm = CostModel(layered_profile(64, 0)); b = [0] * 64; f = exact_frontier(cm); \
print(len(f), hypervolume(normalise([(p.peak_bytes, p.step_seconds) for p in f], cm.peak_bytes(b), cm.step_seconds(b))))"

and the test checks that the profile is still the one it was computed on.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.baselines import baseline_rules
from agents.ppo import PPOAgent
from bench.synthetic import layered_profile
from env.cost.cost_model import CostModel
from search.records.pareto import hypervolume, nondominated, normalise

N_UNITS = 64
EXACT_HV = 0.4474281553425363  # 4903 points
EXACT_LOWEST = (217892759, 1.6944750068361512)  # the frontier's lowest-peak point (bytes, seconds)
BASELINE = (340017173, 1.5416899624754155)  # all-keep (bytes, seconds)


def dominated_by(front: np.ndarray, point: np.ndarray) -> bool:
    """Some point of ``front`` is no worse than ``point`` in both memory and time."""
    return bool(np.any((front[:, 0] <= point[0]) & (front[:, 1] <= point[1])))


@pytest.mark.slow
def test_agents_plans_reach_the_exact_frontier_on_64_units() -> None:
    prof = layered_profile(N_UNITS, seed=0)
    cm = CostModel(prof)
    keep = [prof.actions.index(a) for a in prof.actions][:1] * N_UNITS
    assert (cm.peak_bytes(keep), cm.step_seconds(keep)) == pytest.approx(BASELINE), \
        "layered_profile changed: recompute EXACT_HV and EXACT_LOWEST with the command in the docstring"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        agent = PPOAgent("agent_0", prof, None, seed=0, reward_mode="model")
        report = agent.train(2048)
    finally:
        torch.set_num_threads(threads)
    plans = report["plans"]
    assert report["timesteps"] >= 2048 and report["episodes"] >= 2048 // N_UNITS
    for p in plans:  # the report's numbers are the cost model's for its plan
        assert (p["peak_bytes"], p["step_seconds"]) == pytest.approx(
            (cm.peak_bytes(p["actions"]), cm.step_seconds(p["actions"])))
    points = normalise([(p["peak_bytes"], p["step_seconds"]) for p in plans], *BASELINE)
    ratio = hypervolume(points) / EXACT_HV
    assert ratio >= 0.99, f"agents' plans reach {ratio:.4f} of the exact frontier's hypervolume"
    assert min(p["peak_bytes"] for p in plans) <= EXACT_LOWEST[0] * 1.01  # the low end is covered
    front = points[nondominated(points)]
    rules = baseline_rules(N_UNITS, prof.actions, seed=0)
    beyond = [name for name, plan in rules.items()
              if not dominated_by(front, normalise([(cm.peak_bytes(plan), cm.step_seconds(plan))], *BASELINE)[0])]
    assert beyond == [], f"rules beyond the agents' frontier: {beyond}"

"""Agents hosted in one process (``search.engine.agent_pool.AgentProcess``) learn exactly what each learns alone:
each runs its calls on its own random state."""

from __future__ import annotations

import torch

from search.engine.agent_pool import AgentProcess
from tests.profiles import synthetic_profile


def _trained(process: AgentProcess, names: list[str], rounds: int = 2) -> dict[str, dict[str, torch.Tensor]]:
    for _ in range(rounds):
        for name in names:  # the agents' rounds interleave, as a search's calls do on a shared process
            process.call(name, "train", 64)
    return {n: {k: v.clone() for k, v in process._agents[n].model.policy.state_dict().items()} for n in names}


def test_two_agents_in_one_process_learn_what_each_learns_alone() -> None:
    profile = synthetic_profile(4, 2, seed=0).model_dump(mode="json")
    shared = AgentProcess("agents.ppo", "PPOAgent", niceness=0)
    alone = {n: AgentProcess("agents.ppo", "PPOAgent", niceness=0) for n in ("agent_0", "agent_1")}
    for i, name in enumerate(["agent_0", "agent_1"]):
        shared.build(name, profile, None, i, "model")
        alone[name].build(name, profile, None, i, "model")
    together = _trained(shared, ["agent_0", "agent_1"])
    for name, process in alone.items():
        by_itself = _trained(process, [name])[name]
        assert by_itself.keys() == together[name].keys()
        assert all(torch.equal(by_itself[k], together[name][k]) for k in by_itself), name
    # and they did learn: two seeds, two policies
    assert not all(torch.equal(together["agent_0"][k], together["agent_1"][k]) for k in together["agent_0"])

"""One budget-conditioned PPO agent per micro-batch of the ladder: the alternative design of the throughput search.

Each agent (``agents.ppo.PPOAgent``) learns on the profile fitted at its micro-batch
(``env.cost.batch_fit``), over the budgets between the lowest and highest memory cap that its
micro-batch can reach: it answers "the fastest plan under this cap at this micro-batch", and the
caller takes the micro-batch whose answer trains the most samples per second. The measurements
taken at a micro-batch go to its agent (``observe``), which corrects its cost model as in the
hybrid search. The search runs one agent conditioned on the micro-batch as well as the budget
instead (``agents.batch_conditioned``): ``bench/throughput.py --agents`` measured the two (docs/throughput.md)."""

from __future__ import annotations

from typing import Any, Sequence

from agents.ppo import AgentConfig, PPOAgent
from env.cost.headroom import lowest_and_keep_peak
from env.data.model_profile import ModelProfile
from env.data.types import Indices


def reachable_range(profile: ModelProfile, budgets: Sequence[int]) -> tuple[int, int] | None:
    """The budgets' span clipped to the peaks the profile's plans reach; None when no budget lies between
    its lowest peak and its all-keep peak (then every plan fits them, or none does)."""
    lowest, keep = lowest_and_keep_peak(profile)
    low, high = max(min(budgets), lowest), min(max(budgets), keep)
    return (low, high) if low <= high else None


class MicroBatchAgents:
    """``agents[b]``: the agent of micro-batch ``b``, trained on ``profiles[b]`` over ``budgets[b]`` (bytes)."""

    def __init__(self, profiles: dict[int, ModelProfile], budgets: dict[int, Sequence[int]], seed: int = 0,
                 config: AgentConfig | None = None) -> None:
        self.profiles = profiles
        self.agents: dict[int, PPOAgent] = {}
        for b, profile in sorted(profiles.items()):
            span = reachable_range(profile, budgets[b])
            if span is not None:
                self.agents[b] = PPOAgent(f"micro_batch_{b}", profile, budget_bytes=span, seed=seed + b,
                                          reward_mode="model", config=config)

    def observe(self, micro_batch: int, measured: Sequence[tuple[Indices, int, float]]) -> None:
        """Plans measured at ``micro_batch`` (indices, peak bytes, step seconds): its agent's correction."""
        if micro_batch in self.agents and measured:
            self.agents[micro_batch].observe([(list(p), peak, s) for p, peak, s in measured])

    def train(self, timesteps: int) -> dict[int, dict[str, Any]]:
        """Every agent trains ``timesteps`` PPO steps (after cloning the exact solver's plans); their reports."""
        return {b: agent.train(timesteps) for b, agent in self.agents.items()}

    def plans(self, budgets: dict[int, Sequence[int]]) -> dict[int, list[Indices]]:
        """Per micro-batch, its agent's plan at each of its budgets (those outside its range: its nearest end)."""
        out: dict[int, list[Indices]] = {}
        for b, agent in self.agents.items():
            low, high = agent.env.budget_range
            asked = sorted({min(max(int(x), low), high) for x in budgets[b]})
            out[b] = list(agent.plans_at(asked))
        return out

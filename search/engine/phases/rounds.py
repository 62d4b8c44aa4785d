"""The agents' rounds: each trains a chunk of timesteps, proposes plans, and the plans that could
join their frontier are measured; after training, the answer rounds."""

from __future__ import annotations

import math
from typing import Any, Callable

from env.data.types import Indices, PlanSource, RewardMode
from search.engine.context import RunContext
from search.engine.progress import RoundStatus
from search.records import meta
from search.records.ranking import timing_noise

ANSWER_ROUNDS = 2  # hybrid reward, after training: rounds in which the agents answer the last measurements


def train_rounds(ctx: RunContext, on_round: Callable[[RoundStatus], None] | None = None) -> None:
    """Rounds until every agent has its timesteps: every live agent trains ``chunk_timesteps`` more
    steps (on the cost model in model/hybrid mode; in measured mode each new plan is measured through
    an Evaluator), its plans are recorded with their predictions, in hybrid mode the plans that could
    join the frontier are measured (while the agents wait, unless measurements overlap training) and
    go back to the agents, whose reward corrects the cost model, and the frontier is snapshotted into
    the store. Then the last round's plans are measured with what budget is left."""
    cfg, ledger = ctx.cfg, ctx.ledger
    ledger.snapshot()
    while ctx.agents.running:
        with ctx.clock.phase("training"):
            reports = ctx.agents.train_round()
        propose_reports(ctx, reports)
        if cfg.reward == RewardMode.HYBRID:
            with ctx.clock.phase("measuring"):
                measure_round(ctx)
        if cfg.reward == RewardMode.MEASURED:
            ctx.measurer.drain()  # the agents' own measurements
        ledger.snapshot()
        if on_round:
            on_round(RoundStatus(cfg.workload, ctx.agents.slots, cfg.timesteps, ledger.store.snapshots()[-1]))
    with ctx.clock.phase("measuring"):
        measure_round(ctx, final=True)


def answer_rounds(ctx: RunContext) -> None:
    """Hybrid reward, after the agents' timesteps, while measurements are left (at most
    ``ANSWER_ROUNDS``): the agents take in what the last round measured, clone the teacher on the
    corrected model once more without PPO steps (``AgentPool.train_round(answer=True)``), and the
    plans they propose that are not measured yet are measured as in a round. Else the last round's
    measurements never reach an agent, and a search whose agents' proposals were all measured
    leaves its budget unspent (see docs/measurement.md#ranking-and-drift-why). Store meta
    ``answer_rounds``: per round, the plans new to the pool and how many were measured."""
    if ctx.cfg.reward != RewardMode.HYBRID:
        return
    rounds: list[meta.AnswerRound] = []
    for _ in range(ANSWER_ROUNDS):
        before = ctx.n_measured
        if before >= ctx.max_measurements:
            break
        proposed = propose_reports(ctx, ctx.agents.train_round(answer=True))
        if proposed:
            measure_round(ctx, final=True)
            ctx.ledger.snapshot()
        rounds.append({"proposed": proposed, "measured": ctx.n_measured - before})
        ctx.ledger.store.write(meta.ANSWER_ROUNDS, rounds)
        if not proposed:
            break


def propose_reports(ctx: RunContext, reports: list[dict[str, Any]]) -> int:
    """The agents' reported plans into the ledger; how many of them are not measured yet."""
    ledger = ctx.ledger
    fresh = set()
    for rep in reports:
        agent = PlanSource(rep["name"])
        for p in rep["plans"]:
            idx = tuple(p["actions"])
            if agent not in ledger.proposers(idx):
                ledger.propose(idx, agent)
            if ledger.codec.digest(idx) not in ledger.archive.measured:
                fresh.add(idx)
    return len(fresh)


def measure_round(ctx: RunContext, final: bool = False) -> None:
    """A round's share of the measurements left (``final``: all of them) spent on the candidates
    (``Ledger.candidates``, within the run's timing noise of the agents' rivals); in hybrid mode what
    was measured goes to the agents. Overlapped, they are measured while the next round trains and
    reach the agents a round later."""
    ledger, agents = ctx.ledger, ctx.agents
    arrived = ctx.measurer.collect()  # overlapped: last round's measurements, taken while the agents trained
    if arrived and ctx.cfg.reward == RewardMode.HYBRID:
        agents.feed(arrived)
    room = ctx.max_measurements - ctx.n_measured
    limit = room if final else max(1, math.ceil(room / (agents.rounds_left() + 1)))
    candidates = ledger.candidates(min(limit, room), margin=timing_noise(ledger.points()))
    picked = [(p, _proposer(ctx, p)) for p in candidates]
    if ctx.measurer.overlap and not final:
        ctx.measurer.measure_meanwhile(picked)
        return
    measured = ctx.measurer.measure(picked)
    if ctx.cfg.reward == RewardMode.HYBRID:
        agents.feed(measured)


def _proposer(ctx: RunContext, idx: Indices) -> PlanSource:
    """Who proposed a candidate first (every candidate was proposed: ``Ledger.propose``)."""
    return ctx.ledger.proposers(idx)[0]

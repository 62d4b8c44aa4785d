"""The cost model's optimal frontier: a yardstick, with warm start the agents' first candidates,
and the span of peaks the agents' budgets are spread over."""

from __future__ import annotations

from agents.exact import exact_frontier
from env.data.plan import Action
from env.data.types import Indices, PlanSource
from search.engine.archive import spread_picks
from search.engine.phases.context import RunContext
from search.records import meta

EXACT_UNITS = 48  # more units: the exact solver's frontier merged to 0.5% steps


def exact_relative(n_units: int) -> float:
    """The exact solver's ``relative`` step for a search of ``n_units``: exact up to EXACT_UNITS;
    beyond, labels within 0.5% of each other merge (``agents.exact``), which keeps nearly all of the
    exact hypervolume in a fraction of the time (see docs/measurement.md#ranking-and-drift-why)."""
    return 0.0 if n_units <= EXACT_UNITS else 0.005


def solve_exact(ctx: RunContext) -> list[Indices]:
    """The cost model's optimal frontier (store meta ``exact``, ``exact_relative``). Its plans join
    the candidates only with warm start, so that without it every plan the agents measure is the
    agents' own find."""
    ledger = ctx.ledger
    relative = exact_relative(ledger.codec.n_units)
    points = [tuple(p.plan) for p in exact_frontier(ledger.setup.cost_model, relative=relative)]
    ledger.store.write(meta.EXACT_RELATIVE, relative)
    ledger.store.write(meta.EXACT, [ledger.codec.digest(p) for p in points])
    if ctx.cfg.warm_start:
        for p in points:
            ledger.propose(p, PlanSource.EXACT)
    return points


def measure_warm_start(ctx: RunContext, exact: list[Indices]) -> None:
    """With warm start, up to half the measurements left (at least two) spent on exact plans spread over memory."""
    if not ctx.cfg.warm_start:
        return
    room = max(0, ctx.max_measurements - ctx.n_measured)
    ctx.measurer.measure([(p, PlanSource.EXACT) for p in spread_picks(exact, min(room, max(2, room // 2)))])


def budgets(ctx: RunContext, exact: list[Indices]) -> list[int]:
    """One budget per agent, evenly from the lowest reachable peak to the baseline's."""
    cm = ctx.ledger.setup.cost_model
    lo = min(cm.peak_bytes(list(p)) for p in exact)
    hi = cm.peak_bytes(list(ctx.ledger.codec.uniform(Action.KEEP)))
    k = ctx.cfg.agents
    return [int((lo + hi) / 2)] if k == 1 else [int(lo + (hi - lo) * i / (k - 1)) for i in range(k)]

"""The cost model's optimal frontier: a yardstick, with warm start the agents' first candidates,
and the span of peaks the agents' budgets are spread over."""

from __future__ import annotations

from typing import Callable

from agents.exact import exact_frontier
from env.data.plan import Action
from env.data.types import Indices, PlanSource
from search.engine.archive import spread_picks
from search.engine.context import RunContext
from search.records import meta

AIM_MARGIN = 0.01
"""Warm start aims this share below each peer's peak: a plan measured just above a peer's peak is no answer to
it, and the corrected cost model's peaks err by about this much (docs/measurement.md, "Warm start aims at the
peers")."""

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
    """With warm start, up to half the measurements left (at least two) spent on exact plans
    (``warm_start_picks``): first those aimed at the measured peers' peaks, then plans spread over memory.
    The aim is taken on the cost model corrected by the plans measured so far (the rules): the profile alone
    misprices chain regions by more than the gap between a peer's peak and the plans near it
    (docs/measurement.md, "Warm start aims at the peers")."""
    if not ctx.cfg.warm_start:
        return
    room = max(0, ctx.max_measurements - ctx.n_measured)
    ledger = ctx.ledger
    peaks = [m.peak_bytes for m in ledger.peers().values() if not m.oom]
    exact = [p for p in exact if not ledger.recomputes_condemned(p)]  # the correctness gate refused their units
    measured = {p for p in exact if ledger.codec.digest(p) in ledger.archive.measured}
    picks = warm_start_picks(ledger.corrected().predict, exact, peaks, min(room, max(2, room // 2)), measured)
    ctx.measurer.measure([(p, PlanSource.EXACT) for p in picks])


def warm_start_picks(predict: Callable[[Indices], tuple[int, float]], exact: list[Indices], peer_peaks: list[int],
                     n: int, measured: set[Indices] = frozenset()) -> list[Indices]:
    """At most ``n`` exact plans to measure: first those ``aimed_picks`` aims at the peers' peaks, then plans
    spread over memory. Spread picks alone can leave a gap at a peer's memory that the agents' budgets miss
    (docs/measurement.md, "Warm start aims at the peers")."""
    aimed = aimed_picks(predict, exact, peer_peaks, measured)[:n]
    return aimed + spread_picks([p for p in exact if p not in aimed], n - len(aimed))


def aimed_picks(predict: Callable[[Indices], tuple[int, float]], exact: list[Indices], peer_peaks: list[int],
                measured: set[Indices] = frozenset()) -> list[Indices]:
    """For each peer peak, lowest first, the exact plan ``predict`` (a plan's peak bytes and step seconds) gives
    the shortest step within it, less ``AIM_MARGIN`` (the plan that answers that peer at its own memory), unless
    measured already or picked for a lower peak."""
    points = [(*predict(p), p) for p in exact]
    aimed: list[Indices] = []
    for peak in sorted(peer_peaks):
        within = [(seconds, p) for bytes_, seconds, p in points if bytes_ <= peak * (1 - AIM_MARGIN)]
        best = min(within, default=None, key=lambda x: x[0])
        if best is not None and best[1] not in aimed and best[1] not in measured:
            aimed.append(best[1])
    return aimed


def budgets(ctx: RunContext, exact: list[Indices]) -> list[int]:
    """One budget per agent, evenly from the lowest reachable peak to the baseline's."""
    cm = ctx.ledger.setup.cost_model
    lo = min(cm.peak_bytes(list(p)) for p in exact)
    hi = cm.peak_bytes(list(ctx.ledger.codec.uniform(Action.KEEP)))
    k = ctx.cfg.agents
    return [int((lo + hi) / 2)] if k == 1 else [int(lo + (hi - lo) * i / (k - 1)) for i in range(k)]

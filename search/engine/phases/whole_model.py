"""``--compile-scope both``: a regional search's frontier, rules and exact plans, measured with the whole model
compiled.

A compiled search measures its plans with each unit compiled on its own (``units``): every unit's variant
compiles once and every plan reuses it, so a plan costs about an eager measurement. A user who compiles
the whole model (``apply_plan(model, plan); torch.compile(model)``) gets another step: the compiler fuses
across units and keeps its layout between them (docs/measurement.md, "Compiled steps"), but it may save more
around a region. So after the search, each plan of the frontier, each rule
and each exact plan measured, is measured once more with the whole model compiled, a compile each, by the same
Evaluators and paired with their references as a plan is; the report's frontier takes each plan the
way that is faster at its memory (``search.engine.shown.Shown``), and each point says which
(``compile_scope``). Then, for each peer that no plan measured either way answers, the exact plan priced
fastest within its peak is measured both ways (``aim_at_peers``).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from env.cost.correction import MeasuredCorrection
from env.data.codec import PlanCodec
from env.data.measured import MeasuredPlan
from env.data.types import Indices, PlanSource
from search.engine.batch_book import Job
from search.engine.context import RunContext
from search.engine.shown import Shown
from search.engine.phases.exact import aimed_picks
from search.records import meta
from search.records.pareto import fastest_within

AIMED_MOST = 4  # exact plans measured whole-model at the peers no measured plan answers, a compile each


def whole_model_pass(ctx: RunContext, exact: Sequence[Indices] = ()) -> int:
    """Measure whole-model the plans of the frontier shown and of the store's, the measured rules and the
    measured plans of the exact frontier, those not measured so yet (a resumed run did some), then the plans
    ``aim_at_peers`` picks, both ways; returns how many. The rules and the exact plans spread over the memory
    range, because the whole-model compile reorders plans: a plan off the regional frontier can be the fastest
    at its memory compiled whole (docs/measurement.md, "Compiled steps", gives the plans that were)."""
    ledger = ctx.ledger
    done = set(ledger.store.read(meta.WHOLE_MODEL))
    shown = Shown.of(ledger)
    measured = ledger.archive.measured
    spread = [*ledger.store.read(meta.RULES).values(), *ledger.store.read(meta.EXACT)]  # over the whole memory range
    plans = ([r for r, scope in zip(shown.front, shown.scopes) if scope != "model"] + ledger.frontier()
             + [measured[d] for d in spread if d in measured])
    todo = list({r.digest: r for r in plans if r.digest not in done and not r.oom}.values())
    _measure_whole(ctx, [Job(tuple(r.actions), source=r.source) for r in todo])
    aimed = aim_at_peers(ctx, exact)
    if aimed:  # measured unit by unit too: every plan measured whole is a plan of the search
        ctx.measurer.measure([(p, PlanSource.EXACT) for p in aimed])
        _measure_whole(ctx, aimed_jobs(ledger.codec, aimed))
    return len(todo) + len(aimed)


def aim_at_peers(ctx: RunContext, exact: Sequence[Indices]) -> list[Indices]:
    """Exact plans not measured whole-model yet, at most ``AIMED_MOST``: for each peer that no plan measured either
    way answers (``unanswered``), the one priced fastest within its peak (``aimed_picks``) by the cost model
    corrected by the plans measured whole-model. The pass's plans come from a search that ranked them compiled
    unit by unit, and compiled whole a plan's peak and time move (selective keeps less around a region), so the
    pass alone can leave a peer's memory with no plan measured near it (docs/measurement.md, "Compiled steps")."""
    ledger, codec = ctx.ledger, ctx.ledger.codec
    whole = ledger.whole_model()
    peaks = unanswered(ledger.peers().values(), [*ledger.points(), *whole])
    if not whole or not peaks:
        return []
    correction = MeasuredCorrection(ledger.setup.cost_model)
    for m in whole:
        correction.add(codec.indices(m.actions), m.peak_bytes, m.step_seconds)
    done = {codec.indices(m.actions) for m in whole}
    return aimed_picks(correction.predict, list(exact), peaks, done)[:AIMED_MOST]


def aimed_jobs(codec: PlanCodec, aimed: Sequence[Indices]) -> list[Job]:
    """The whole-model jobs of the aimed plans: each plan's action names and its source (the exact solver's)."""
    return [Job(tuple(codec.names(p)), source=PlanSource.EXACT) for p in aimed]


def unanswered(peers: Iterable[MeasuredPlan], ours: Sequence[MeasuredPlan]) -> list[int]:
    """The peaks of the ``peers`` that none of ``ours`` answers: the fastest of ours at no more memory (as the
    report sets each peer beside, ``fastest_within``) is slower, or none peaks that low."""
    ran = [m for m in ours if not m.oom]
    peaks, seconds = [m.peak_bytes for m in ran], [m.step_seconds for m in ran]
    out = []
    for p in peers:
        if p.oom:
            continue
        best = fastest_within(peaks, seconds, p.peak_bytes)
        if best is None or seconds[best] > p.step_seconds:
            out.append(p.peak_bytes)
    return out


def _measure_whole(ctx: RunContext, jobs: list[Job]) -> None:
    if jobs:
        ctx.measurer.pool.run_jobs(jobs, lambda handle, job, killed: handle.evaluate_whole_model.remote(
                                       list(job.item), job.source, killed),
                                   on_result=ctx.ledger.record_whole_model)
        ctx.measurer.drain()  # the references measured between them

"""The deciding passes at the end of a search, and the references closed after them.

The plans that decide the frontier and the agents' own frontier (``deciding``: those frontiers and
the frontier's near misses) are measured once each, in peak order, then again in reverse order, and from
then on each plan those passes took or let onto a frontier is measured until it has
``DECIDING_MEASUREMENTS`` of them, until every plan on either frontier has them: no plan is
measured more often than that in the passes, so they end, and no frontier plan is left ranked on
measurements the passes did not take (with at most four passes and the references closed after
them, a gpt/tiny search ended with a frontier plan ranked on its one measurement from before the
passes). The references closed after the passes move the last plans' ranks too, so the passes go on
after them while a frontier plan lacks its measurements. Near misses are taken in the
first pass only: taken again after each pass, as the new measurements moved the frontiers, they
doubled the passes (gpt/small: 22 plans measured twice where 12 were taken first) for plans that
had missed the frontier once already. Every plan measured in them is ranked on those measurements alone
(``search.records.ranking.Ranking``, from ``Ledger.decide_from_here``): side by side, the order the
passes give is the order a quote gives, where a frontier selected on one noisy median is its
luckiest plans and plans measured minutes apart are ranked through a drift that pairing removes
only when it moves every plan alike (see docs/measurement.md#ranking-and-drift-why).
"""

from __future__ import annotations

from typing import Sequence

from env.data.types import PlanSource, SourceKind
from search.engine.phases.context import RunContext
from search.records import meta
from search.records.ranking import timing_noise

DECIDING_MEASUREMENTS = 2  # the deciding passes measure each plan that decides a frontier this often, side by side


def deciding_passes(ctx: RunContext) -> None:
    """The passes, as the module says, and the closing references after them (``close_references``);
    when those move a plan the passes did not take onto a frontier, more passes, then references
    again. Store meta ``remeasured``: the passes' digests, in order; ``deciding_passes``: each pass's."""
    noise = timing_noise(ctx.ledger.points())
    ctx.ledger.decide_from_here()
    done: list[str] = []
    passes: list[list[str]] = []
    closed = False
    while True:  # ends: each pass measures a measured plan that the passes measured less than DECIDING_MEASUREMENTS
        known = ctx.ledger.archive.measured
        todo = [d for d in dict.fromkeys([*done, *deciding(ctx, noise, near=not passes)])
                if d in known and done.count(d) < DECIDING_MEASUREMENTS]
        if not todo:
            if closed or not close_references(ctx):
                break
            closed = True
            continue
        closed = False
        before = len(done)
        done = _remeasure(ctx, todo[::-1] if len(passes) % 2 else todo, done)
        passes.append(done[before:])
        ctx.ledger.store.write(meta.DECIDING_PASSES, passes)


def deciding(ctx: RunContext, noise: float, near: bool = True) -> list[str]:
    """The plans that decide the frontiers as ranked now: the frontier of all plans, with ``near``
    the plans that missed it by less than ``noise`` (``ParetoArchive.contenders``; the rules
    among them), the agents' own frontier, and the baseline; by frontier, then peak. The agents'
    near misses are left out: they decide only how the agents are judged (their own frontier's
    hypervolume), not what a user is shown."""
    ledger = ctx.ledger
    plans = [r.digest for r in ledger.frontier() + (ledger.contenders(noise) if near else [])
             + ledger.frontier((SourceKind.AGENT,))]
    return list(dict.fromkeys([*plans, ledger.store.read(meta.BASELINE_DIGEST)]))


def close_references(ctx: RunContext) -> bool:
    """With references on, the baseline once more on every live Evaluator after the deciding passes,
    so that the plans those passes measured last have a reference after them as well as before
    (``Ranking`` takes each measurement against the references nearest to it, on both sides).
    Whether it measured."""
    base = ctx.ledger.baseline()
    if not ctx.cfg.reference_every or ctx.cfg.compiles_per_plan or base is None:
        return False
    ctx.measurer.on_each(base.actions, PlanSource.rule("none"))
    return True


def _remeasure(ctx: RunContext, todo: Sequence[str], done: list[str]) -> list[str]:
    """``todo`` (digests of measured plans) measured once more each, in that order; ``done`` with them."""
    known = ctx.ledger.archive.measured
    ctx.ledger.store.write(meta.REMEASURED, [*done, *todo])
    ctx.measurer.measure([(ctx.ledger.codec.indices(known[d].actions), PlanSource(known[d].source)) for d in todo],
                         again=True)
    return [*done, *todo]

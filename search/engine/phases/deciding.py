"""The deciding and confirming passes at the end of a search, and the references closed after them.

Deciding: the plans that decide the frontier and the agents' own frontier (``deciding``: those
frontiers and the frontier's near misses) are measured once each, in peak order, and then each plan
a pass let onto a frontier, until every plan on either frontier has ``DECIDING_MEASUREMENTS`` of
them: no plan is measured more often than that in the passes, so they end, and no frontier plan is
left ranked on measurements the passes did not take. The references closed after the passes move the
last plans' ranks too, so the passes go on after them while a frontier plan lacks its measurements.
Near misses are taken in the first pass only: a plan that missed the frontier once is not taken again
as later measurements move the frontiers. Every plan measured in them is ranked on those measurements
alone (``search.records.ranking.Ranking``, from ``Ledger.decide_from_here``): side by side, the order
the passes give is the order a quote gives, where plans measured minutes apart are ranked through a
drift that pairing removes only when it moves every plan alike.

Confirming (``confirming_passes``): a frontier chosen on measurements is made of the plans whose
measurements were lucky, so the times that chose it are not the times a user gets. The plans on the
frontier are measured ``CONFIRMING_MEASUREMENTS`` times more, in peak order and then reversed, with a
reference after every few plans, and ranked and reported on those measurements alone; a plan the new
times push off the frontier is no longer shown. A plan is confirmed only where it is faster by more
than the run's timing noise than the plan kept beside it at less memory, and one the new times let
back on only where no confirmed plan at no more memory is within that noise as fast
(``search.engine.shown.confirmable``); the others add nothing a user could tell apart and are not
shown. A peer called faster or slower than its answer is measured beside it until both have
``VERDICT_MEASUREMENTS``. docs/measurement.md ("Deciding passes", "Ranking and drift: why") gives the
measurements behind each of these rules.
"""

from __future__ import annotations

from typing import Sequence

from env.data.types import PlanSource, SourceKind
from env.measure.peers import Peer
from search.engine.batch_book import Job
from search.engine.context import RunContext
from search.engine.ledger import Ledger
from search.engine.passes import Passes
from search.engine.shown import confirmable
from search.engine.phases.peers import item_key, side_by_side_peers
from search.records import meta
from search.records.peer_verdicts import VERDICT_MEASUREMENTS, peer_verdicts
from search.records.ranking import timing_noise

DECIDING_MEASUREMENTS = 1  # the deciding passes measure each plan that decides a frontier this often, side by side
CONFIRMING_MEASUREMENTS = 2  # the confirming passes measure each frontier plan this often; it is reported on them
CONFIRMING_STRETCH = 3  # the confirming passes measure a reference after at most this many plans an Evaluator


def deciding_passes(ctx: RunContext) -> None:
    """The passes, as the module says, and the closing references after them (``close_references``);
    when those move a plan the passes did not take onto a frontier, more passes, then references
    again. Store meta ``remeasured``: the passes' digests, in order; ``deciding_passes``: each pass's."""
    noise = timing_noise(ctx.ledger.points())
    for key in (meta.CONFIRMED_FROM, meta.CONFIRMED, meta.CONFIRMING_NOISE):  # a resumed run confirms again
        ctx.ledger.store.write(key, None)
    ctx.ledger.decide_from_here()
    passes = Passes(ctx.measurer, journal=lambda keys: ctx.ledger.store.write(meta.REMEASURED, keys))
    closed = False
    while True:  # ends: each pass measures a measured plan that the passes measured less than DECIDING_MEASUREMENTS
        known, done = ctx.ledger.archive.measured, passes.done
        todo = side_by_side_peers(ctx, [d for d in dict.fromkeys([*done, *deciding(ctx, noise, near=not passes.passes)])
                                        if d in known and done.count(d) < DECIDING_MEASUREMENTS],
                                  done, DECIDING_MEASUREMENTS)
        if not todo:
            if closed or not close_references(ctx):
                break
            closed = True
            continue
        closed = False
        passes.run(jobs_of(ctx, todo))
        ctx.ledger.store.write(meta.DECIDING_PASSES, passes.passes)


def confirming_passes(ctx: RunContext) -> None:
    """The passes, as the module says: every plan on the frontier of all plans but the baseline (whose measurements
    are the references) measured until it has ``CONFIRMING_MEASUREMENTS`` in them, a pass at a time, alternating
    peak order and its reverse, with a reference on every Evaluator after every ``CONFIRMING_STRETCH`` plans each,
    counted on from one pass into the next, and after the last (``close_references``; a throughput search measures
    on several, and with three plans between references in all, each of two measured one or two and then waited): a
    plan is ranked against the references nearest to it, and the machine's speed moves within a run
    (docs/measurement.md, "Ranking and drift: why"). Then each peer the passes' measurements tell apart from its
    answer (faster or slower beyond both spreads, ``peers_told_apart``) is measured beside that answer until both
    have ``VERDICT_MEASUREMENTS``, as many as a quote apart takes: two or three measurements' spreads leave a
    verdict a quote does not confirm; a pair the new times put within noise is measured no more. Its phases
    (``ctx.clock``): confirming passes, verdict rounds. Store meta ``confirmed_from`` (where they began),
    ``confirmed`` (the digests they measured, in order) and ``confirming_noise`` (the noise they chose plans by,
    which the frontier shown is chosen by too: the noise the confirming measurements give differs, and with it, a
    plan the passes left out within the old noise was shown unconfirmed)."""
    ledger = ctx.ledger
    ledger.decide_from_here(meta.CONFIRMED_FROM)
    base = ledger.store.read(meta.BASELINE_DIGEST)
    noise = timing_noise(ledger.points())
    ledger.store.write(meta.CONFIRMING_NOISE, noise)
    passes: Passes[str] = Passes(ctx.measurer, stretch=CONFIRMING_STRETCH * ctx.measurer.evaluators,
                                 between=lambda: close_references(ctx),  # per Evaluator: they share the plans
                                 journal=lambda keys: ledger.store.write(meta.CONFIRMED, keys))

    def frontier_plans(done: list[str]) -> list[str | Peer]:
        return side_by_side_peers(ctx, [r.digest for r in confirmable(ledger.points(), set(done), noise, base)
                                        if r.digest != base and done.count(r.digest) < CONFIRMING_MEASUREMENTS],
                                  done, CONFIRMING_MEASUREMENTS)

    def told_apart(done: list[str]) -> list[str | Peer]:
        return side_by_side_peers(ctx, [], done, VERDICT_MEASUREMENTS, peers_told_apart(ledger))

    for name, todo_of in (("confirming passes", frontier_plans), ("verdict rounds", told_apart)):
        with ctx.clock.phase(name):
            passes.until(lambda done: jobs_of(ctx, todo_of(done)))
            if passes.since and todo_of is told_apart:  # the last plans get a reference after them too
                close_references(ctx)


def peers_told_apart(ledger: Ledger) -> list[str]:
    """The peers a report would call faster or slower than the plans that answer them, as ranked now."""
    verdicts = peer_verdicts(ledger.peers(), ledger.frontier(), ledger.peer_plans())
    return [v.peer for v in verdicts if v.verdict in ("faster", "slower")]


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


def jobs_of(ctx: RunContext, todo: Sequence[str | Peer]) -> list[tuple[str, Job]]:
    """The passes' jobs for ``todo`` (digests of measured plans, each measured again, and peers measured as
    themselves), keyed as ``side_by_side_peers`` counts them (``item_key``)."""
    known = ctx.ledger.archive.measured
    return [(item_key(d), Job(d) if isinstance(d, Peer) else Job(tuple(known[d].actions), source=known[d].source,
                                                                   again=True)) for d in todo]

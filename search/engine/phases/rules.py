"""The baseline rules, measured as often as the frontier's plans end up: the yardsticks the agents
answer and the report judges them by."""

from __future__ import annotations

from typing import Sequence

from agents.baselines import baseline_rules
from env.data.types import PlanSource
from search.engine.measurer import PlanJob
from search.engine.phases.context import RunContext
from search.records import meta

RULES_MEASURED = ("none", "all", "every_2", "every_3", "sqrt_n", "segments_2", "all_selective")
FRONTIER_MEASUREMENTS = 3  # the rules are measured until each has this many


def measure_rules(ctx: RunContext) -> None:
    """The rules of ``RULES_MEASURED`` measured until each has ``FRONTIER_MEASUREMENTS``
    measurements (store meta ``rules``), the baseline (rule ``none``) set, and with several
    Evaluators measured on each, so that a systematically slower device shows (store meta
    ``baseline_by_evaluator``). The other rules are proposed, not measured."""
    ledger, codec = ctx.ledger, ctx.ledger.codec
    rules = baseline_rules(codec.n_units, list(codec.actions), seed=ctx.cfg.seed,
                           links=ledger.setup.profile.chain_links)
    chosen = {k: v for k, v in rules.items() if k in RULES_MEASURED}
    plans = [(tuple(v), PlanSource.rule(k)) for k, v in chosen.items()]
    measured = ctx.measurer.measure(plans)
    ledger.store.write(meta.RULES, {k: m.digest for k, m in zip(chosen, measured)})
    measure_until_frontier_count(ctx, plans)
    ledger.set_baseline(measured[list(chosen).index("none")].digest)
    if len(ctx.measurer.pool.live) > 1:
        each = ctx.measurer.on_each(codec.names(chosen["none"]), PlanSource.rule("none"))
        ledger.store.write(meta.BASELINE_BY_EVALUATOR, {
            m.evaluators[0]: {"peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds, "clock": m.clock}
            for m in each})
    for k, v in rules.items():
        if k not in chosen:
            ledger.propose(tuple(v), PlanSource.rule(k))


def measure_until_frontier_count(ctx: RunContext, plans: Sequence[PlanJob]) -> None:
    """The rules measured again, pass by pass in their order, until each has
    ``FRONTIER_MEASUREMENTS`` measurements, since a rule measured once is off its quote by several
    percent and a slow measurement puts it behind the agents' frontier (see
    docs/measurement.md#ranking-and-drift-why). A resumed run measures only what is missing."""
    ledger = ctx.ledger
    for _ in range(FRONTIER_MEASUREMENTS - 1):
        known = ledger.archive.measured
        todo = [(idx, src) for idx, src in plans if (m := known.get(ledger.codec.digest(idx))) is not None
                and not m.oom and m.n_measurements < FRONTIER_MEASUREMENTS]
        if not todo:
            return
        ctx.measurer.measure(todo, again=True)

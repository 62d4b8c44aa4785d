"""The baseline rules, measured once each at the start: the yardsticks the agents answer and the
report judges them by. The rules that decide a frontier (on it, or off it by less than the run's
timing noise) are measured again in the deciding passes, side by side with the plans they are
ranked against (``search.engine.phases.deciding``)."""

from __future__ import annotations

from agents.baselines import baseline_rules
from env.data.types import PlanSource
from search.engine.context import RunContext
from search.records import meta

RULES_MEASURED = ("none", "all", "every_2", "every_3", "sqrt_n", "segments_2", "all_selective", "all_chunked")


def measure_rules(ctx: RunContext) -> None:
    """The rules of ``RULES_MEASURED`` measured once each (store meta ``rules``), the baseline (rule
    ``none``) set, and with several Evaluators measured on each, so that a systematically slower
    device shows (store meta ``baseline_by_evaluator``). The other rules are proposed, not measured."""
    ledger, codec = ctx.ledger, ctx.ledger.codec
    rules = baseline_rules(codec.n_units, list(codec.actions), seed=ctx.cfg.seed,
                           links=ledger.setup.profile.chain_links, loss_units=ledger.setup.profile.chunk_units)
    chosen = {k: v for k, v in rules.items() if k in RULES_MEASURED}
    plans = [(tuple(v), PlanSource.rule(k)) for k, v in chosen.items()]
    measured = ctx.measurer.measure(plans)
    ledger.store.write(meta.RULES, {k: m.digest for k, m in zip(chosen, measured)})
    ledger.set_baseline(measured[list(chosen).index("none")].digest)
    if ctx.measurer.evaluators > 1:
        each = ctx.measurer.on_each(codec.names(chosen["none"]), PlanSource.rule("none"))
        ledger.store.write(meta.BASELINE_BY_EVALUATOR, {
            m.evaluators[0]: {"peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds, "clock": m.clock}
            for m in each})
    for k, v in rules.items():
        if k not in chosen:
            ledger.propose(tuple(v), PlanSource.rule(k))

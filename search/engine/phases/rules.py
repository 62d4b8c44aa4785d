"""The baseline rules, measured once each at the start: the yardsticks the agents answer and the
report judges them by. The rules that decide a frontier (on it, or off it by less than the run's
timing noise) are measured again in the deciding passes, side by side with the plans they are
ranked against (``search.engine.phases.deciding``).

The same measurements check the profile: the plans whose predicted peaks ``env.measure.profiler.check_profile``
compares with measured ones (the uniform plans, and where units chain two chained plans) are measured here,
as rules, on every Evaluator at once, and their peaks checked (``check_profile_peaks``) before anything is
built on the profile's predictions. The one-device Evaluator's eager profile leaves the check to this phase:
it measured those plans once more each on one Evaluator, which the rules measured again (on gpt/small a third
of the profile's seconds). An FSDP group's ranks each check their own profile, and so does a compiled search's
Evaluator (its rules are measured compiled; the profile is eager)."""

from __future__ import annotations

from agents.baselines import baseline_rules
from env.data.measured import MeasuredPlan
from env.data.types import Indices, PlanSource
from env.measure.profiler import checked_plans
from env.measure.trace import PeakCheck, check_peaks
from search.engine.context import RunContext
from search.records import meta

RULES_MEASURED = ("none", "all", "every_2", "every_3", "sqrt_n", "segments_2", "all_selective", "all_chunked")


def measure_rules(ctx: RunContext) -> None:
    """The rules of ``RULES_MEASURED`` measured once each (store meta ``rules``), the baseline (rule
    ``none``) set, and with several Evaluators measured on each, so that a systematically slower
    device shows (store meta ``baseline_by_evaluator``). The other rules are proposed, not measured."""
    ledger, codec = ctx.ledger, ctx.ledger.codec
    rules = baseline_rules(codec.n_units, list(codec.actions), seed=ctx.cfg.seed,
                           links=ledger.setup.profile.chain_links, loss_units=ledger.setup.profile.chunk_units,
                           spans=ledger.setup.profile.block_spans)
    chosen = {k: v for k, v in rules.items() if k in RULES_MEASURED}
    checks = profile_checks(ctx, rules)
    for name, idx in checks.items():
        chosen.setdefault(name, list(idx))
    plans = [(tuple(v), PlanSource.rule(k)) for k, v in chosen.items()]
    measured = dict(zip(chosen, ctx.measurer.measure(plans)))
    ledger.store.write(meta.RULES, {k: m.digest for k, m in measured.items()})
    check_profile_peaks(ctx, {name: measured[name] for name in checks})
    ledger.set_baseline(measured["none"].digest)
    if ctx.measurer.evaluators > 1:
        each = ctx.measurer.on_each(codec.names(chosen["none"]), PlanSource.rule("none"))
        ledger.store.write(meta.BASELINE_BY_EVALUATOR, {
            m.evaluators[0]: {"peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds, "clock": m.clock}
            for m in each})
    for k, v in rules.items():
        if k not in chosen:
            ledger.propose(tuple(v), PlanSource.rule(k))


def profile_checks(ctx: RunContext, rules: dict[str, list[int]]) -> dict[str, Indices]:
    """The plans that check the one-device profile (``env.measure.profiler.checked_plans``), each under the name
    of the rule that is the same plan, else its own (``all chained``: ``all_chained``); none under FSDP, and none
    in a compiled search, whose rules are measured compiled and whose eager profile checked itself."""
    if ctx.ledger.store.read(meta.FSDP) is not None or ctx.cfg.compile:
        return {}
    codec = ctx.ledger.codec
    named = {tuple(v): k for k, v in reversed(rules.items())}  # the first rule of each plan
    out: dict[str, Indices] = {}
    for name, actions in checked_plans(ctx.ledger.setup.profile).items():
        idx = codec.indices(actions)
        out[named.get(idx, name.replace(" ", "_"))] = idx
    return out


def check_profile_peaks(ctx: RunContext, measured: dict[str, MeasuredPlan]) -> None:
    """Each checking plan's predicted peak against its measured one: a profile off by more than
    ``env.measure.trace.PEAK_TOLERANCE`` on any is refused in one line (``MeasurementError``), as the profile
    refuses itself where it checks its own plans."""
    profile, cm, codec = ctx.ledger.setup.profile, ctx.ledger.setup.cost_model, ctx.ledger.codec
    check_peaks([PeakCheck(name, cm.predict(codec.plan(codec.indices(m.actions))).peak_bytes, m.peak_bytes)
                 for name, m in measured.items() if not m.oom], profile.workload, profile.device)

"""The correctness gate over what a search shows: every plan of the frontier shown (and so of ``plans/``,
``frontier.json`` and ``search.export``) checked once on the workload itself before the report is written.

One step with the plan against one without, from the same weights, inputs and RNG state, loss and every
gradient compared (``env.measure.gate``), on the first Evaluator. A plan that fails leaves every frontier
(``ParetoArchive.refused``), the frontier is taken again without it and its new plans are checked, until every
plan shown passed; the units a failure names are kept by every plan proposed after it (``Ledger.propose``).
Before that, right after the rules are measured, the rules that recompute every unit are checked
(``gate_rules``): a broken unit is then condemned before the exact solver's and the agents' plans are proposed.
Store meta ``gate``: each verdict. Under FSDP the group checks on its sharded step, every rank at once
(``FsdpGroup.check``).
"""

from __future__ import annotations

from env.data.measured import MeasuredPlan
from env.data.plan_check import PlanCheck
from search.engine import ray_session
from search.engine.context import RunContext
from search.engine.shown import Shown
from search.records import meta


EARLY_RULES = ("all", "all_selective")  # rules that recompute every unit: a failure names every broken unit


def gate_rules(ctx: RunContext) -> list[PlanCheck]:
    """Right after the rules are measured, the rules that recompute every unit (``EARLY_RULES``) checked: where
    one fails, each unit is tried alone, so every unit that changes the step is condemned before the exact
    solver's plans and the agents' are proposed, and none of those that recompute it is measured."""
    checked, measured = ctx.ledger.store.read(meta.GATE), ctx.ledger.archive.measured
    rules = ctx.ledger.store.read(meta.RULES)
    todo = [measured[d] for name, d in rules.items() if name in EARLY_RULES and d in measured and d not in checked]
    return check_plans(ctx, todo)


def gate_shown(ctx: RunContext) -> list[PlanCheck]:
    """Check the plans shown until every one passed (see the module); the verdicts this call made."""
    made: list[PlanCheck] = []
    while todo := unchecked(Shown.of(ctx.ledger).front, ctx.ledger.store.read(meta.GATE)):
        checks = check_plans(ctx, todo)  # each round that fails a plan takes it off the frontier for good
        if not checks:
            break
        made += checks
    return made


def check_plans(ctx: RunContext, plans: list[MeasuredPlan]) -> list[PlanCheck]:
    """The gate's verdict on each plan, from the first Evaluator (or FSDP group), recorded in the ledger."""
    ledger = ctx.ledger
    if not plans:
        return []
    answers = ray_session.get(ctx.measurer.pool.first.check.remote([list(r.actions) for r in plans]))
    checks = [PlanCheck.model_validate(a) for a in answers]
    for check in checks:
        ledger.record_check(check)
        if not check.passed:
            ledger.events.append(f"plan {check.digest} {check.line()}")
    return checks


def unchecked(front: list[MeasuredPlan], checked: dict[str, PlanCheck]) -> list[MeasuredPlan]:
    """The plans of ``front`` the gate has no verdict on yet."""
    return [r for r in front if r.digest not in checked]

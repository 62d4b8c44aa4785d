"""The correctness gate over what a search shows: every plan of the frontier shown (and so of ``plans/``,
``frontier.json`` and ``search.export``) checked once on the workload itself before the report is written.

One step with the plan against one without, from the same weights, inputs and RNG state, loss and every
gradient compared (``env.measure.gate``), on the first Evaluator. A plan that fails leaves every frontier
(``ParetoArchive.refused``), the frontier is taken again without it and its new plans are checked, until every
plan shown passed; the units a failure names are kept by every plan proposed after it (``Ledger.propose``).
Store meta ``gate``: each verdict. Runs measured under FSDP are not checked (the gate runs one device's step).
"""

from __future__ import annotations

from env.data.measured import MeasuredPlan
from env.data.plan_check import PlanCheck
from search.engine import ray_session
from search.engine.phases.context import RunContext
from search.records import meta


def gate_shown(ctx: RunContext) -> list[PlanCheck]:
    """Check the plans shown until every one passed (see the module); the verdicts this call made."""
    from search.engine.report import Shown  # the report reads this phase's records: imported where used

    ledger = ctx.ledger
    if ledger.store.read(meta.FSDP):
        return []
    made: list[PlanCheck] = []
    while True:  # ends: each round that fails a plan takes it off the frontier for good
        checked = ledger.store.read(meta.GATE)
        todo = unchecked(Shown.of(ledger).front, checked)
        if not todo:
            return made
        answers = ray_session.get(ctx.measurer.pool.first.check.remote([list(r.actions) for r in todo]))
        for answer in answers:
            check = PlanCheck.model_validate(answer)
            ledger.record_check(check)
            made.append(check)
            if not check.passed:
                ledger.events.append(f"plan {check.digest} {check.line()}")


def unchecked(front: list[MeasuredPlan], checked: dict[str, PlanCheck]) -> list[MeasuredPlan]:
    """The plans of ``front`` the gate has no verdict on yet."""
    return [r for r in front if r.digest not in checked]

"""``--compile-scope both``: the frontier a regional search shows, measured with the whole model compiled.

A compiled search measures its plans with each unit compiled on its own (``units``): every unit's variant
compiles once and every plan reuses it, so a plan costs about an eager measurement. A user who compiles
the whole model (``apply_plan(model, plan); torch.compile(model)``) gets another step: the compiler fuses
across units and keeps its layout between them (on the CNN, all keep 32 ms whole against 42 ms unit by
unit), but it may save more around a region. So after the search, each plan the frontier shows is
measured once more with the whole model compiled, a compile each, by the same Evaluators and paired with
their references as a plan is; the report's frontier takes each plan the way that is faster at its
memory (``search.engine.report.Shown``), and each point says which (``compile_scope``).
"""

from __future__ import annotations

from search.engine.phases.context import RunContext
from search.records import meta


def whole_model_pass(ctx: RunContext) -> int:
    """Measure the shown frontier's plans not measured whole-model yet (a resumed run did some); returns how many."""
    from search.engine.report import Shown  # the report reads this phase's records: imported where used

    ledger = ctx.ledger
    done = set(ledger.store.read(meta.WHOLE_MODEL))
    shown = Shown.of(ledger)
    todo = list({r.digest: r for r, scope in zip(shown.front, shown.scopes)
                 if scope != "model" and r.digest not in done}.values())
    if not todo:
        return 0
    jobs = [(list(r.actions), r.source) for r in todo]
    ctx.measurer.pool.run_jobs(jobs, lambda handle, job: handle.evaluate_whole_model.remote(*job),
                               on_result=ledger.record_whole_model)
    ctx.measurer.drain()  # the references measured between them
    return len(todo)

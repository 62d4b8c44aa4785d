"""``--compile-scope both``: a regional search's frontier, rules and exact plans, measured with the whole model
compiled.

A compiled search measures its plans with each unit compiled on its own (``units``): every unit's variant
compiles once and every plan reuses it, so a plan costs about an eager measurement. A user who compiles
the whole model (``apply_plan(model, plan); torch.compile(model)``) gets another step: the compiler fuses
across units and keeps its layout between them (on the CNN, all keep 32 ms whole against 42 ms unit by
unit), but it may save more around a region. So after the search, each plan of the frontier, each rule
and each exact plan measured, is measured once more with the whole model compiled, a compile each, by the same
Evaluators and paired with their references as a plan is; the report's frontier takes each plan the
way that is faster at its memory (``search.engine.report.Shown``), and each point says which
(``compile_scope``).
"""

from __future__ import annotations

from search.engine.phases.context import RunContext
from search.records import meta


def whole_model_pass(ctx: RunContext) -> int:
    """Measure whole-model the plans of the frontier shown and of the store's, the measured rules and the
    measured plans of the exact frontier, those not measured so yet (a resumed run did some); returns how
    many. The rules and the exact plans spread over the memory range, because the whole-model compile
    reorders plans: on the CNN all selective was the fastest plan at 14.5 MiB compiled whole and off the
    regional frontier; on gpt/small "recompute 2, selective 4" (36.2 MiB, 122.9 ms compiled whole) and
    "recompute 1, selective 5" (39.5 MiB, 123.6 ms) were off it too."""
    from search.engine.report import Shown  # the report reads this phase's records: imported where used

    ledger = ctx.ledger
    done = set(ledger.store.read(meta.WHOLE_MODEL))
    shown = Shown.of(ledger)
    measured = ledger.archive.measured
    spread = [*ledger.store.read(meta.RULES).values(), *ledger.store.read(meta.EXACT)]  # over the whole memory range
    plans = ([r for r, scope in zip(shown.front, shown.scopes) if scope != "model"] + ledger.frontier()
             + [measured[d] for d in spread if d in measured])
    todo = list({r.digest: r for r in plans if r.digest not in done and not r.oom}.values())
    if not todo:
        return 0
    jobs = [(list(r.actions), r.source) for r in todo]
    ctx.measurer.pool.run_jobs(jobs, lambda handle, job: handle.evaluate_whole_model.remote(*job),
                               on_result=ledger.record_whole_model)
    ctx.measurer.drain()  # the references measured between them
    return len(todo)

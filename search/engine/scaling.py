"""Frontier plans measured at half the batch, for pricing memory (the largest micro-batch that fits).

Each is a job of the Evaluator pool, on whichever Evaluator is free, and each measurement a row of the run
store at its micro-batch, in the ledger's ``batches`` (``search.engine.batch_book.BatchBook``) as a throughput
search's are; the dashboard prices a plan from those rows and the plan's own at the workload's batch.
"""

from __future__ import annotations

from typing import Any

from env.data.measured import MeasuredPlan
from env.workloads.spec import WorkloadSpec, builtin_options
from search.engine.evaluator_pool import EvaluatorPool
from search.engine.ledger import Ledger
from search.engine.shown import Shown
from search.records import meta

MAX_PLANS = 6
SOURCE = "batch-scaling"


def measure_batch_scaling(workload: str, ledger: Ledger, pool: EvaluatorPool) -> list[MeasuredPlan]:
    """Up to MAX_PLANS plans of the frontier a user is shown, evenly spread and both ends included (the fastest,
    no checkpointing, is priced beside the rest), measured at half the batch unless the store has them there;
    store meta ``batch_size`` is the workload's batch. Built-in workloads only (a batch_size option)."""
    spec = WorkloadSpec.parse(workload)
    if not spec.is_builtin:
        return []
    batch = int(builtin_options(spec)["batch_size"])
    if batch < 2:
        return []
    ledger.store.write(meta.BATCH_SIZE, batch)
    front = Shown.of(ledger).front
    picks = sorted({round(i * (len(front) - 1) / (MAX_PLANS - 1)) for i in range(MAX_PLANS)}) if front else []
    book, half = ledger.batches, batch // 2
    todo = [tuple(front[i].actions) for i in picks if book.get(half, front[i].digest) is None]

    def call(handle: Any, actions: tuple[str, ...], killed: bool) -> Any:
        return handle.evaluate_at_batch.remote(list(actions), half, SOURCE, killed)

    return pool.run_jobs(todo, call, book.record)

"""Frontier plans measured at half the batch, for pricing memory (the largest micro-batch that fits).

They are measured as any configuration at another micro-batch is (``search.engine.measurer.Measurer.measure_at``:
eager, no cap), on whichever Evaluator is free, each a row of the run store at its micro-batch in the ledger's
``batches``, as a throughput search's are; the dashboard prices a plan from those rows and the plan's own at the
workload's batch.
"""

from __future__ import annotations

from env.data.measured import MeasuredPlan
from env.workloads.spec import WorkloadSpec, builtin_options
from search.engine.batch_book import BatchTerms, Job
from search.engine.measurer import Measurer
from search.engine.shown import Shown
from search.records import meta

MAX_PLANS = 6
SOURCE = "batch-scaling"


def measure_batch_scaling(workload: str, measurer: Measurer) -> list[MeasuredPlan]:
    """Up to MAX_PLANS plans of the frontier a user is shown, evenly spread and both ends included (the fastest,
    no checkpointing, is priced beside the rest), measured at half the batch unless the store has them there;
    store meta ``batch_size`` is the workload's batch. Built-in workloads only (a batch_size option)."""
    spec = WorkloadSpec.parse(workload)
    if not spec.is_builtin:
        return []
    batch = int(builtin_options(spec)["batch_size"])
    if batch < 2:
        return []
    ledger = measurer.ledger
    ledger.store.write(meta.BATCH_SIZE, batch)
    front = Shown.of(ledger).front
    picks = sorted({round(i * (len(front) - 1) / (MAX_PLANS - 1)) for i in range(MAX_PLANS)}) if front else []
    jobs = [Job(tuple(front[i].actions), batch // 2, SOURCE) for i in picks]
    return measurer.measure_at(jobs, terms=BatchTerms(eager=True))

"""Frontier plans measured at a second batch size, for pricing memory (largest micro-batch that fits)."""

from __future__ import annotations

from typing import Any

from env.workloads.spec import WorkloadSpec, builtin_options
from search.engine import ray_session
from search.engine.ledger import Ledger
from search.engine.shown import Shown
from search.records import meta
from search.records.meta import BatchPoint

MAX_PLANS = 6


def measure_batch_scaling(workload: str, ledger: Ledger, evaluator: Any) -> dict[str, list[BatchPoint]]:
    """Measure up to MAX_PLANS frontier plans, evenly spread and both ends included, at half the batch;
    store both points per plan."""
    spec = WorkloadSpec.parse(workload)
    if not spec.is_builtin:
        return {}
    batch = int(builtin_options(spec)["batch_size"])
    if batch < 2:
        return {}
    # the frontier a user is shown, by peak ascending: the last is the fastest (no checkpointing), priced beside
    # the rest
    front = Shown.of(ledger).front
    picks = sorted({round(i * (len(front) - 1) / (MAX_PLANS - 1)) for i in range(MAX_PLANS)}) if front else []
    store = ledger.store
    scaling = store.read(meta.BATCH_SCALING)
    for r in (front[i] for i in picks):
        if r.digest in scaling:
            continue
        half = ray_session.get(evaluator.evaluate_at_batch.remote(list(r.actions), batch // 2))
        scaling[r.digest] = [half, {"batch_size": batch, "peak_bytes": r.peak_bytes, "step_seconds": r.step_seconds,
                                    "oom": r.oom, "clock": r.clock}]
        store.write(meta.BATCH_SCALING, scaling)
    store.write(meta.BATCH_SIZE, batch)
    return scaling

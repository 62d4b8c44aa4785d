"""Frontier plans measured at a second batch size, for pricing memory (largest micro-batch that fits)."""

from __future__ import annotations

from typing import Any

from env.measure import median_seconds
from env.workloads import WorkloadSpec, builtin_options

MAX_PLANS = 6


def measure_batch_scaling(search: Any) -> dict[str, list[dict[str, Any]]]:
    """Measure up to MAX_PLANS frontier plans at half the batch; store both points per plan."""
    spec = WorkloadSpec.parse(search.cfg.workload)
    if not spec.is_builtin:
        return {}
    batch = int(builtin_options(spec)["batch_size"])
    if batch < 2:
        return {}
    front = search.frontier()
    step = max(1, len(front) // MAX_PLANS)
    scaling: dict[str, list[dict[str, Any]]] = dict(search.store.get_meta("batch_scaling", {}))
    for r in front[::step][:MAX_PLANS]:
        if r.digest in scaling:
            continue
        half = search.ray.get(search.evaluator.evaluate_at_batch.remote(list(r.actions), batch // 2))
        scaling[r.digest] = [half, {"batch_size": batch, "peak_bytes": r.peak_bytes,
                                    "step_seconds": median_seconds(r.step_samples), "oom": r.oom}]
        search.store.set_meta("batch_scaling", scaling)
    search.store.set_meta("batch_size", batch)
    return scaling

"""EvaluatorBatches: an Evaluator's measurements at other micro-batches (the throughput search), kept apart
from its cache and journal, which hold the run's plans at the workload's own batch.

``Evaluator`` holds these methods; they measure through its ``at_batch``
(``env.measure.micro_batch.AtMicroBatch``) and number each measurement with its ids.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from env.data.errors import model_errors
from env.data.measured import MeasuredPlan
from env.measure.micro_batch import AtMicroBatch
from env.measure.peers import Peer


class EvaluatorBatches:
    at_batch: AtMicroBatch
    eager_at_batch: AtMicroBatch  # ``at_batch`` where the run is eager, else the same workload measured eagerly
    label: str
    _next_id: Callable[[], str]  # ``MeasuringActor``'s

    def batch_facts(self, batch_dim: int | None) -> dict[str, Any]:
        """The workload's own micro-batch and how it changes (``env.measure.micro_batch.AtMicroBatch.facts``)."""
        return self.at_batch.facts(batch_dim)

    def measure_at(self, item: Sequence[str] | Peer, micro_batch: int, batch_dim: int | None = None,
                   source: str = "", known: MeasuredPlan | None = None,
                   stop_above: int | None = None, not_fitting: bool = False, eager: bool = False) -> dict[str, Any]:
        """A plan (action names per unit) or a peer measured at ``micro_batch``, a new measurement each call:
        ``{"micro_batch": ..., "record": MeasuredPlan}`` (``search.records.meta.BatchRecord``); ``known`` and
        ``stop_above`` as ``AtMicroBatch.measure`` takes them, ``not_fitting`` as ``evaluate`` does; ``eager``:
        uncompiled whatever the run compiles (``eager_at_batch``)."""
        at = self.eager_at_batch if eager else self.at_batch
        measurement_id = self._next_id()
        with model_errors(f"a measurement at micro-batch {micro_batch}"):
            if not_fitting:
                m = at.not_fitting(item, micro_batch, batch_dim, source, measurement_id)
            else:
                m = at.measure(item, micro_batch, batch_dim, source, measurement_id, known, stop_above)
        return {"micro_batch": micro_batch, "record": m.model_copy(update={"evaluators": [self.label]})}

    def profile_at(self, micro_batch: int, batch_dim: int | None) -> dict[str, Any] | None:
        """The profile at ``micro_batch`` (``AtMicroBatch.profile``), as JSON; None where it ran out of memory."""
        with model_errors(f"the profile at micro-batch {micro_batch}"):
            got = self.at_batch.profile(micro_batch, batch_dim)
        return None if got is None else got.model_dump(mode="json")

"""Measure and profile a workload at another micro-batch, its model and optimizer kept as they are.

``AtMicroBatch`` is what an Evaluator uses for the throughput search: the plan (or peer) is measured
with the workload's inputs swapped for ``b`` samples (``env.workloads.batching``), by the same code
as at the workload's own batch (``env.measure.measurement.measure``, ``env.measure.peers.measure_peer``,
``env.measure.profiler.profile``), so a record at micro-batch ``b`` differs from one at the own batch
only in its ``batch_shape``. ``facts`` says what the search needs to know of the workload's batch:
its own size, how it is changed, tokens per sample, the gradients' bytes and the device's memory.

Every measurement here runs ``WARMUP`` untimed step before its memory step or, where it takes a peak measured
before (``env.measure.measurement.reuses_peak``), before its timed steps. One is enough here: the first step
timed after it reads as the steps after it, and a second warm-up step does not move a plan's median beyond the
noise (docs/throughput.md, "Warm-up at another micro-batch"). A throughput search measures many configurations
again (its deciding rounds and its quote), so the step saved is a fifth of each of those; the search at the
workload's own batch keeps two (``env.measure.measurement.warmup_before_timing`` says why).
A measurement of the peak alone runs none on CPU (``AtMicroBatch.warmup_for``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan import Action
from env.measure.compiled import CompileOptions
from env.measure.measurement import measure, not_fitting, record_fields, release_after_oom
from env.measure.peers import Peer, measure_peer
from env.measure.profiler import profile
from env.measure.timeline import is_oom, requested_bytes
from env.runtime.apply import plan_for
from env.workloads.batching import MicroBatches, batching_for, tokens_per_sample
from env.workloads.workload import Workload

__all__ = ["AtMicroBatch", "gradient_bytes", "WARMUP"]

WARMUP = 1


def gradient_bytes(model: torch.nn.Module) -> int:
    """Bytes of every trainable parameter's gradient (tied parameters once)."""
    seen = {p.untyped_storage().data_ptr(): p.numel() * p.element_size() for p in model.parameters() if p.requires_grad}
    return sum(seen.values())


class AtMicroBatch:
    """One workload's measurements and profiles at any micro-batch (``batch_dim``: see ``batching_for``)."""

    def __init__(self, workload: Workload, units: Sequence[str], actions: Sequence[Action], repeats: int,
                 compile: bool | CompileOptions = False) -> None:
        self.workload, self.units, self.actions, self.repeats, self.compile = workload, list(units), list(actions), \
            repeats, compile
        self._batches: dict[int | None, MicroBatches] = {}

    def batches(self, batch_dim: int | None) -> MicroBatches:
        if batch_dim not in self._batches:
            self._batches[batch_dim] = batching_for(self.workload, batch_dim)
        return self._batches[batch_dim]

    def facts(self, batch_dim: int | None) -> dict[str, Any]:
        """The workload's own micro-batch, how it changes, tokens per sample, gradient bytes, device memory."""
        batches, device = self.batches(batch_dim), self.workload.device
        return {"base": batches.base, "how": batches.how, "tokens_per_sample": tokens_per_sample(self.workload),
                "gradient_bytes": gradient_bytes(self.workload.model),
                "device_memory_bytes": torch.cuda.get_device_properties(device).total_memory
                if device.type == "cuda" else None}

    def measure(self, item: Sequence[str] | Peer, micro_batch: int, batch_dim: int | None, source: str,
                measurement_id: str, known: MeasuredPlan | None = None, stop_above: int | None = None) -> MeasuredPlan:
        """A plan (action names per unit) or a peer measured at ``micro_batch``; ``known``: the plan or peer
        measured there before, whose peak it takes on CPU (``env.measure.measurement.reuses_peak``);
        ``stop_above``: no step timed where the peak is above these bytes (``measure_prepared``), none at all where
        it is negative (the peak only, after ``warmup_for`` steps). Where even its inputs do not fit, the record
        says so (``not_fitting``)."""
        if (error := self._inputs_error(micro_batch, batch_dim)) is not None:
            return self.not_fitting(item, micro_batch, batch_dim, source, measurement_id, requested_bytes(error))
        with self.batches(batch_dim).use(micro_batch) as w:
            warmup = self.warmup_for(item, stop_above)
            if isinstance(item, Peer):
                return measure_peer(w, item, repeats=self.repeats, warmup=warmup, compile=self.compile,
                                    measurement_id=measurement_id, known=known, stop_above=stop_above)
            plan = plan_for(w.model, self.units, [Action(a) for a in item])
            return measure(w, plan, self.units, repeats=self.repeats, warmup=warmup, source=source,
                           measurement_id=measurement_id, compile=self.compile, known=known, stop_above=stop_above)

    def warmup_for(self, item: Sequence[str] | Peer, stop_above: int | None) -> int:
        """``WARMUP``, or none for a peak alone (``stop_above`` negative) on CPU, eager: there the peak is the sum
        of the profiler's memory events over one step, and once the optimizer's state exists the step allocates
        the same bytes with a warm-up step before it or without, in half the seconds. A search finds the ladder
        and each peer's largest micro-batch by peaks alone. On CUDA the peak is the allocator's, which a first
        step at a new size can raise (its workspaces), and a compiled step is compiled in its warm-up."""
        compiled = bool(self.compile) or (isinstance(item, Peer) and item.compiled)
        peak_only = stop_above is not None and stop_above < 0
        return 0 if peak_only and self.workload.device.type == "cpu" and not compiled else WARMUP

    def profile(self, micro_batch: int, batch_dim: int | None) -> ModelProfile | None:
        """The profile at ``micro_batch``, checked by the search against plans measured there, not here; None
        where its steps run out of memory (an allocation fails, ``env.measure.timeline.is_oom``) (the throughput search profiles at a size it guessed before it
        knew where all keep fits)."""
        if self._inputs_error(micro_batch, batch_dim) is not None:
            return None
        with self.batches(batch_dim).use(micro_batch) as w:
            try:
                return profile(w, self.units, self.actions, repeats=self.repeats, baseline=False, check=False)
            except Exception as e:  # noqa: BLE001 - an allocation that failed is an answer; anything else is raised
                if not is_oom(e):
                    raise
                e.__traceback__ = None
            release_after_oom(w)
            return None

    def not_fitting(self, item: Sequence[str] | Peer, micro_batch: int, batch_dim: int | None, source: str,
                    measurement_id: str, asked: int | None = None) -> MeasuredPlan:
        """The record of a plan or peer at ``micro_batch`` that does not fit, made without a step: it killed the
        process measuring it (the kernel's out-of-memory killer), or its inputs could not be allocated (``asked``
        bytes; its batch shape then says so): ``env.measure.measurement.not_fitting``."""
        inputs_fit = self._inputs_error(micro_batch, batch_dim) is None
        with self.batches(batch_dim).use(micro_batch) if inputs_fit else contextlib.nullcontext(self.workload) as w:
            if isinstance(item, Peer):  # filed as ``measure_peer`` files it
                fields = record_fields(w, item.digest, [], source or item.digest, measurement_id)
            else:
                plan = plan_for(w.model, self.units, [Action(a) for a in item])
                fields = record_fields(w, plan.digest, list(item), source, measurement_id)
            if not inputs_fit:
                fields["batch_shape"] = f"{micro_batch} samples (its inputs did not fit)"
            compiled = bool(self.compile) or (isinstance(item, Peer) and item.compiled)
            return not_fitting(w, fields, asked, **({"compile_seconds": 0.0} if compiled else {}))

    def _inputs_error(self, micro_batch: int, batch_dim: int | None) -> BaseException | None:
        """The error that making the inputs of ``micro_batch`` samples raised where they do not fit in memory
        (the factory called at that size, or the inputs resized); None where they were made."""
        try:
            self.batches(batch_dim).inputs(micro_batch)
        except Exception as e:  # noqa: BLE001 - inputs that do not fit are an answer; anything else is raised
            if not is_oom(e):
                raise
            e.__traceback__ = None
            return e
        return None

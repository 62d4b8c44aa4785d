"""Measure a plan: peak memory and step time of real training steps (the ground truth).

- CUDA: ``reset_peak_memory_stats`` -> step -> ``max_memory_allocated`` (and reserved beside
  it); ``torch.cuda.synchronize`` around timed steps.
- CPU: the profiler's memory events over one step; the peak of their running sum is exact and
  repeatable (process RSS is not). Time: warm-up steps, then the median of N timed steps, read
  from the measuring thread's CPU time when the step runs on one torch thread, so that other
  processes on the machine do not lengthen it (``env.timeline.step_clock``; ``clock`` says which).

Compiled (``compile=True`` or a :class:`env.compiled.CompileOptions`): the plan is applied, then
the model compiled from a fresh dynamo state and warmed up until a step compiles nothing new;
``compile_seconds`` is reported apart from the steps, and peak and time are read as above.

``peak_bytes`` is everything live at the step's peak (parameters, optimizer state, inputs,
activations, gradients): what must fit on the device. ``activation_bytes`` is the part above
what was live before the step.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Sequence

import torch
import torch.nn as nn
from pydantic import BaseModel

from env.apply import apply_actions
from env.compiled import CompileOptions, compiled
from env.errors import MeasurementError
from env.plan import Plan
from env.timeline import profiled_step, step_clock, sync, train_step
from env.workloads import Workload


def median_seconds(samples: Sequence[float]) -> float:
    """Median step time; infinite for a plan without samples (it never ran: out of memory)."""
    return statistics.median(samples) if samples else float("inf")


def spread_seconds(samples: Sequence[float]) -> float:
    """Interquartile range of step times (with fewer than 4 samples: max - min)."""
    s = sorted(samples)
    if len(s) < 4:
        return (s[-1] - s[0]) if s else 0.0
    q = statistics.quantiles(s, n=4)
    return q[2] - q[0]


class Measurement(BaseModel):
    """One plan measured on one workload and device."""

    workload: str
    batch_shape: str
    plan_digest: str
    peak_bytes: int  # everything live at the step's peak
    live_before_bytes: int  # parameters, optimizer state and inputs, before the step
    peak_reserved_bytes: int | None = None  # CUDA caching allocator's reserve at its peak
    step_seconds_samples: list[float]  # one per timed step, all repeats together
    clock: str = "wall"  # what the samples were read from: env.timeline.step_clock
    device: str
    torch_version: str
    oom: bool = False  # the plan ran out of memory: infeasible on this device
    compile_seconds: float | None = None  # torch.compile's warm-up, apart from the steps; None: eager steps
    recompiles: int | None = None  # graphs compiled again during the measured steps (compiled only; 0 expected)
    graph_breaks: int | None = None  # graph breaks of the compiled model (compiled only; 0: one graph)

    @property
    def activation_bytes(self) -> int:
        return self.peak_bytes - self.live_before_bytes

    @property
    def step_seconds(self) -> float:
        return median_seconds(self.step_seconds_samples)

    @property
    def spread_seconds(self) -> float:
        return spread_seconds(self.step_seconds_samples)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.workload, self.batch_shape, self.plan_digest)

    def merged(self, other: "Measurement") -> "Measurement":
        """This record with another repeat's step times added (same plan, same workload)."""
        if other.key != self.key:
            raise MeasurementError(f"cannot merge measurements of different plans {self.key} and {other.key}")
        if (self.compile_seconds is None) != (other.compile_seconds is None):
            raise MeasurementError(f"cannot merge a compiled and an eager measurement of {self.key}; "
                                   "keep compiled and eager records apart")
        return self.model_copy(update={
            "peak_bytes": max(self.peak_bytes, other.peak_bytes),
            "step_seconds_samples": self.step_seconds_samples + other.step_seconds_samples,
        })


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: object) -> int:
    """Bytes of the distinct storages of parameters, gradients, optimizer state and inputs."""
    seen: dict[int, int] = {}

    def add(t: object) -> None:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        elif isinstance(t, dict):
            for v in t.values():
                add(v)
        elif isinstance(t, (list, tuple)):
            for v in t:
                add(v)

    for p in model.parameters():
        add(p)
        add(p.grad)
    add(list(optimizer.state.values()))
    add(list(model.buffers()))
    add(inputs)
    return sum(seen.values())


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def measure(workload: Workload, plan: Plan, units: Sequence[str] | None = None, repeats: int = 5,
            warmup: int = 1, compile: bool | CompileOptions = False) -> Measurement:
    """Apply ``plan``, run ``warmup`` steps, one memory step and ``repeats`` timed steps; remove it.

    Model weights move with every step (the optimizer runs), as in training. An out-of-memory
    error on CUDA returns a measurement marked ``oom`` instead of raising. ``compile``: measure
    compiled steps (the plan applied, then the model compiled; see :mod:`env.compiled`).
    """
    with apply_actions(workload.model, plan, units):
        return measure_prepared(workload, plan.digest, repeats, warmup, compile)


def measure_prepared(workload: Workload, plan_digest: str, repeats: int = 5, warmup: int = 1,
                     compile: bool | CompileOptions = False) -> Measurement:
    """Measure the workload as it is now (a plan or a peer already installed), under ``plan_digest``."""
    if repeats < 1:
        raise MeasurementError(f"repeats={repeats} must be at least 1; time one or more steps (repeats=5 is the default)")
    device = workload.device
    optimizer = workload.meta.get("_optimizer")
    if optimizer is None:  # one optimizer per workload: its state is part of what is live
        optimizer = workload.optimizer_factory(workload.model.parameters())
        workload.meta["_optimizer"] = optimizer
    clock_name, clock = step_clock(device)
    base = dict(workload=workload.spec, batch_shape=workload.batch_shape, plan_digest=plan_digest,
                device=_device_name(device), torch_version=torch.__version__, clock=clock_name)
    options = CompileOptions() if compile is True else (compile or None)
    with (compiled(workload, options) if options else contextlib.nullcontext()) as session:
        stepped = session.workload if session else workload
        try:
            if session:
                session.warm_up(optimizer, warmup)  # until compiled, and at least ``warmup`` steps
            else:
                for _ in range(max(warmup, 1)):  # at least one: the optimizer's state must exist
                    train_step(workload, optimizer)
            peak, live_before, reserved = _peak(stepped, optimizer)
            samples = []
            for _ in range(repeats):
                sync(device)
                t0 = clock()
                train_step(stepped, optimizer)
                sync(device)
                samples.append((clock() - t0) / 1e9)
        except RuntimeError as e:
            if device.type != "cuda" or not _is_oom(e):
                raise
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            return Measurement(**base, peak_bytes=torch.cuda.get_device_properties(device).total_memory,
                               live_before_bytes=0, step_seconds_samples=[], oom=True,
                               compile_seconds=session.compile_seconds if session else None)
        stats = session.stats() if session else None
    compile_fields = {} if stats is None else dict(compile_seconds=stats.compile_seconds, recompiles=stats.recompiles,
                                                   graph_breaks=stats.graph_breaks)
    return Measurement(**base, peak_bytes=peak, live_before_bytes=live_before, peak_reserved_bytes=reserved,
                       step_seconds_samples=samples, **compile_fields)


def _peak(workload: Workload, optimizer: torch.optim.Optimizer) -> tuple[int, int, int | None]:
    device = workload.device
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        live_before = torch.cuda.memory_allocated(device)
        train_step(workload, optimizer)
        sync(device)
        return torch.cuda.max_memory_allocated(device), live_before, torch.cuda.max_memory_reserved(device)
    live_before = state_bytes(workload.model, optimizer, workload.inputs)
    trace = profiled_step(workload, optimizer)
    return live_before + trace.peak_delta(), live_before, None


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"

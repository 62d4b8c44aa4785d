"""One training step, and the memory/time timeline of that step.

``train_step`` is what every measurement runs: forward, backward, optimizer step, gradients
freed. ``UnitMarkers`` puts named marks on the step's timeline at each unit's forward start,
forward end and backward start; ``profiled_step`` turns a profiled step into the allocation
events of the workload's device (``env.measure.trace`` reads them). Measurement (whole-step peaks) and
profiling (per-unit segments) both read these, so the cost model is built from exactly the
numbers it is judged against.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
from torch._C._autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from env.measure.trace import MARK_PREFIX, MEMORY_EVENT, MemoryTrace, ProfilerEvent, memory_trace
from env.workloads.workload import Workload

__all__ = ["MARK_PREFIX", "MemoryTrace", "UnitMarkers", "is_oom", "profiled_step", "profiler_events", "requested_bytes",
           "step_clock", "sync", "train_step"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# what an allocator that could not allocate says: CUDA's ("out of memory"), the CPU allocator's under a
# memory limit ("DefaultCPUAllocator: can't allocate memory", "... not enough memory")
_OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")
_ASKED = re.compile(r"tried to allocate ([\d.]+)\s*(bytes|[KMGT]iB)", re.IGNORECASE)
_UNIT = {"bytes": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def is_oom(e: BaseException) -> bool:
    """An allocation that failed: CUDA's out-of-memory error, the CPU allocator's ``RuntimeError`` under a
    memory limit, or Python's ``MemoryError``, raised as itself or wrapped (e.g. by the compiler) with its
    message. Such a step does not fit the device: a measurement, not the model's fault."""
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(e).lower()
    return any(w in text for w in _OOM_WORDS)


def requested_bytes(e: BaseException) -> int | None:
    """The bytes a failed allocation asked for, where its message says ("tried to allocate 2.00 GiB",
    "you tried to allocate 1073741824 bytes"); None where it does not."""
    found = _ASKED.search(str(e))
    return int(float(found.group(1)) * _UNIT[found.group(2).lower()]) if found else None


def step_clock(device: torch.device) -> tuple[str, Callable[[], int]]:
    """The clock a step's time is read from, as (name, nanosecond clock).

    On a CPU with one torch thread every op of the step, backward included, runs on the
    calling thread, so that thread's CPU time (``thread-cpu``) is the step's compute time:
    equal to the wall time on a quiet machine, and not lengthened while other processes hold
    the cores (on 2 shared cores it cut the spread of step times from 50-70% to 12-14%).
    Everywhere else (GPUs, several CPU threads) the wall clock (``wall``).
    """
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return "thread-cpu", time.thread_time_ns
    return "wall", time.perf_counter_ns


def train_step(workload: Workload, optimizer: torch.optim.Optimizer, markers: "UnitMarkers | None" = None) -> float:
    """Run one training step; returns the loss. Gradients are freed at its end."""
    if markers:
        markers.mark("step_start")
    loss = workload.loss()
    workload.backward(loss)
    if markers:
        markers.mark("bwd_end")
    workload.optimizer_step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    if markers:
        markers.mark("step_end")
    return float(loss.detach())


@dataclass
class UnitMarkers:
    """Marks ``fwd_pre:i``, ``fwd_post:i`` and ``bwd_pre:i`` for each unit i of a step.

    Each mark records ``clock()`` in ns (``step_clock``'s; after a CUDA sync when ``sync_cuda``)
    and, when a profiler is running, a zero-length ``record_function`` range at that instant.
    """

    model: nn.Module
    units: Sequence[str]
    sync_cuda: bool = False
    clock: Callable[[], int] = time.perf_counter_ns
    marks: list[tuple[str, int]] = field(default_factory=list)
    _handles: list[Any] = field(default_factory=list)

    def mark(self, name: str) -> None:
        if self.sync_cuda:
            torch.cuda.synchronize()
        self.marks.append((name, self.clock()))
        with record_function(MARK_PREFIX + name):
            pass

    def __enter__(self) -> "UnitMarkers":
        for i, fqn in enumerate(self.units):
            module = self.model.get_submodule(fqn)
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(i)))
            self._handles.append(module.register_forward_hook(self._post_hook(i)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre_hook(self, i: int) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self.mark(f"fwd_pre:{i}")
        return hook

    def _post_hook(self, i: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self.mark(f"fwd_post:{i}")
            out = _first_grad_tensor(output)
            if out is not None:
                out.register_hook(lambda grad: self.mark(f"bwd_pre:{i}"))
        return hook


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, (tuple, list)):
        for item in output:
            t = _first_grad_tensor(item)
            if t is not None:
                return t
    if isinstance(output, dict):
        return _first_grad_tensor(list(output.values()))
    return None


def profiler_events(workload: Workload, optimizer: torch.optim.Optimizer,
                    markers: UnitMarkers | None = None) -> list[ProfilerEvent]:
    """Run one step under the profiler with memory events; its allocations (every device) and marks.

    On CUDA the profiler also traces the device (``ProfilerActivity.CUDA``); the caching
    allocator's events are stamped on the host when it is called, the timeline of the marks.
    """
    device = workload.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities, profile_memory=True) as prof:
        train_step(workload, optimizer, markers)
        sync(device)
    out = []
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name == MEMORY_EVENT:
            out.append(ProfilerEvent(name, _device_type(e.device_type()), e.device_index(), e.start_ns(), e.nbytes()))
        elif name.startswith(MARK_PREFIX):
            out.append(ProfilerEvent(name, _device_type(e.device_type()), e.device_index(), e.start_ns()))
    return out


def profiled_step(workload: Workload, optimizer: torch.optim.Optimizer,
                  markers: UnitMarkers | None = None) -> MemoryTrace:
    """One profiled step's allocations on the workload's device (and the marks)."""
    device = workload.device
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return memory_trace(profiler_events(workload, optimizer, markers), device.type, index)


def _device_type(kind: DeviceType) -> str:
    """The profiler's device enum as ``torch.device.type`` spells it ('cpu', 'cuda')."""
    return kind.name.lower()

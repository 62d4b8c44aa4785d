"""One training step, and the memory/time timeline of that step.

``train_step`` is what every measurement runs: forward, backward, optimizer step, gradients
freed. ``UnitMarkers`` puts named marks on the step's timeline at each unit's forward start,
forward end and backward start; ``memory_trace`` turns a profiled step into its allocation
events. Measurement (whole-step peaks) and profiling (per-unit segments) both read these,
so the cost model is built from exactly the numbers it is judged against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
from torch._C._autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from env.errors import MeasurementError
from env.workloads import Workload

MARK_PREFIX = "ckpt_mark::"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    loss.backward()
    if markers:
        markers.mark("bwd_end")
    optimizer.step()
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


@dataclass
class MemoryTrace:
    """Allocation events of one profiled step: (ns, +/- bytes), and the marks' ns."""

    events: list[tuple[int, int]]
    marks: dict[str, int]

    def peak_delta(self) -> int:
        """Highest running sum of allocations over the step (bytes above the start)."""
        level = peak = 0
        for _, nbytes in self.events:
            level += nbytes
            peak = max(peak, level)
        return peak

    def segment(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """(delta, rise) of the allocations in [start, end): net bytes, and the highest point above start."""
        level = rise = 0
        for t, nbytes in self.events:
            if start_ns <= t < end_ns:
                level += nbytes
                rise = max(rise, level)
        return level, rise


def profiled_step(workload: Workload, optimizer: torch.optim.Optimizer,
                  markers: UnitMarkers | None = None) -> MemoryTrace:
    """Run one step under the profiler with memory events; CPU allocations only."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(workload, optimizer, markers)
    events: list[tuple[int, int]] = []
    marks: dict[str, int] = {}
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name == "[memory]" and e.device_type() == DeviceType.CPU:
            events.append((e.start_ns(), e.nbytes()))
        elif name.startswith(MARK_PREFIX):
            key = name[len(MARK_PREFIX):]
            if key in marks:
                raise MeasurementError(
                    f"unit mark '{key}' fired twice in one step: a unit ran twice (shared or reused module); "
                    "choose units that each run once per step"
                )
            marks[key] = e.start_ns()
    events.sort()
    return MemoryTrace(events, marks)

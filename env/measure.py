"""Measure a plan: peak memory and step time of real training steps (the ground truth).

- CUDA: ``reset_peak_memory_stats`` -> step -> ``max_memory_allocated`` (and reserved beside
  it); ``torch.cuda.synchronize`` around timed steps.
- CPU: the profiler's memory events over one step; the peak of their running sum is exact and
  repeatable (process RSS is not). Time: warm-up steps, then the median of N timed steps, read
  from the measuring thread's CPU time when the step runs on one torch thread, so that other
  processes on the machine do not lengthen it (``env.timeline.step_clock``; ``clock`` says which).

``peak_bytes`` is everything live at the step's peak (parameters, optimizer state, inputs,
activations, gradients): what must fit on the device. ``activation_bytes`` is the part above
what was live before the step.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from env.apply import apply_actions
from env.errors import MeasurementError
from env.plan import Plan
from env.records import MeasuredPlan
from env.timeline import profiled_step, step_clock, sync, train_step
from env.workloads import Workload


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


def live_bytes(workload: Workload, optimizer: torch.optim.Optimizer) -> int:
    """Bytes live on the workload's device now, counted as a step's peak is: the caching allocator's
    ``memory_allocated`` on CUDA (its blocks, workspaces included), the distinct storages on CPU."""
    if workload.device.type == "cuda":
        return torch.cuda.memory_allocated(workload.device)
    return state_bytes(workload.model, optimizer, workload.inputs)


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def measure(workload: Workload, plan: Plan, units: Sequence[str] | None = None, repeats: int = 5,
            warmup: int = 1, source: str = "", measurement_id: str = "") -> MeasuredPlan:
    """Apply ``plan``, run ``warmup`` steps, one memory step and ``repeats`` timed steps; remove it.

    Model weights move with every step (the optimizer runs), as in training. An out-of-memory
    error on CUDA returns a measurement marked ``oom`` instead of raising. ``source`` (who
    proposed the plan) and ``measurement_id`` (unique per measurement) label the record.
    """
    if repeats < 1:
        raise MeasurementError(f"repeats={repeats} must be at least 1; time one or more steps (repeats=5 is the default)")
    device = workload.device
    optimizer = workload.optimizer
    clock_name, clock = step_clock(device)
    names = [a.value for a in plan.action_list(units)] if units is not None else [a.value for a in plan.actions.values()]
    base = dict(workload=workload.spec, batch_shape=workload.batch_shape, digest=plan.digest, actions=names,
                sources=[source] if source else [], measurement_ids=[measurement_id] if measurement_id else [],
                device=_device_name(device), torch_version=torch.__version__, clock=clock_name)
    oom = False
    with apply_actions(workload.model, plan, units):
        try:
            for _ in range(max(warmup, 1)):  # at least one: the optimizer's state must exist
                train_step(workload, optimizer)
            peak, live_before, reserved = _peak(workload, optimizer)
            samples = []
            for _ in range(repeats):
                sync(device)
                t0 = clock()
                train_step(workload, optimizer)
                sync(device)
                samples.append((clock() - t0) / 1e9)
        except RuntimeError as e:
            if device.type != "cuda" or not _is_oom(e):
                raise
            oom = True  # cleaned up below, once the exception no longer holds the step's tensors
    if oom:
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return MeasuredPlan(**base, peak_bytes=torch.cuda.get_device_properties(device).total_memory,
                            live_before_bytes=0, step_seconds_samples=[], oom=True)
    return MeasuredPlan(**base, peak_bytes=peak, live_before_bytes=live_before, peak_reserved_bytes=reserved,
                       step_seconds_samples=samples)


def _peak(workload: Workload, optimizer: torch.optim.Optimizer) -> tuple[int, int, int | None]:
    device = workload.device
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        live_before = live_bytes(workload, optimizer)
        train_step(workload, optimizer)
        sync(device)
        return torch.cuda.max_memory_allocated(device), live_before, torch.cuda.max_memory_reserved(device)
    live_before = live_bytes(workload, optimizer)
    trace = profiled_step(workload, optimizer)
    return live_before + trace.peak_delta(), live_before, None


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"

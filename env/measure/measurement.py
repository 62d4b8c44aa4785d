"""Measure a plan: peak memory and step time of real training steps (the ground truth).

- CUDA: ``reset_peak_memory_stats`` -> step -> ``max_memory_allocated`` (and reserved beside
  it); ``torch.cuda.synchronize`` around timed steps.
- CPU: the profiler's memory events over one step; the peak of their running sum is exact and
  repeatable (process RSS is not). Time: warm-up steps, then the median of N timed steps, read
  from the measuring thread's CPU time when the step runs on one torch thread, so that other
  processes on the machine do not lengthen it (``env.measure.timeline.step_clock``; ``clock`` says which).

Compiled (``compile=True`` or a :class:`env.measure.compiled.CompileOptions`): the plan is applied, then
the model compiled from a fresh dynamo state (or, in the ``units`` scope, the plan's units compiled as it is
applied, reusing what earlier plans compiled) and warmed up until a step compiles nothing new;
``compile_seconds`` is reported apart from the steps, and peak and time are read as above.

``peak_bytes`` is everything live at the step's peak (parameters, optimizer state, inputs,
activations, gradients): what must fit on the device. ``activation_bytes`` is the part above
what was live before the step.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from env.data.errors import MeasurementError
from env.data.measured import MeasuredPlan
from env.data.plan import Plan
from env.measure.compiled import CompileOptions, compiled, unit_compiler
from env.measure.timeline import is_oom, profiled_step, requested_bytes, step_clock, sync, train_step
from env.runtime.apply import apply_actions
from env.workloads.workload import Workload


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: object) -> int:
    """Bytes of the distinct storages of parameters, gradients, optimizer state and inputs."""
    seen: dict[int, int] = {}

    def add(t: object) -> None:
        if isinstance(t, torch.Tensor):
            s = _local(t).untyped_storage()
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


def _local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor: the local shard of a ``DTensor`` (FSDP2's parameters, their gradients and
    optimizer state), which has no storage of its own; any other tensor as it is."""
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            return t.to_local()
    return t


def live_bytes(workload: Workload, optimizer: torch.optim.Optimizer) -> int:
    """Bytes live on the workload's device now, counted as a step's peak is: the caching allocator's
    ``memory_allocated`` on CUDA (its blocks, workspaces included), the distinct storages on CPU."""
    if workload.device.type == "cuda":
        return torch.cuda.memory_allocated(workload.device)
    return state_bytes(workload.model, optimizer, workload.inputs)


def measure(workload: Workload, plan: Plan, units: Sequence[str] | None = None, repeats: int = 5,
            warmup: int = 1, source: str = "", measurement_id: str = "",
            compile: bool | CompileOptions = False, known: MeasuredPlan | None = None,
            stop_above: int | None = None) -> MeasuredPlan:
    """Apply ``plan``, run ``warmup`` steps, one memory step and ``repeats`` timed steps; remove it.

    Model weights move with every step (the optimizer runs), as in training. An allocation that fails
    (``env.measure.timeline.is_oom``: CUDA's out of memory, the CPU allocator's, ``MemoryError``) returns a
    measurement marked ``oom`` (``not_fitting``) instead of raising. ``source`` (who
    proposed the plan) and ``measurement_id`` (unique per measurement) label the record.
    ``compile``: measure compiled steps (the plan applied, then the model compiled; see
    :mod:`env.measure.compiled`). ``known``: an earlier measurement of the plan, whose peak
    stands on CPU (``reuses_peak``). ``stop_above``: as ``measure_prepared`` says.
    """
    names = [a.value for a in plan.action_list(units)] if units is not None else [a.value for a in plan.actions.values()]
    options = compile_options(compile)
    per_unit = unit_compiler(options) if options is not None and options.scope == "units" else None
    with apply_actions(workload.model, plan, units, compile_unit=per_unit):
        return measure_prepared(workload, plan.digest, names, repeats, warmup, compile, source, measurement_id,
                                known, stop_above)


def compile_options(compile: bool | CompileOptions) -> CompileOptions | None:
    """The options a ``compile`` argument means: ``True`` the defaults, ``False`` none (eager)."""
    return CompileOptions() if compile is True else (compile or None)


def reuses_peak(workload: Workload, known: MeasuredPlan | None, compile: object = False) -> bool:
    """Whether a measurement of a plan measured before takes that measurement's peak instead of profiling a
    step again: on CPU, where the peak is the running sum of the profiler's memory events, the same step of
    the same plan allocates the same tensors in the same order whatever the weights, so a second profiled
    step (the slowest step of a measurement: 2-3 plain steps) reads the same bytes. On CUDA the memory step
    is a plain step and every measurement reads the allocator's peak, which can move with fragmentation. A
    compiled measurement (``compile`` truthy) profiles its own graph."""
    return (known is not None and not known.oom and workload.device.type == "cpu" and not compile
            and known.peak_bytes > 0)


def warmup_before_timing(workload: Workload, known: MeasuredPlan | None, compile: object = False) -> int:
    """Warm-up steps for ``measure`` so that two steps run before the timed ones: the memory step is
    the second where the peak is profiled, and a plan measured before on CPU lends its peak (``reuses_peak``).
    Not less: with no warm-up step on CPU (the first step after a plan is applied timed), two default
    searches on gpt/small measured the baseline at a median 138 ms where four with it measured 112-118,
    and every plan's ratio to it fell by up to 10%, though in isolation the first step after a plan
    went in was no slower."""
    return 2 if reuses_peak(workload, known, compile) else 1


def measure_prepared(workload: Workload, digest: str, actions: Sequence[str] = (), repeats: int = 5, warmup: int = 1,
                     compile: bool | CompileOptions = False, source: str = "",
                     measurement_id: str = "", known: MeasuredPlan | None = None,
                     stop_above: int | None = None) -> MeasuredPlan:
    """Measure the workload as it is now (a plan or a peer already installed), recorded under ``digest``;
    ``known``: as ``measure`` says. ``stop_above``: bytes; where the memory step's peak is above them, no step
    is timed and the record has no samples (its time is infinite): a throughput search asks where a plan stops
    fitting its largest cap, and on gpt/small the timed steps were half the seconds of such a measurement.
    ``warmup`` 0 runs the memory step first where the optimizer's state exists (a step ran before on this model),
    and one warm-up step where it does not."""
    if repeats < 1:
        raise MeasurementError(f"repeats={repeats} must be at least 1; time one or more steps (repeats=5 is the default)")
    device = workload.device
    optimizer = workload.optimizer
    steady_numerics(device)
    _, clock = step_clock(device)
    base = record_fields(workload, digest, actions, source, measurement_id)
    options = compile_options(compile)
    oom: BaseException | None = None
    with (compiled(workload, options) if options else contextlib.nullcontext()) as session:
        stepped = session.workload if session else workload
        try:
            if session:
                session.warm_up(optimizer, warmup)  # until compiled, and at least ``warmup`` steps
            else:
                for _ in range(warmup or (0 if optimizer.state else 1)):  # the optimizer's state must exist
                    train_step(workload, optimizer)
            if reuses_peak(workload, known, options):
                peak, live_before, reserved = known.peak_bytes, known.live_before_bytes, None  # type: ignore[union-attr]
            else:
                peak, live_before, reserved = _peak(stepped, optimizer)
            timed = stop_above is None or peak <= stop_above
            samples = [_timed_step(stepped, optimizer, clock) for _ in range(repeats)] if timed else []
        except Exception as e:  # noqa: BLE001 - an allocation that failed is a measurement; anything else is raised
            if not is_oom(e):
                raise
            oom = e  # cleaned up below, once the step's frames no longer hold its tensors
            e.__traceback__ = None
        stats = session.stats() if session else None
    compile_fields = {} if stats is None else dict(compile_seconds=stats.compile_seconds, recompiles=stats.recompiles,
                                                   graph_breaks=stats.graph_breaks)
    if oom is not None:
        release_after_oom(workload)
        return not_fitting(workload, base, requested_bytes(oom), **compile_fields)
    return MeasuredPlan(**base, peak_bytes=peak, live_before_bytes=live_before, peak_reserved_bytes=reserved,
                        step_seconds_samples=samples, **compile_fields)


def record_fields(workload: Workload, digest: str, actions: Sequence[str] = (), source: str = "",
                  measurement_id: str = "") -> dict[str, Any]:
    """What every record of a measurement on ``workload`` says besides its numbers: the workload, batch shape,
    plan, who proposed it, its id, the device, torch's version and the clock its steps are timed by."""
    return dict(workload=workload.spec, batch_shape=workload.batch_shape, digest=digest, actions=list(actions),
                sources=[source] if source else [], measurement_ids=[measurement_id] if measurement_id else [],
                device=_device_name(workload.device), torch_version=torch.__version__,
                clock=step_clock(workload.device)[0])


def not_fitting(workload: Workload, fields: dict[str, Any], asked: int | None = None, **compiled: Any) -> MeasuredPlan:
    """The record of a configuration that does not fit the device (``oom``): an allocation of its step failed
    (``asked``: the bytes it asked for, where the error said), or its measuring process was killed on it. Its
    peak is the device's memory (``device_memory_bytes``), the least it would have needed; no step is timed."""
    return MeasuredPlan(**fields, peak_bytes=device_memory_bytes(workload.device), live_before_bytes=0,
                        step_seconds_samples=[], oom=True, requested_bytes=asked, **compiled)


def device_memory_bytes(device: torch.device) -> int:
    """The memory a step may use on ``device``: a GPU's, or on a CPU the smaller of the machine's memory and
    this process's address-space limit (``ulimit -v``)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    return machine if limit == resource.RLIM_INFINITY else min(machine, limit)


def release_after_oom(workload: Workload) -> None:
    """What a step whose allocation failed left (its gradients; on CUDA the allocator's cached blocks) given
    back, once the exception no longer holds the step's tensors, so that the next measurement starts clean."""
    workload.optimizer.zero_grad(set_to_none=True)
    gc.collect()  # the failed step's frames and their tensors, held in reference cycles by the exception
    if workload.device.type == "cuda":
        torch.cuda.synchronize(workload.device)
        torch.cuda.empty_cache()


def steady_numerics(device: torch.device) -> None:
    """On a CPU, flush denormal numbers to zero (``torch.set_flush_denormal``) before timing steps.

    A CPU computes on denormal floats many times slower than on normal ones, and how many flow
    through a step depends on where training stands, not on the plan: without flushing, a fresh
    model's first steps run slower than its later ones, so a plan measured early in a process
    looks slower than the same plan measured later; with flushing, the first steps run as fast
    as the later ones (docs/measurement.md, "Denormals"). GPUs compute on denormals at full speed;
    nothing changes there. Gradient checks (``tests/test_apply.py``) compare plans under the same
    setting, so they are unaffected."""
    if device.type == "cpu":
        torch.set_flush_denormal(True)


def warm_up(workload: Workload, max_steps: int = 24, min_steps: int = 4, tolerance: float = 0.05) -> list[float]:
    """Training steps of the model as it is until the last three step times lie within
    ``tolerance`` of their median (at least ``min_steps``, at most ``max_steps``); their seconds.

    A fresh process runs its first steps slower (caches, allocator, lazily built kernels; on a
    GPU, cuDNN's autotuning); every Evaluator warms up once before it measures, so that the first
    plan it measures (often the baseline) is not timed on a cold process. On a rank of a process group
    (FSDP) the ranks stop together, once every rank's times settled: a rank that stopped early would
    leave the others waiting in the next step's collectives."""
    steady_numerics(workload.device)
    _, clock = step_clock(workload.device)
    times: list[float] = []
    while len(times) < max_steps:
        times.append(_timed_step(workload, workload.optimizer, clock))
        last = sorted(times[-3:])
        if all_ranks(len(times) >= min_steps and last[-1] - last[0] <= tolerance * last[1], workload.device):
            break
    return times


def all_ranks(verdict: bool, device: torch.device) -> bool:
    """``verdict`` of this process, or on a rank of a process group whether every rank's verdict is true."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return verdict
    flag = torch.tensor([int(verdict)], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def _timed_step(workload: Workload, optimizer: torch.optim.Optimizer, clock: Callable[[], int]) -> float:
    """One training step's seconds by ``clock`` (nanoseconds), the device synchronised around it."""
    sync(workload.device)
    t0 = clock()
    train_step(workload, optimizer)
    sync(workload.device)
    return (clock() - t0) / 1e9


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

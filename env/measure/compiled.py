"""Compiled training steps: a workload's model under ``torch.compile``, warmed up until compiled.

Users who train compiled want plans measured compiled: the compiler fuses ops, plans its own
buffers and (``torch._functorch.config.activation_memory_budget``) decides what to recompute, so
eager peaks and times do not carry over. :func:`compiled` gives the workload with its model
compiled, fresh (``torch._dynamo.reset()`` before and after, so one plan's graphs never serve
another), with ``fullgraph=True`` where the model allows and graph breaks counted where it does
not. :meth:`CompiledWorkload.warm_up` runs steps until one compiles nothing new and reports
the compile time apart from the step time; :meth:`CompiledWorkload.stats` also counts graphs
compiled later (recompilations: a guard that fails during the measured steps).

Two scopes (``CompileOptions.scope``):

- ``model``: the plan applied, then the whole model compiled, from a fresh dynamo state for every
  plan: what a user who calls ``torch.compile(model)`` gets, including the partitioner's choices
  across units, at a compile of the whole model (45-85 s on gpt/small here) for every plan.
- ``units`` (regional compilation, as torchtitan compiles each block): each unit is compiled with
  the plan's wrapper (``env.runtime.apply.apply_actions(..., compile_unit=...)``): keep compiles the
  unit's forward, recompute and selective the unit with its checkpoint (the partitioner recomputes
  inside the unit's backward graph), and a chain region checkpoints its units' compiled forwards
  eagerly (a region of any length compiles nothing new). Dynamo keeps compiled code by the
  function's code and guards, and its state is not reset between plans, so a unit's variant
  compiles once per process and every later plan that uses it (and every unit with the same code:
  the blocks of a transformer) reuses it; a plan costs a compile only when it brings a variant not
  seen before. The code between units (embeddings, the loss) runs eagerly.

Compile time depends on inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``), which
``reset`` leaves alone: a graph compiled before in any process compiles again in a fraction of
the time. That is what users see on their second run; quote compile times with that in mind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Iterator

import torch
import torch._dynamo
import torch._functorch.config
from torch._dynamo.utils import counters

from env.data.errors import MeasurementError
from env.measure.timeline import is_oom, train_step
from env.runtime.apply import Compiler, compile_forward
from env.workloads.workload import Workload


SCOPES = ("model", "units")
# compiled variants kept per code object in the units scope: one per action and per chain length
# that shares the code (a region's first unit), and one per unit of a model whose units differ
UNIT_RECOMPILE_LIMIT = 256


@dataclass(frozen=True)
class CompileOptions:
    """How a workload's model is compiled for measurement."""

    fullgraph: bool = True  # one graph; a model that breaks it is compiled with breaks (counted), not refused
    # torch._functorch.config.activation_memory_budget while compiling: 1.0 is the partitioner's
    # default (recompute what is free), 0.0 recomputes everything it can; None leaves the config as is
    activation_memory_budget: float | None = None
    backend: str = "inductor"
    max_compile_steps: int = 4  # warm-up steps that may compile before the measurement gives up
    scope: str = "model"  # "model": the whole model compiled for each plan; "units": each unit's variant once

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise MeasurementError(f"compile scope {self.scope!r} is not one of {', '.join(SCOPES)}; 'model' compiles "
                                   "the whole model for each plan, 'units' each unit's variant once")
        b = self.activation_memory_budget
        if b is not None and not 0.0 <= b <= 1.0:
            raise MeasurementError(f"activation_memory_budget={b} must be between 0.0 and 1.0 "
                                   "(the fraction of the default partition's saved activations), or None")


@dataclass(frozen=True)
class CompileStats:
    """What compiling a workload cost, from :meth:`CompiledWorkload.stats`."""

    compile_seconds: float  # wall seconds of the warm-up steps that compiled, less a compiled step's time each
    graphs: int  # graphs dynamo compiled during warm-up (1 with fullgraph)
    graph_breaks: int  # graph breaks dynamo met (0 with fullgraph)
    recompiles: int  # graphs compiled after warm-up, during the measured steps: 0 when the guards hold
    fullgraph: bool  # compiled as one graph (False: the model broke it and was compiled with breaks)


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _breaks() -> int:
    return sum(counters["graph_break"].values())


class CompiledWorkload:
    """The workload with its model compiled; ``workload`` is what the measured steps run."""

    def __init__(self, workload: Workload, options: CompileOptions) -> None:
        self.original = workload
        self.options = options
        self.fullgraph = options.fullgraph and options.scope == "model"  # units: compiled one by one
        self.workload = self._compile(self.fullgraph)
        self._graphs0, self._breaks0 = _graphs(), _breaks()
        self._warm: tuple[float, int] | None = None  # (compile seconds, graphs) once warm

    def _compile(self, fullgraph: bool) -> Workload:
        if self.options.scope == "units":
            return self.original  # the units' forwards were compiled as the plan was applied (``unit_compiler``)
        # dynamic=False: a measured step has one shape; automatic dynamic shapes (after a second
        # shape is seen in a frame behind a graph break) only add symbolic sizes that inductor
        # sometimes cannot order (torch 2.13 on diffusers' UNet: "cannot determine truth value of
        # Relational"); a frame seen with another shape compiles again and is counted
        model = torch.compile(self.original.model, fullgraph=fullgraph, backend=self.options.backend, dynamic=False)
        # a copy sharing everything but the model: inputs, loss, optimizer factory, meta
        return dataclasses.replace(self.original, model=model)

    def warm_up(self, optimizer: torch.optim.Optimizer, min_steps: int = 1) -> float:
        """Run steps until one compiles nothing (and at least ``min_steps``); returns compile seconds."""
        compiling: list[float] = []  # wall seconds of the steps that compiled
        steady: float | None = None  # wall seconds of a step that compiled nothing
        steps = 0
        while steady is None or steps < min_steps:
            if len(compiling) > self.options.max_compile_steps:
                raise MeasurementError(
                    f"workload '{self.original.spec}' compiled new graphs in each of {len(compiling)} warm-up steps "
                    "(a guard fails every step: dynamic shapes or changing Python state); make the step static, "
                    "raise CompileOptions.max_compile_steps, or measure it eagerly"
                )
            before = _graphs()
            t0 = time.perf_counter()
            try:
                train_step(self.workload, optimizer)
            except torch._dynamo.exc.BackendCompilerFailed as e:
                if is_oom(e):
                    raise  # measured as what it is: out of memory
                cause = getattr(e, "inner_exception", None) or e  # the compiler's own error, not dynamo's wrapper
                first = (str(cause).strip().splitlines() or [""])[0]
                raise MeasurementError(
                    f"workload '{self.original.spec}' failed to compile with backend '{self.options.backend}' "
                    f"({type(cause).__name__}: {first[:200]}); a compiler bug, not the plan's: measure it eagerly "
                    "(without --compile) or with another torch version") from e
            except torch._dynamo.exc.Unsupported:
                if not self.fullgraph:  # with breaks already (and in the units scope, never fullgraph)
                    raise
                optimizer.zero_grad(set_to_none=True)  # the failed step never reached backward
                torch._dynamo.reset()
                self.fullgraph = False  # the model breaks the graph: compile it with breaks, as users would
                self.workload = self._compile(False)
                self._graphs0, self._breaks0 = _graphs(), _breaks()
                continue
            wall = time.perf_counter() - t0
            steps += 1
            if _graphs() > before or steps == 1:  # step 1 compiles (its backward at least) even on a cache hit
                compiling.append(wall)
            else:
                steady = wall
        self._warm = (max(0.0, sum(compiling) - len(compiling) * steady), _graphs())
        return self._warm[0]

    @property
    def compile_seconds(self) -> float:
        """Compile seconds of the warm-up (0.0 before it finished)."""
        return self._warm[0] if self._warm else 0.0

    def stats(self) -> CompileStats:
        if self._warm is None:
            raise MeasurementError("CompiledWorkload.stats() before warm_up(); warm the compiled model up first")
        compile_seconds, warm_graphs = self._warm
        return CompileStats(compile_seconds=compile_seconds, graphs=warm_graphs - self._graphs0,
                            graph_breaks=_breaks() - self._breaks0, recompiles=_graphs() - warm_graphs,
                            fullgraph=self.fullgraph)


def unit_compiler(options: CompileOptions) -> Compiler:
    """What compiles one unit's forward (or a recomputed unit's checkpointed forward) in the ``units`` scope:
    ``env.runtime.apply.compile_forward``, as training code applies a plan with ``compile_units=True``.

    Not ``fullgraph``: a unit that breaks the graph runs in pieces (counted in ``graph_breaks``) rather than
    failing a plan that the model scope would measure with breaks too."""
    return functools.partial(compile_forward, backend=options.backend, dynamic=False)


@contextlib.contextmanager
def compiled(workload: Workload, options: CompileOptions | None = None) -> Iterator[CompiledWorkload]:
    """The workload with its model compiled, from a fresh dynamo state; dynamo is reset again on exit.

    In the ``units`` scope the units were compiled as the plan was applied, and dynamo's state is kept,
    so that the next plan reuses every variant compiled so far."""
    options = options or CompileOptions()
    budget = contextlib.nullcontext() if options.activation_memory_budget is None else \
        torch._functorch.config.patch(activation_memory_budget=options.activation_memory_budget)
    if options.scope == "units":
        with budget, torch._dynamo.config.patch(recompile_limit=UNIT_RECOMPILE_LIMIT):
            yield CompiledWorkload(workload, options)
        return
    torch._dynamo.reset()
    try:
        with budget:
            yield CompiledWorkload(workload, options)
    finally:
        torch._dynamo.reset()

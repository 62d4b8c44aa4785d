"""``auto_checkpoint(model, inputs, memory_budget)``: one call in a training script, the plan measured on the
user's own model, in the calling process.

    from search import auto_checkpoint
    ckpt = auto_checkpoint(model, (x, y), "8GB", optimizer=opt)   # or 0.6: 60% of the unplanned peak
    for batch in loader: ...                                     # train as usual; ckpt.remove() undoes it

What it does, on the model's device, with no Ray and no agents: choose the decision units where the saved
activations are (``env.units.choice``), profile them (``env.measure.profiler``), solve the exact frontier on
the cost model (``agents.exact``), measure the few plans it prices fastest within the budget with real training
steps (``env.measure.measurement.measure``: the caller's optimizer, else AdamW), check the fastest measured plan
that fits on the model itself (``env.measure.gate``: loss and every gradient against the unplanned step), apply
it, and print one line. The model's weights, gradients, buffers and the optimizer's state are as they were
before the call (``env.runtime.state.training_state_kept``). The choice is cached by model fingerprint, batch
shape, device and precision (``search.training.plan_cache``): the next start applies it without measuring.

When to run the full search (``python -m search.run --workload my_model.py:make``) instead: to see the whole
memory/time frontier rather than one answer; when the cost model's few best guesses may miss (many units, plans
measured far from their predictions), since the search measures dozens of plans and re-measures the frontier side
by side; to compare with the peers (torch.compile's budget, Hugging Face's checkpointing); to choose the
micro-batch under a memory cap (``--memory-cap``); for compiled or FSDP training; or on a shared machine where a
few steps' times are too noisy to rank plans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn as nn

from agents.exact import FrontierPoint, exact_frontier
from env.cost.cost_model import CostModel
from env.data.errors import BudgetError, PlanError, WorkloadError, model_errors
from env.data.measured import MeasuredPlan
from env.data.memory_budget import MemoryBudget, resolve_budget
from env.data.plan import Action, Plan, action_summary, fingerprint
from env.data.plan_check import PlanCheck, gate_tolerance
from env.data.types import MIB
from env.measure.gate import check_plan, gate_step
from env.measure.measurement import measure
from env.measure.profiler import profile
from env.runtime.apply import AppliedPlan, apply_actions, plan_for, planned_units
from env.runtime.state import training_state_kept
from env.units.choice import resolve_units
from env.workloads.workload import Workload, default_optimizer
from search.training.plan_cache import CacheEntry, CacheKey, Choice, PlanCache

ACTIONS = (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.CHAIN, Action.BLOCK)  # as the search's
CANDIDATES = 3  # plans measured within the budget, fastest on the cost model first
REPEATS = 3  # timed steps per measurement


@dataclass
class AutoCheckpoint:
    """The plan ``auto_checkpoint`` applied, as measured: ``remove()`` (or leaving a ``with``) undoes it."""

    plan: Plan
    peak_bytes: int  # measured peak of a training step with the plan
    step_seconds: float  # its measured median step time
    budget_bytes: int
    unplanned_peak_bytes: int
    unplanned_step_seconds: float
    check: PlanCheck  # the gate's verdict on the model itself
    seconds: float  # to choose (first call), or to apply the cached choice
    cached: bool
    handle: AppliedPlan = field(repr=False)

    def remove(self) -> None:
        self.handle.remove()

    def __enter__(self) -> "AutoCheckpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def line(self) -> str:
        """Plan, measured peak against the budget, step time against no checkpointing, in one line."""
        how = "cached" if self.cached else "chosen"
        err = "inf" if self.check.error == float("inf") else f"{self.check.error:.1g}"
        return (f"auto_checkpoint: {self.plan.summary()} ({how} in {self.seconds:.1f} s); peak "
                f"{self.peak_bytes / MIB:.1f} MiB within the {self.budget_bytes / MIB:.1f} MiB budget "
                f"(unplanned {self.unplanned_peak_bytes / MIB:.1f}); step {self.step_seconds * 1e3:.0f} ms, "
                f"{self.step_seconds / self.unplanned_step_seconds:.2f}x no checkpointing; gradients checked "
                f"(largest error {err})")


def auto_checkpoint(model: nn.Module, inputs: Any, memory_budget: MemoryBudget, *,
                    loss_fn: Callable[[Any], torch.Tensor] | None = None,
                    optimizer: torch.optim.Optimizer | None = None, precision: str | None = None,
                    cache_dir: str | None = None) -> AutoCheckpoint:
    """Apply the fastest measured checkpoint plan whose measured peak fits ``memory_budget``; see the module.

    ``inputs``: one batch, a tuple for ``model(*inputs)`` or a dict for ``model(**inputs)``; the call returns
    the scalar loss, or ``loss_fn(output)`` does. ``memory_budget``: bytes (int), a size string (``"8GB"``,
    ``"900MiB"``) or a fraction ``0 < f <= 1`` of the unplanned step's measured peak. ``precision``: the
    step's precision as Lightning names it (``env.workloads.precision``; None: ``32``), measured so and part
    of the cache key; ``bf16-true`` expects a model already in bf16. A budget no plan fits raises
    ``BudgetError`` naming the lowest measured peak.
    """
    start = time.perf_counter()
    precision = "32" if precision in (None, 32) else str(precision)
    gate_tolerance(precision)  # refuses a precision the gate has no tolerance for
    workload = user_workload(model, inputs, loss_fn, optimizer, precision)
    if planned_units(model):
        raise PlanError(f"{type(model).__name__} already has a checkpoint plan applied (units "
                        f"{', '.join(planned_units(model)[:3])}); call .remove() on its handle first")
    cache = PlanCache(cache_dir)
    key = cache_key(workload, precision, loss_fn, optimizer)
    entry = cache.load(key)
    if entry is not None:
        hit = _apply_cached(model, entry, memory_budget, start)
        if hit is not None:
            print(hit.line())
            return hit
    with training_state_kept(model, optimizer):
        choice, base, budget = choose(workload, memory_budget, precision)
    if entry is None or entry.unplanned_peak_bytes != base.peak_bytes:
        entry = CacheEntry(key=key, unplanned_peak_bytes=base.peak_bytes, unplanned_step_seconds=base.step_seconds)
    entry.choices[str(budget)] = choice
    cache.save(entry)
    handle = apply_actions(model, choice.plan, choice.units)
    out = AutoCheckpoint(choice.plan, choice.peak_bytes, choice.step_seconds, budget, base.peak_bytes,
                         base.step_seconds, choice.check, time.perf_counter() - start, False, handle)
    print(out.line())
    return out


def user_workload(model: nn.Module, inputs: Any, loss_fn: Callable[[Any], torch.Tensor] | None,
                  optimizer: torch.optim.Optimizer | None, precision: str = "32") -> Workload:
    """The training step the caller trains: ``model`` on ``inputs``, the loss, the caller's optimizer (else AdamW),
    at ``precision`` (the ``-mixed`` ones under autocast; ``bf16-true``: the model's own bf16 weights)."""
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, (tuple, dict)):
        raise WorkloadError(f"inputs of type {type(inputs).__name__}; give one batch as a tuple for model(*inputs) "
                            "or a dict for model(**inputs)")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    values = inputs.values() if isinstance(inputs, dict) else inputs
    elsewhere = [str(v.device) for v in values if isinstance(v, torch.Tensor) and v.device != device]
    if elsewhere:
        raise WorkloadError(f"inputs on {elsewhere[0]} but the model on {device}; move the batch to the model's device "
                            "first (auto_checkpoint measures where the model trains)")
    call = None
    if loss_fn is not None:
        def call(m: nn.Module, i: Any) -> torch.Tensor:
            return loss_fn(m(**i) if isinstance(i, dict) else m(*i))
    floats = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if precision == "bf16-true" and floats != {torch.bfloat16}:
        raise WorkloadError(f"precision='bf16-true' but the model's parameters are {sorted(map(str, floats))}; "
                            "call model.to(torch.bfloat16) first, or pass precision='bf16-mixed'")
    factory = (lambda params: optimizer) if optimizer is not None else default_optimizer
    return Workload(f"{type(model).__name__} (auto_checkpoint)", model, inputs, loss_fn=call,
                    optimizer_factory=factory, precision=precision)


def device_model(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def cache_key(workload: Workload, precision: str, loss_fn: Callable | None,
              optimizer: torch.optim.Optimizer | None) -> CacheKey:
    """Model class and parameter fingerprint, batch shape, device model, precision, and the step's loss and
    optimizer."""
    model = workload.model
    setup = (f"loss_fn={getattr(loss_fn, '__qualname__', type(loss_fn).__name__) if loss_fn else None};"
             f"optimizer={type(optimizer).__name__ if optimizer is not None else 'AdamW'}")
    return CacheKey(model=f"{type(model).__qualname__}:{fingerprint(model, [])}", batch_shape=workload.batch_shape,
                    device=device_model(workload.device), precision=precision, setup=setup)


def _apply_cached(model: nn.Module, entry: CacheEntry, memory_budget: MemoryBudget,
                  start: float) -> AutoCheckpoint | None:
    """The cached choice for this budget applied; None where there is none (or it no longer fits the model)."""
    budget = resolve_budget(memory_budget, entry.unplanned_peak_bytes)
    choice = entry.choices.get(str(budget))
    if choice is None:
        return None
    try:
        handle = apply_actions(model, choice.plan, choice.units)
    except PlanError:
        return None  # its units are no longer the model's: chosen afresh
    return AutoCheckpoint(choice.plan, choice.peak_bytes, choice.step_seconds, budget, entry.unplanned_peak_bytes,
                          entry.unplanned_step_seconds, choice.check, time.perf_counter() - start, True, handle)


def choose(workload: Workload, memory_budget: MemoryBudget, precision: str) -> tuple[Choice, MeasuredPlan, int]:
    """The fastest measured plan within the budget that passes the gate, the unplanned step (measured), and the
    budget in bytes. Model state changes (training steps run): the caller keeps it (``training_state_kept``)."""
    with model_errors("the choice of decision units and their profile (training steps with each action)"):
        units = resolve_units(workload).units
        prof = profile(workload, units, ACTIONS, repeats=REPEATS, check=False)
    assert prof.baseline is not None
    units = prof.units  # in execution order
    budget = resolve_budget(memory_budget, prof.baseline.peak_bytes)
    cm = CostModel(prof)
    measured: dict[str, MeasuredPlan] = {}
    condemned: set[int] = set()
    refused: set[str] = set()  # digests the gate failed
    while True:  # each round that fails a check condemns one unit or more, so the rounds end
        fits = measure_candidates(workload, cm, frontier(cm, condemned), budget, measured)
        before = len(condemned)
        reference = gate_step(workload, seed=0)  # from the weights as the measured steps left them
        for plan, m in sorted(fits, key=lambda pm: pm[1].step_seconds):
            acts = plan.action_list(units)
            if any(acts[i] is not Action.KEEP for i in condemned):
                continue  # recomputes a unit a check condemned: it would fail the same way
            check = check_plan(workload, plan, units, precision, reference=reference)
            if check.passed:
                base = measure(workload, plan_for(workload.model, units, [Action.KEEP] * len(units)), units,
                               repeats=REPEATS)  # the reference time beside the candidates'
                base = prof.baseline.merged(base)
                return Choice(plan=plan, units=list(units), peak_bytes=m.peak_bytes, step_seconds=m.step_seconds,
                              check=check), base, budget
            print(f"auto_checkpoint: {plan.summary()} {check.line()}")
            refused.add(plan.digest)
            condemned |= ({units.index(u) for u in check.culprits} if check.culprits
                          else {i for i, a in enumerate(acts) if a is not Action.KEEP})
        if not fits or len(condemned) == before:
            break
    passed = {d: m for d, m in measured.items()  # what a plan that keeps the condemned units reaches
              if d not in refused and all(m.actions[i] == Action.KEEP.value for i in condemned)}
    raise no_fit(budget, prof.baseline, passed, [units[i] for i in sorted(condemned)])


def frontier(cm: CostModel, condemned: set[int]) -> list[FrontierPoint]:
    """The exact frontier on the cost model, every unit in ``condemned`` (indices) kept."""
    if not condemned:
        return exact_frontier(cm)
    seconds = cm.seconds.copy()
    for i in condemned:
        seconds[i, [k for k in range(seconds.shape[1]) if k != cm.keep]] = np.inf  # never the fastest way
    priced = cm.with_step_seconds(seconds, cm.fixed_seconds)
    return [p for p in exact_frontier(priced) if np.isfinite(p.step_seconds)]


def measure_candidates(workload: Workload, cm: CostModel, points: Sequence[FrontierPoint], budget: int,
                       measured: dict[str, MeasuredPlan]) -> list[tuple[Plan, MeasuredPlan]]:
    """The frontier plans priced within ``budget``, fastest first, measured until ``CANDIDATES`` measured (at most
    twice that while none fits); the lowest-priced plan too where nothing fits. Those whose measured peak fits."""
    prof = cm.profile
    fp = prof.fingerprint

    def measured_plan(p: FrontierPoint) -> tuple[Plan, MeasuredPlan]:
        plan = Plan.from_list(prof.units, [prof.actions[a] for a in p.plan], fp)
        if plan.digest not in measured:
            known = prof.baseline if all(prof.actions[a] is Action.KEEP for a in p.plan) else None
            measured[plan.digest] = known or measure(workload, plan, prof.units, repeats=REPEATS)
        return plan, measured[plan.digest]

    within = sorted((p for p in points if p.peak_bytes <= budget), key=lambda p: p.step_seconds)
    fits: list[tuple[Plan, MeasuredPlan]] = []
    for k, p in enumerate(within):
        if k >= CANDIDATES * (1 if fits else 2):
            break
        plan, m = measured_plan(p)
        if not m.oom and m.peak_bytes <= budget:
            fits.append((plan, m))
    if not fits and points:
        measured_plan(min(points, key=lambda p: p.peak_bytes))  # the lowest peak, for the refusal
    return fits


def no_fit(budget: int, base: MeasuredPlan, measured: dict[str, MeasuredPlan], condemned: list[str]) -> BudgetError:
    """The one-line refusal: the budget, the lowest measured peak and its plan, what to do."""
    ok = [m for m in measured.values() if not m.oom] or [base]
    low = min(ok, key=lambda m: m.peak_bytes)
    kept = f"; units {', '.join(condemned)} kept, as the gradient check required" if condemned else ""
    return BudgetError(f"memory_budget {budget / MIB:.1f} MiB: no plan fits; the lowest measured peak is "
                       f"{low.peak_bytes / MIB:.1f} MiB ({action_summary(low.actions)}; unplanned "
                       f"{base.peak_bytes / MIB:.1f} MiB){kept}; give at least that, a smaller batch, or run the full "
                       "search (python -m search.run)")

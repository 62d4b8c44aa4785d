"""The correctness gate: a plan checked once on the workload itself before anyone is given it.

One training step with the plan against one without, from the same weights, inputs and RNG state
(``env.runtime.chains.training_step``, dropout on), loss and every gradient compared
(``env.runtime.chains.step_error``) within the tolerance of the workload's precision
(``env.data.plan_check.GATE_TOLERANCE``). "The same state" covers what a user's forward may read besides
torch's generator: numpy's and Python's global generators and the plain attributes of every module (a
counter, a flag) are put back after each of the two steps (``env.runtime.state.python_state_kept``), so
that a plan that keeps such a unit passes and one that runs its forward a second time (a recompute) is caught.

Where a plan fails, each of its recomputed regions is tried alone; those that change the step alone are
named, with what one forward of the first shows (``likely_causes``): numbers drawn from numpy's or Python's
generator, a module attribute changed, a custom ``torch.autograd.Function`` in its graph. pytorch#190758
and OLMo-core#828 are the failures this exists for (random numbers recomputed afresh).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn

from env.data.plan import Action, Plan, regions
from env.data.plan_check import PlanCheck, gate_tolerance
from env.runtime.chains import Step, state_kept, step_error, training_step
from env.runtime.state import plain_attributes, python_state_kept
from env.workloads.workload import Workload


def gate_step(workload: Workload, seed: int, plan: Plan | None = None, units: Sequence[str] = ()) -> Step:
    """Loss and gradients of one step (``training_step``) with the Python-side state put back after it."""
    with python_state_kept(workload.model):
        return training_step(workload, seed, plan, units)


def check_plan(workload: Workload, plan: Plan, units: Sequence[str], precision: str | None = None, seed: int = 0,
               reference: Step | None = None, error_of: Callable[[Step, Step], float] = step_error) -> PlanCheck:
    """The gate's verdict on ``plan`` (see the module docstring); model state as before. ``reference``: the
    unplanned step from ``seed`` (``gate_step``), where the caller checks several plans on one workload.
    ``error_of``: how far one step lies from another; an FSDP rank passes one that agrees across its group
    (``agreed_error``), so that every rank takes the same steps after a verdict."""
    tolerance = gate_tolerance(precision if precision is not None else workload.precision)
    reference = gate_step(workload, seed) if reference is None else reference
    error = error_of(gate_step(workload, seed, plan, units), reference)
    if error <= tolerance:
        return PlanCheck(digest=plan.digest, passed=True, error=error, tolerance=tolerance)
    named = culprits(workload, plan, units, seed, reference, tolerance, error_of)
    causes = likely_causes(workload, named[0]) if named else []
    return PlanCheck(digest=plan.digest, passed=False, error=error, tolerance=tolerance, culprits=named,
                     causes=causes)


def check_plans(workload: Workload, plans: Sequence[Plan], units: Sequence[str], seed: int = 0,
                error_of: Callable[[Step, Step], float] = step_error) -> list[PlanCheck]:
    """``check_plan`` on each of ``plans`` at the workload's precision, against one unplanned step from ``seed``."""
    reference = gate_step(workload, seed)
    return [check_plan(workload, plan, units, workload.precision, seed=seed, reference=reference, error_of=error_of)
            for plan in plans]


def agreed_error(a: Step, b: Step) -> float:
    """``step_error`` agreed across an FSDP group: the largest of its ranks' (whose losses may differ; their
    gathered gradients do not), by a collective every rank of the group makes."""
    import torch.distributed as dist

    error = torch.tensor([step_error(a, b)], dtype=torch.float64, device=a[0].device)  # NCCL: on the rank's GPU
    dist.all_reduce(error, op=dist.ReduceOp.MAX)
    return float(error.item())


def culprits(workload: Workload, plan: Plan, units: Sequence[str], seed: int, reference: Step,
             tolerance: float, error_of: Callable[[Step, Step], float] = step_error) -> list[str]:
    """The units whose action alone, every other unit kept, changes the step beyond ``tolerance``, in execution
    order; empty where none does alone (one step each). A chain region is tried as one; where it changes the step,
    each of its units is tried alone as ``recompute``, and all of them are named where none does alone."""
    actions = plan.action_list(units)
    alone = regions(actions)
    alone += [(i, i + 1) for i, a in enumerate(actions)
              if a is not Action.KEEP and not any(s <= i < e for s, e in alone)]

    def changes(start: int, stop: int, part: Sequence[Action]) -> bool:
        one = [Action.KEEP] * len(units)
        one[start:stop] = part
        single = Plan.from_list(units, one, plan.fingerprint)
        return error_of(gate_step(workload, seed, single, units), reference) > tolerance

    found: list[str] = []
    for start, stop in sorted(alone):
        if not changes(start, stop, actions[start:stop]):
            continue
        inside = [units[i] for i in range(start, stop) if stop - start > 1 and changes(i, i + 1, [Action.RECOMPUTE])]
        found.extend(inside or units[start:stop])
    return found


def likely_causes(workload: Workload, unit: str) -> list[str]:
    """What one forward of ``unit`` (within a forward of the model, gradients on, state kept) shows that makes a
    second run of it differ: draws from numpy's or Python's global generator, plain attributes it changes, and
    custom autograd Functions in its graph (whose backward may read what the rerun changed)."""
    model, module = workload.model, workload.model.get_submodule(unit)
    seen: list[str] = []
    before: dict[str, Any] = {}

    def pre(m: nn.Module, args: tuple) -> None:
        before.update(np=np.random.get_state()[1].copy(), np_pos=np.random.get_state()[2], py=random.getstate(),
                      attrs=plain_attributes(m), inputs={t.grad_fn for t in _tensors(args) if t.grad_fn is not None})

    def post(m: nn.Module, args: tuple, out: Any) -> None:
        state = np.random.get_state()
        if state[2] != before["np_pos"] or not np.array_equal(state[1], before["np"]):
            seen.append("draws random numbers from numpy's global generator, which a recompute draws afresh; "
                        "draw them from torch's generator (torch.rand/randn), which checkpointing replays")
        if random.getstate() != before["py"]:
            seen.append("draws random numbers from Python's random module, which a recompute draws afresh; "
                        "use torch's generator")
        changed = sorted(f"{unit}{'.' + n if n else ''}.{k}" for (n, k), v in plain_attributes(m).items()
                         if before["attrs"].get((n, k), object()) != v)
        if changed:
            seen.append(f"changes Python state in forward ({', '.join(changed[:3])}), which a recompute changes "
                        "again; keep such state outside forward")
        functions = _custom_functions(out, before["inputs"])
        if functions:
            seen.append(f"runs custom autograd Function(s) {', '.join(functions)}, whose backward may read state "
                        "that the recompute changed (global variables, attributes)")

    handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with state_kept(model), python_state_kept(model):
            workload.loss()
    finally:
        for h in handles:
            h.remove()
    return seen or ["none seen in one forward: look for state its forward or backward reads and changes"]


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)


def _custom_functions(out: Any, stop: set[Any], limit: int = 10_000) -> list[str]:
    """Names of the custom ``torch.autograd.Function`` nodes between ``out``'s grad_fn and the unit's inputs'."""
    todo = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
    seen: set[Any] = set(stop)
    names: list[str] = []
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            name = type(node).__name__.removesuffix("Backward")
            if name not in names:
                names.append(name)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return names

"""Which neighbouring units can be recomputed as one chain region, found on a real step.

A region (``env.runtime.apply.Region``) runs its units one after the other on the previous
unit's output, as ``checkpoint_sequential`` runs a segment. That is the model's own computation
only where the units form a chain: unit i is called once per step, on exactly one tensor, the
very tensor unit i - 1 returned, and nothing else uses that tensor. GPT blocks in a ModuleList
chain; a block's LayerNorm and attention chain (attention runs on the norm's output); attention
and the next LayerNorm do not (the norm runs on the residual sum made between them).

:func:`chain_links` finds out in two steps:

1. one forward with hooks on the units (no gradients, RNG restored): the pairs whose second
   unit is called once, on the first unit's output alone (both called on one tensor) are
   candidates;
2. one training step (forward and backward, no optimizer step) with every candidate pair
   chained, against the same step without a plan, from the same RNG state: the same loss and
   gradients confirm them. What the hooks cannot see (the parent using the first unit's output
   again, e.g. in a residual sum) changes the loss; then each run of candidates is tried alone,
   and in a run that fails each pair alone, and only the pairs that give the same step chain.

Model state is left as it was: gradients, buffers (BatchNorm statistics) and the RNG state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

from env.data.errors import PlanError
from env.data.plan import Action, Plan, fingerprint
from env.data.segments import blocked_spans
from env.runtime.apply import _restore_buffers, apply_actions, runs_forward
from env.workloads.workload import Workload

RTOL, ATOL = 1e-4, 1e-6  # a chain reruns the same kernels on the same data: equal up to summation order


@contextlib.contextmanager
def state_kept(model: nn.Module) -> Iterator[None]:
    """The model's buffers, gradients and the RNG as before: an instrumented step changes nothing."""
    grads = [(p, p.grad) for p in model.parameters()]
    for p, _ in grads:
        p.grad = None  # else backward would add into the caller's gradients in place
    cuda = sorted({p.device.index or 0 for p, _ in grads if p.is_cuda})
    with torch.random.fork_rng(devices=cuda), _restore_buffers(model):
        try:
            yield
        finally:
            for p, g in grads:
                p.grad = g


def candidate_links(workload: Workload, units: Sequence[str]) -> list[bool]:
    """links[i]: unit i is called once, on the tensor unit i - 1 returned alone (from one forward's hooks)."""
    model = workload.model
    calls: dict[int, list[tuple[tuple, dict, Any]]] = {i: [] for i in range(len(units))}

    def hook(i: int) -> Any:
        def record(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            calls[i].append((args, kwargs, output))
        return record

    handles = [model.get_submodule(u).register_forward_hook(hook(i), with_kwargs=True) for i, u in enumerate(units)]
    try:
        with state_kept(model), torch.no_grad():
            workload.loss()
    finally:
        for h in handles:
            h.remove()

    def one_tensor_call(i: int) -> bool:
        return (len(calls[i]) == 1 and len(calls[i][0][0]) == 1 and not calls[i][0][1]
                and isinstance(calls[i][0][0][0], torch.Tensor) and isinstance(calls[i][0][2], torch.Tensor))

    return [False] + [one_tensor_call(i - 1) and one_tensor_call(i) and calls[i][0][0][0] is calls[i - 1][0][2]
                      for i in range(1, len(units))]


def _runs(links: Sequence[bool]) -> list[tuple[int, int]]:
    """(start, stop) of the maximal runs of units joined by links."""
    out: list[tuple[int, int]] = []
    for i, link in enumerate(links):
        if link and out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        elif link:
            out.append((i - 1, i + 1))
    return out


Step = tuple[torch.Tensor, list]  # the loss and each parameter's gradient (None: it got none) of one training step


def training_step(workload: Workload, seed: int, plan: Plan | None = None, units: Sequence[str] = (),
                  model: nn.Module | None = None) -> Step:
    """Loss and gradients of one forward and backward from the RNG state ``seed`` under ``plan`` (None: no plan),
    through ``model`` where given (the workload's model compiled), model state kept."""
    with state_kept(workload.model):
        torch.manual_seed(seed)
        with apply_actions(workload.model, plan, units) if plan is not None else contextlib.nullcontext():
            loss = (dataclasses.replace(workload, model=model) if model is not None else workload).loss()
            loss.backward()
        grads = [None if p.grad is None else _whole(p.grad) for p in workload.model.parameters()]
    return loss.detach(), grads


def _whole(grad: torch.Tensor) -> torch.Tensor:
    """A copy of ``grad``; under FSDP2 (a ``DTensor``) the whole gradient, gathered from every rank: a collective
    that every rank makes in the same parameter order, so that each compares the same tensors."""
    full = getattr(grad, "full_tensor", None)
    return full().detach() if full is not None else grad.detach().clone()


def same_step(a: Step, b: Step) -> bool:
    """The same loss and gradients up to summation order."""
    if not torch.allclose(a[0], b[0], rtol=RTOL, atol=ATOL):
        return False
    return all((x is None) == (y is None) and (x is None or torch.allclose(x, y, rtol=RTOL, atol=ATOL))
               for x, y in zip(a[1], b[1]))


def step_error(a: Step, b: Step) -> float:
    """How far step ``a`` lies from step ``b``: the largest difference of the loss, or of a parameter's gradient,
    relative to ``b``'s largest magnitude of it (infinite where one has a gradient the other lacks)."""
    def rel(x: torch.Tensor, y: torch.Tensor) -> float:
        return float((x - y).abs().max() / y.abs().max().clamp_min(torch.finfo(y.dtype).tiny))

    if any((x is None) != (y is None) for x, y in zip(a[1], b[1])):
        return math.inf
    return max([rel(a[0], b[0])] + [rel(x, y) for x, y in zip(a[1], b[1]) if x is not None and y is not None])


def chain_links(workload: Workload, units: Sequence[str], seed: int = 0) -> list[bool]:
    """links[i]: unit i can continue the chain region of unit i - 1 (links[0] is False); see the module docstring."""
    links = candidate_links(workload, units)
    if not any(links):
        return links
    fp = fingerprint(workload.model, units)
    reference = training_step(workload, seed)

    def chains(joined: Sequence[tuple[int, int]]) -> bool:
        actions = [Action.KEEP] * len(units)
        for start, stop in joined:
            actions[start:stop] = [Action.RECOMPUTE] + [Action.CHAIN] * (stop - start - 1)
        try:
            return same_step(training_step(workload, seed, Plan.from_list(units, actions, fp), units), reference)
        except PlanError:  # a region's runtime check: the units are not called as a chain with gradients on
            return False

    runs = _runs(links)
    if chains(runs):
        return links
    confirmed = [False] * len(units)
    for start, stop in runs:
        pairs = [(i - 1, i + 1) for i in range(start + 1, stop)]
        for a, b in ([(start, stop)] if chains([(start, stop)]) else [p for p in pairs if chains([p])]):
            confirmed[a + 1:b] = [True] * (b - a - 1)
    return confirmed


def parent_runs(model: nn.Module, units: Sequence[str]) -> list[tuple[int, int]]:
    """(start, stop) of each run of two or more units (in execution order) that are all the units of one parent
    module, every child of it with parameters among them, that parent being neither the model itself nor a
    container without a forward of its own (a ``ModuleList``): the runs ``block`` could recompute as their parent."""
    parents = [u.rpartition(".")[0] for u in units]
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(units) + 1):
        if i < len(units) and parents[i] == parents[start]:
            continue
        parent, run = parents[start], set(units[start:i])
        module = model.get_submodule(parent) if parent else model
        weighted = {f"{parent}.{name}" for name, child in module.named_children() if any(True for _ in child.parameters())}
        whole = parents.count(parent) == i - start and weighted <= run  # no unit of it elsewhere, none of it outside
        if i - start >= 2 and parent and whole and runs_forward(module):
            out.append((start, i))
        start = i
    return out


def block_spans(workload: Workload, units: Sequence[str], seed: int = 0) -> list[tuple[int, int]]:
    """The runs of ``parent_runs`` whose parent, recomputed as a whole, gives the same training step (loss and
    gradients) as without a plan: tried all at once, and where that fails each alone."""
    runs = parent_runs(workload.model, units)
    if not runs:
        return []
    fp = fingerprint(workload.model, units)
    reference = training_step(workload, seed)

    def same(spans: Sequence[tuple[int, int]]) -> bool:
        plan = Plan.from_list(units, blocked_spans(len(units), spans), fp)
        try:
            return same_step(training_step(workload, seed, plan, units), reference)
        except PlanError:
            return False

    return runs if same(runs) else [r for r in runs if same([r])]

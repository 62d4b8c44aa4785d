"""Apply a checkpoint plan to a model in place, and remove it again.

This is the one module that calls ``torch.utils.checkpoint``. Each action is a small policy
object (after torchtitan's ``activation_checkpoint.py``) that wraps a unit's forward; the
wrapper is installed as the instance's ``forward`` attribute, so FQNs, ``state_dict`` keys and
hooks are unchanged, and removing it restores the module exactly.

Correctness rules, all tested:
- ``use_reentrant=False`` and ``preserve_rng_state=True``: dropout masks are replayed, so a
  plan never changes the gradients.
- Recomputing a unit runs its forward again, which would update BatchNorm's running
  statistics twice; every recompute restores the unit's buffers to what they were, so model
  state is as it would be without checkpointing.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from env.data.errors import PlanError
from env.data.plan import Action, Plan, check_plan, fingerprint
from env.runtime.offload import offloaded_forward

_aten = torch.ops.aten
# Outputs that 'selective' saves: the expensive ops (matmuls, convolutions, attention).
SAVED_OPS: frozenset = frozenset(
    op for op in (
        _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
        _aten.convolution.default, _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_efficient_attention.default,
        getattr(_aten, "_scaled_dot_product_cudnn_attention", None) and _aten._scaled_dot_product_cudnn_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
    ) if op is not None
)
_MARK = "_ckpt_search_action"


@contextlib.contextmanager
def _restore_buffers(module: nn.Module) -> Iterator[None]:
    """Undo buffer updates made while a unit is recomputed (BatchNorm running stats)."""
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _eager_contexts(selective: bool, module: nn.Module) -> tuple[Any, Any]:
    """``context_fn`` of an eager unit: the policy's contexts, and the unit's buffers restored after a recompute."""
    if selective:
        fwd_ctx, recompute_ctx = create_selective_checkpoint_contexts(_selective_policy)
    else:
        fwd_ctx, recompute_ctx = contextlib.nullcontext(), contextlib.nullcontext()
    return fwd_ctx, _restore_after(recompute_ctx, module)


@contextlib.contextmanager
def _restore_after(recompute_ctx: Any, module: nn.Module) -> Iterator[None]:
    with _restore_buffers(module), recompute_ctx:
        yield


class Policy:
    """How one action wraps a unit's forward. ``None`` from ``wrap`` means: leave it as is."""

    action: Action

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any] | None:
        raise NotImplementedError


class Keep(Policy):
    action = Action.KEEP

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any] | None:
        return None


class Recompute(Policy):
    """Full checkpoint of the unit; ``selective`` keeps the outputs of ``SAVED_OPS``.

    Under ``torch.compile`` the wrapper traces into one graph (no graph break, ``fullgraph=True``
    works): dynamo turns ``checkpoint`` into a tagged region and the partitioner recomputes it in
    backward. There ``context_fn`` must be something dynamo keeps as a constant (a partial of
    module-level functions, made in the traced code; a bound method or a global function
    variable is refused), and the eager buffer restore is not needed: the compiled graph applies
    buffer updates once, from the forward, and replays random ops with the forward's RNG state.
    """

    def __init__(self, selective: bool = False) -> None:
        self.selective = selective
        self.action = Action.SELECTIVE if selective else Action.RECOMPUTE

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        selective = self.selective

        @functools.wraps(forward)
        def checkpointed(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                context_fn = functools.partial(_eager_contexts, selective, module)
            elif selective:  # a partial made here: dynamo reads it as a constant (a global function it does not)
                context_fn = functools.partial(create_selective_checkpoint_contexts, _selective_policy)
            else:
                return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
            return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True,
                              context_fn=context_fn, **kwargs)
        return checkpointed


class Offload(Policy):
    """Keep activations in pinned host memory during the step, copied on a side stream (``env.runtime.offload``); CUDA only."""

    action = Action.OFFLOAD

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        return offloaded_forward(module, forward)


POLICIES: dict[Action, Policy] = {
    Action.KEEP: Keep(), Action.RECOMPUTE: Recompute(), Action.SELECTIVE: Recompute(selective=True),
    Action.OFFLOAD: Offload(),
}


def _on_cuda(module: nn.Module) -> bool:
    p = next(module.parameters(), None)
    return p is not None and p.is_cuda


@dataclass
class AppliedPlan:
    """Handle of a plan applied in place; ``remove()`` (or leaving the ``with``) undoes it."""

    model: nn.Module
    plan: Plan
    applied: dict[str, Action] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # units of the plan the model lacks (strict=False)
    # a unit's own instance ``forward`` from before the plan (set by other code), put back on remove
    previous_forward: dict[str, Any] = field(default_factory=dict)

    def remove(self) -> None:
        for fqn in list(self.applied):
            module = self.model.get_submodule(fqn)
            module.__dict__.pop("forward", None)
            module.__dict__.pop(_MARK, None)
            if fqn in self.previous_forward:
                module.__dict__["forward"] = self.previous_forward.pop(fqn)
            del self.applied[fqn]

    def __enter__(self) -> "AppliedPlan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def apply_actions(model: nn.Module, plan: Plan, units: Sequence[str] | None = None,
                  strict: bool = True) -> AppliedPlan:
    """Install the plan's per-unit wrappers on ``model``; check it fits the model first."""
    if strict:
        check_plan(plan, model, units)
    names = {n for n, _ in model.named_modules()}
    handle = AppliedPlan(model, plan)
    if not strict:
        handle.skipped = [u for u in plan.actions if u not in names]
    wanted = {u: a for u, a in plan.actions.items() if u in names}
    if Action.OFFLOAD in wanted.values() and not (torch.cuda.is_available() and _on_cuda(model)):
        unit = next(u for u, a in wanted.items() if a is Action.OFFLOAD)
        raise PlanError(
            f"action 'offload' (unit '{unit}') needs a CUDA model and this one is on "
            f"{'CPU' if not _on_cuda(model) else 'a device without CUDA'}; move the model to CUDA or use recompute/selective"
        )
    for fqn, action in wanted.items():
        module = model.get_submodule(fqn)
        if _MARK in module.__dict__:
            handle.remove()
            raise PlanError(f"unit '{fqn}' already has a plan applied; remove it first (handle.remove())")
        wrapped = POLICIES[action].wrap(module, module.forward)
        if wrapped is not None:
            if "forward" in module.__dict__:
                handle.previous_forward[fqn] = module.__dict__["forward"]
            module.forward = wrapped  # instance attribute: shadows the class's forward only
            module.__dict__[_MARK] = action
            handle.applied[fqn] = action
    return handle


def plan_for(model: nn.Module, units: Sequence[str], actions: Sequence[Action | str]) -> Plan:
    """The plan giving ``actions[i]`` to ``units[i]`` of this model."""
    return Plan.from_list(units, actions, fingerprint(model, units))


def planned_units(model: nn.Module) -> list[str]:
    """FQNs of the units of ``model`` that have a plan's wrapper installed now."""
    return [name for name, m in model.named_modules() if _MARK in m.__dict__]

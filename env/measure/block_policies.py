"""torchtitan's activation-checkpointing policies, installed per block as its users run them.

torchtitan (``torchtitan/distributed/activation_checkpoint.py``) wraps each transformer block:

- **op** selective AC (``selective_ac_option = "op"``): the block checkpointed with
  ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` under a policy that saves the outputs of
  attention (every scaled-dot-product-attention kernel) and of every second matmul (the first, third, ...
  of each forward of the block), and recomputes everything else in backward;
- **layer** selective AC (``selective_ac_option = "n"``): every n-th block (the n-th, 2n-th, ... counted
  from 1) fully checkpointed, the others not.

Two departures, both so that a peer keeps the gradients of no checkpointing: torchtitan passes
``preserve_rng_state=False`` (its models have no dropout); here the RNG state is preserved, so a dropout
recomputed in backward draws the mask it drew in forward. And torchtitan's models have no bias, so their
matmuls are ``aten.mm``; a ``Linear`` with a bias runs ``aten.addmm``, which is counted as a matmul here, as
the policy means it. Where scaled-dot-product attention runs its math path (on CPU with dropout), there is no
attention kernel to save, and its ``bmm`` are recomputed with the rest. The blocks are wrapped by replacing their ``forward`` (undone on exit), as
``checkpoint_sequential``'s peer does, so the model's own code calls them unchanged.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from env.data.errors import PlanError

_aten = torch.ops.aten
MATMULS = frozenset({_aten.mm.default, _aten.addmm.default})
ATTENTION = frozenset(getattr(_aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable") if hasattr(_aten, name))


def op_sac_context() -> tuple[Any, Any]:
    """One forward's selective-checkpoint contexts under torchtitan's op policy: attention's outputs and every
    second matmul's (the odd ones, counted separately in forward and in the recompute) saved, the rest
    recomputed."""
    matmuls: defaultdict[bool, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in MATMULS:
            matmuls[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if matmuls[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in ATTENTION else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def layer_picks(n_blocks: int, every: int) -> list[bool]:
    """Which blocks torchtitan's layer policy checkpoints: the n-th, 2n-th, ... counted from 1."""
    if every < 1:
        raise PlanError(f"every={every} blocks must be at least 1 (1 checkpoints every block)")
    return [(i + 1) % every == 0 for i in range(n_blocks)]


@contextlib.contextmanager
def wrapped_blocks(blocks: Sequence[nn.Module], picks: Sequence[bool],
                   context_fn: Callable[[], tuple[Any, Any]] | None) -> Iterator[None]:
    """Each picked block's forward run under ``torch.utils.checkpoint.checkpoint`` (non-reentrant, RNG state
    preserved), with ``context_fn`` where given (selective), until exit."""
    _refuse_wrapped(blocks)
    picked = [b for b, p in zip(blocks, picks) if p]
    with wrapped_modules(picked, [context_fn] * len(picked)):
        yield


@contextlib.contextmanager
def wrapped_modules(modules: Sequence[nn.Module],
                    context_fns: Sequence[Callable[[], tuple[Any, Any]] | None]) -> Iterator[None]:
    """Each module checkpointed as ``wrapped_blocks`` does, each with its own ``context_fn`` (None: the whole
    module recomputed), until exit."""
    _refuse_wrapped(modules)
    for module, context_fn in zip(modules, context_fns):
        module.forward = _checkpointed(module.forward, {"context_fn": context_fn} if context_fn is not None else {})
    try:
        yield
    finally:
        for module in modules:
            module.__dict__.pop("forward", None)


def _refuse_wrapped(modules: Sequence[nn.Module]) -> None:
    taken = [i for i, b in enumerate(modules) if "forward" in b.__dict__]
    if taken:
        raise PlanError(f"block {taken[0]} already has its forward replaced; remove that wrapper first")


def _checkpointed(forward: Callable[..., Any], extra: dict[str, Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **extra, **kwargs)

    return run

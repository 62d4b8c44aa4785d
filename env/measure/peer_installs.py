"""How each peer kind of ``env.measure.peers`` is installed on a workload, and undone: transformers' own
checkpointing, ``checkpoint_sequential`` over a chain of blocks, torchtitan's policies on the blocks
(``env.measure.block_policies``), PyTorch's auto-SAC on the modules its ILP picks (``env.measure.auto_sac``) and a
compile budget's options. Each is a context manager of
(workload, peer) that ``env.measure.peers.KINDS`` names."""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

from env.data.errors import PlanError, WorkloadError
from env.measure.block_policies import layer_picks, op_sac_context, wrapped_blocks
from env.measure.compiled import CompileOptions
from env.workloads.workload import Workload

if TYPE_CHECKING:
    from env.measure.auto_sac import AutoSacPlan
    from env.measure.peers import Peer


def is_hf_checkpointing_layer(module: nn.Module) -> bool:
    """A transformers layer that its own gradient checkpointing wraps (``GradientCheckpointingLayer``)."""
    return any(c.__name__ == "GradientCheckpointingLayer" for c in type(module).__mro__)


def hf_model(model: nn.Module) -> bool:
    return bool(getattr(model, "supports_gradient_checkpointing", False)) and (
        hasattr(model, "activation_checkpointing_enable") or hasattr(model, "gradient_checkpointing_enable"))


def supports_every_n(model: nn.Module) -> bool:
    enable = getattr(model, "activation_checkpointing_enable", None)
    return enable is not None and "every_n_layers" in inspect.signature(enable).parameters




_HF_ATTRS = ("gradient_checkpointing", "_gradient_checkpointing_func", "_require_grads_hooks", "_require_grads_hook")
_MISSING = object()


@contextlib.contextmanager
def hf_checkpointing(workload: Workload, peer: Peer) -> Iterator[None]:
    model, n = workload.model, int(peer.params["every_n_layers"])
    if not hf_model(model):
        raise WorkloadError(f"peer '{peer.name}' needs a transformers model that supports gradient checkpointing; "
                            f"workload '{workload.spec}' has a {type(model).__name__}; pick another peer")
    if n != 1 and not supports_every_n(model):
        raise WorkloadError(f"peer '{peer.name}': this transformers has no every_n_layers (transformers 5 does); "
                            "upgrade transformers or use every_n_layers=1")
    # transformers' disable leaves its attributes and the input-grad hook behind: put back what was there
    saved = [(m, {a: m.__dict__.get(a, _MISSING) for a in _HF_ATTRS}) for m in model.modules()]
    hooks_before = list(getattr(model, "_require_grads_hooks", []) or [])
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=n)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    try:
        yield
    finally:
        for hook in getattr(model, "_require_grads_hooks", []) or []:
            if hook not in hooks_before:
                hook.remove()
        for m, attrs in saved:
            for a, v in attrs.items():
                if v is _MISSING:
                    m.__dict__.pop(a, None)
                else:
                    m.__dict__[a] = v


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _children_of(workload: Workload, peer: Peer, name: str) -> list[nn.Module]:
    """The children of the module ``name`` a peer wraps; one line where the workload has no such module."""
    try:
        container = workload.model.get_submodule(name)
    except AttributeError:
        raise WorkloadError(f"peer '{peer.name}': workload '{workload.spec}' has no module '{name}'; "
                            "list the peers of this workload with env.measure.peers.peers_for") from None
    return list(container.children())


@contextlib.contextmanager
def checkpoint_sequential_blocks(workload: Workload, peer: Peer) -> Iterator[None]:
    chain, k = str(peer.params["chain"]), int(peer.params["segments"])
    children = _children_of(workload, peer, chain)
    if not 1 <= k <= len(children):
        raise WorkloadError(f"peer '{peer.name}': segments={k} must be between 1 and the chain's {len(children)} blocks")
    taken = [i for i, c in enumerate(children) if "forward" in c.__dict__]
    if taken:
        raise PlanError(f"peer '{peer.name}': block {chain}.{taken[0]} already has its forward replaced; "
                        "remove that wrapper first")
    forwards = [c.forward for c in children]

    def segmented(x: torch.Tensor) -> torch.Tensor:
        return checkpoint_sequential(forwards, k, x, use_reentrant=False, preserve_rng_state=True)

    # The parent calls the blocks in order: the first runs the whole chain in segments, the rest pass through.
    # (The blocks' own forward hooks are bypassed meanwhile.)
    children[0].forward = segmented
    for c in children[1:]:
        c.forward = _identity
    try:
        yield
    finally:
        for c in children:
            c.__dict__.pop("forward", None)


def _blocks_of(workload: Workload, peer: Peer) -> list[nn.Module]:
    """The blocks a torchtitan peer wraps: the children of its ``blocks`` container (transformers' checkpointing
    layers among them, on a transformers model)."""
    children = _children_of(workload, peer, str(peer.params["blocks"]))
    layers = [c for c in children if is_hf_checkpointing_layer(c)]
    return layers or children


@contextlib.contextmanager
def titan_op_sac(workload: Workload, peer: Peer) -> Iterator[None]:
    blocks = _blocks_of(workload, peer)
    with wrapped_blocks(blocks, [True] * len(blocks), op_sac_context):
        yield


@contextlib.contextmanager
def titan_layer_sac(workload: Workload, peer: Peer) -> Iterator[None]:
    blocks = _blocks_of(workload, peer)
    with wrapped_blocks(blocks, layer_picks(len(blocks), int(peer.params["every"])), None):
        yield


@contextlib.contextmanager
def torch_auto_sac(workload: Workload, peer: Peer) -> Iterator[None]:
    from env.measure import auto_sac  # torch.distributed's tools, loaded where the peer runs

    reason = auto_sac.missing()
    if reason is not None:
        raise WorkloadError(f"peer '{peer.name}': {reason}")
    with auto_sac.installed(workload, auto_sac_plan(workload, peer)):
        yield


def auto_sac_plan(workload: Workload, peer: Peer) -> "AutoSacPlan":
    """An auto-SAC peer's decisions (``env.measure.auto_sac.AutoSacPlan``): those it carries (``decided``), else
    solved here."""
    from env.measure import auto_sac

    if "decided" in peer.params:
        return auto_sac.AutoSacPlan.from_json(str(peer.params["decided"]))
    return auto_sac.solve(workload, float(peer.params["budget"]))



@contextlib.contextmanager
def compile_budget(workload: Workload, peer: Peer) -> Iterator[CompileOptions]:
    yield CompileOptions(activation_memory_budget=float(peer.params["budget"]))


@contextlib.contextmanager
def eager(install: Callable[[Workload, Peer], contextlib.AbstractContextManager[None]],
           workload: Workload, peer: Peer) -> Iterator[None]:
    with install(workload, peer):
        yield None

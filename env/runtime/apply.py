"""Apply a checkpoint plan to a model in place, and remove it again.

This is the one module that calls ``torch.utils.checkpoint``. Each action is a small policy
object (after torchtitan's ``activation_checkpoint.py``) that wraps a unit's forward; the
wrapper is installed as the instance's ``forward`` attribute, so FQNs, ``state_dict`` keys and
hooks are unchanged, and removing it restores the module exactly.

``block`` units (every unit of one parent module, ``env.data.plan``) are left as they are and their parent is
recomputed instead, as a ``recompute`` unit is; the handle names the parent with ``block``.

A region (a ``recompute`` unit and the ``chain`` units after it, ``env.data.plan``) is one
:class:`Region`: the first unit's forward runs every unit of the region inside one
``checkpoint``, as ``torch.utils.checkpoint.checkpoint_sequential`` runs a segment, and the
others pass on the tensor they are given. That needs units that form a chain (each unit's only
input is the previous unit's output, which nothing else uses); a region over units that do
not is refused in one line naming the pair, when the step reaches them
(``env.runtime.chains`` finds the pairs that chain before a search proposes any).

Correctness rules, all tested:
- ``use_reentrant=False`` and ``preserve_rng_state=True``: dropout masks are replayed, so a
  plan never changes the gradients.
- ``selective`` and ``light`` never serve a call that draws random numbers from their saved outputs
  (``draws_random``: attention with dropout, whose fused CUDA kernels draw their own mask): the recompute
  replays the draws in the forward's order, and one skipped draw would give every later dropout another mask.
- Recomputing a unit runs its forward again, which would update BatchNorm's running
  statistics twice; every recompute restores the unit's buffers to what they were, so model
  state is as it would be without checkpointing.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, NoReturn, Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from env.data.errors import PlanError
from env.data.plan import Action, Plan, check_plan, fingerprint, regions
from env.runtime.offload import offloaded_forward

_aten = torch.ops.aten
# Outputs that 'selective' saves: the expensive ops (matmuls, convolutions, attention), unless a call draws random
# numbers (``draws_random``).
SAVED_OPS: frozenset = frozenset(
    op for op in (
        _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
        _aten.convolution.default, _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_efficient_attention.default,
        getattr(_aten, "_scaled_dot_product_cudnn_attention", None) and _aten._scaled_dot_product_cudnn_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
    ) if op is not None
)
# Outputs that 'light' saves besides: the normalizations and softmaxes, whose recompute reads a whole row per
# output; what it recomputes (the pointwise ops: activations, residual sums, scalings, dropout) is the cheapest per
# byte. Batch norm is left out: an in-place activation after it (ReLU(inplace=True)) would change a saved output.
LIGHT_SAVED_OPS: frozenset = SAVED_OPS | frozenset(
    getattr(_aten, name).default for name in ("native_layer_norm", "_softmax", "_safe_softmax", "_log_softmax")
    if hasattr(_aten, name)
)
_MARK = "_ckpt_search_action"
Compiler = Callable[[Callable[..., Any], bool], Callable[..., Any]]  # (a unit's forward, recomputed?) -> compiled
# Inductor's options for a recomputed unit compiled on its own: no layout optimization. With it, inductor copies a
# convolution's input into channels-last order, and the unit's backward graph saves that copy beside the input,
# which stays alive anyway (the batch, or the unit before's output), so the unit's peak holds its input twice
# (docs/measurement.md, "Compiled steps").
RECOMPUTED_UNIT_OPTIONS: dict[str, Any] = {"layout_optimization": False}


def compile_forward(forward: Callable[..., Any], recomputed: bool, backend: str = "inductor",
                    dynamic: bool | None = None) -> Callable[..., Any]:
    """A unit's forward compiled on its own (regional compilation), as ``--compile`` measures a plan and
    ``compile_units=True`` applies it; ``recomputed``: the unit is recomputed (its checkpoint is inside
    ``forward``, or a region recomputes it), so it gets ``RECOMPUTED_UNIT_OPTIONS``."""
    options = RECOMPUTED_UNIT_OPTIONS if recomputed and backend == "inductor" else None
    return torch.compile(forward, backend=backend, dynamic=dynamic, options=options)


@contextlib.contextmanager
def _restore_buffers(*modules: nn.Module) -> Iterator[None]:
    """Undo buffer updates made while units are recomputed (BatchNorm running stats)."""
    saved = [(b, b.detach().clone()) for module in modules for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


def draws_random(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether this call of ``op`` draws from the RNG: a seeded op (``torch.Tag.nondeterministic_seeded``), unless
    it has a ``dropout_p`` argument and it is 0 here (attention without dropout draws nothing)."""
    if torch.Tag.nondeterministic_seeded not in getattr(op, "tags", ()):
        return False
    names = [a.name for a in op._schema.arguments]
    if "dropout_p" not in names:
        return True
    i = names.index("dropout_p")
    p = kwargs.get("dropout_p", args[i] if i < len(args) else op._schema.arguments[i].default_value)
    return bool(p)


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Save the outputs of ``SAVED_OPS``, except a call that draws random numbers (attention with dropout on
    CUDA, where the fused kernel draws its own mask): the recompute starts from the forward's RNG state and
    replays the draws in order, so a draw served from the saved outputs would shift every later one (the
    next dropout's mask) and change the gradients."""
    if op in SAVED_OPS and not draws_random(op, args, kwargs):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _light_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """``light``, the graded selective checkpoint: save the outputs of ``LIGHT_SAVED_OPS`` (``SAVED_OPS`` and the
    normalizations and softmaxes) and recompute the rest (pointwise ops, dropout, views, copies), with the same
    rule for random draws as ``_selective_policy``: a call that draws is recomputed, so the draws replay in order."""
    if op in LIGHT_SAVED_OPS and not draws_random(op, args, kwargs):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _eager_contexts(policy: Callable[..., CheckpointPolicy] | None, *modules: nn.Module) -> tuple[Any, Any]:
    """``context_fn`` of eager units: the save policy's contexts (None: save nothing), and the units' buffers
    restored after a recompute."""
    if policy is not None:
        fwd_ctx, recompute_ctx = create_selective_checkpoint_contexts(policy)
    else:
        fwd_ctx, recompute_ctx = contextlib.nullcontext(), contextlib.nullcontext()
    return fwd_ctx, _restore_after(recompute_ctx, *modules)


@contextlib.contextmanager
def _restore_after(recompute_ctx: Any, *modules: nn.Module) -> Iterator[None]:
    with _restore_buffers(*modules), recompute_ctx:
        yield


class Policy:
    """How one action wraps a unit's forward (``None`` from ``wrap`` means: leave it as is), and what it needs of
    the unit and the model (``unmet``), checked for every unit before any is wrapped (``check_preconditions``)."""

    action: Action

    def unmet(self, model: nn.Module, module: nn.Module) -> str | None:
        """Why this action cannot run on unit ``module`` of ``model``, with the fix, in words; None where it can."""
        return None

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any] | None:
        raise NotImplementedError


class Keep(Policy):
    action = Action.KEEP

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any] | None:
        return None


class Recompute(Policy):
    """Full checkpoint of the unit, or with ``policy`` a selective one: ``selective`` keeps the outputs of
    ``SAVED_OPS`` (``_selective_policy``), ``light`` those of ``LIGHT_SAVED_OPS`` (``_light_policy``).

    Under ``torch.compile`` the wrapper traces into one graph (no graph break, ``fullgraph=True``
    works): dynamo turns ``checkpoint`` into a tagged region and the partitioner recomputes it in
    backward. There ``context_fn`` must be something dynamo keeps as a constant (a partial of
    module-level functions, made in the traced code; a bound method or a global function
    variable is refused), and the eager buffer restore is not needed: the compiled graph applies
    buffer updates once, from the forward, and replays random ops with the forward's RNG state.
    """

    def __init__(self, action: Action = Action.RECOMPUTE,
                 policy: Callable[..., CheckpointPolicy] | None = None) -> None:
        self.action, self.policy = action, policy

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        policy = self.policy

        @functools.wraps(forward)
        def checkpointed(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                context_fn = functools.partial(_eager_contexts, policy, module)
            elif policy is not None:  # a partial made here: dynamo reads it as a constant (a global function it does not)
                context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
            else:
                return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
            return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True,
                              context_fn=context_fn, **kwargs)
        return checkpointed


class Offload(Policy):
    """Keep activations in pinned host memory during the step, copied on a side stream (``env.runtime.offload``); CUDA only."""

    action = Action.OFFLOAD

    def unmet(self, model: nn.Module, module: nn.Module) -> str | None:
        if torch.cuda.is_available() and _on_cuda(model):
            return None
        return (f"needs a CUDA model and this one is on {'CPU' if not _on_cuda(model) else 'a device without CUDA'}; "
                "move the model to CUDA or use recompute/selective")

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        return offloaded_forward(module, forward)


def is_loss_unit(module: nn.Module) -> bool:
    """Whether ``module`` is a loss unit, which ``chunked`` can run: one with ``chunked(hidden, targets)`` and
    ``token_loss_sum(hidden, targets)``, as ``env.workloads.lm_loss.LMLoss``."""
    return callable(getattr(module, "chunked", None)) and callable(getattr(module, "token_loss_sum", None))


class Chunked(Policy):
    """A loss unit's head and loss over chunks of tokens, each chunk checkpointed (``LMLoss.chunked``): the
    full logits and their softmax never exist; the same loss and gradients. Only a loss unit
    (``env.workloads.lm_loss.LMLoss``) can be chunked."""

    action = Action.CHUNKED

    def unmet(self, model: nn.Module, module: nn.Module) -> str | None:
        if is_loss_unit(module):
            return None
        return (f"needs a loss unit (env.workloads.lm_loss.LMLoss: the final norm, head and loss as one module), and "
                f"this unit is a {type(module).__name__}; keep or recompute it, or give the model's loss as an LMLoss "
                "(README, 'Your own model')")

    def wrap(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        return module.chunked


class _RegionState:
    """Where a region's step stands: the output its first unit returned, and which unit must pass it on next."""

    def __init__(self) -> None:
        self.output: Any = None
        self.next = 0


class Region:
    """A run of consecutive units recomputed as one ``checkpoint`` that keeps only the run's input.

    ``wrap()`` gives one forward per unit: the first runs the units' own forwards one after the
    other inside one checkpoint (each unit's output is the next one's input) and returns the
    last unit's output; each of the others returns the tensor it is called with, after checking
    that it is that output: the parent module calls the units in turn, and in a chain it hands
    each the previous one's output. Anything else (an input made in between, such as a residual
    sum, or more than one argument) means the units do not chain: refused (``PlanError``),
    naming the pair. The units' forward hooks run on those calls, around the region's first
    unit and on the passed-on tensor, not inside the region (as with ``checkpoint_sequential``).
    Under ``torch.compile`` the region traces into one graph as ``Recompute`` does.
    """

    def __init__(self, units: Sequence[str], modules: Sequence[nn.Module]) -> None:
        self.units, self.modules = list(units), list(modules)

    def wrap(self, forwards: Sequence[Callable[..., Any]]) -> list[Callable[..., Any]]:
        units, modules, state = self.units, self.modules, _RegionState()
        _refuse_sharded(units, modules)  # sharded already: refused as it is applied; sharded later: on its call

        def run(x: Any) -> Any:
            for unit, forward in zip(units, forwards):
                x = forward(x)
                if not isinstance(x, torch.Tensor):
                    _refuse(f"unit '{unit}' returns a {type(x).__name__}, and a chain region passes one tensor "
                                    "from unit to unit; recompute its region's units one by one instead of chaining")
            return x

        @functools.wraps(forwards[0])
        def first(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                _refuse_sharded(units, modules)
            if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
                _refuse(f"unit '{units[0]}' starts a chain region but is called with {_call_shape(args, kwargs)}; "
                                "a region passes one tensor from unit to unit: recompute these units one by one")
            if torch.compiler.is_compiling():
                out = checkpoint(run, args[0], use_reentrant=False, preserve_rng_state=True)
            else:
                out = checkpoint(run, args[0], use_reentrant=False, preserve_rng_state=True,
                                 context_fn=functools.partial(_eager_contexts, None, *modules))
            state.output, state.next = out, 1
            return out

        def passed_on(k: int) -> Callable[..., Any]:
            @functools.wraps(forwards[k])
            def pass_on(*args: Any, **kwargs: Any) -> Any:
                if state.next != k or len(args) != 1 or kwargs or args[0] is not state.output:
                    _refuse(
                        f"units '{units[k - 1]}' and '{units[k]}' do not chain: '{units[k]}' is not called on "
                        f"'{units[k - 1]}''s output alone (called with {_call_shape(args, kwargs)}); make "
                        f"'{units[k]}' recompute instead of chain (env.runtime.chains finds the pairs that chain)")
                state.next = k + 1
                if k == len(units) - 1:
                    state.output = None  # held no longer than the parent holds it: the step's peak is not raised
                return args[0]
            return pass_on

        return [first] + [passed_on(k) for k in range(1, len(units))]


def _refuse_sharded(units: Sequence[str], modules: Sequence[nn.Module]) -> None:
    """A region over units that FSDP2 shards cannot run: ``fully_shard`` gathers a unit's parameters in a hook
    on its call, and a region runs its units' forwards inside the first unit's call."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [u for u, m in zip(units[1:], modules[1:]) if isinstance(m, FSDPModule)]
    if sharded:
        raise PlanError(f"unit '{sharded[0]}' is sharded with FSDP2 (fully_shard) and chained to '{units[0]}': a chain "
                        "region cannot gather its parameters; under FSDP recompute these units one by one (a plan "
                        "searched with --fsdp has no chain)")


def _refuse(message: str) -> NoReturn:
    """Raise ``PlanError(message)``; while dynamo traces, a ``RuntimeError`` with it, which dynamo can build
    (it reports the message with ``fullgraph=True``, and without it the frame runs eagerly and raises this)."""
    if torch.compiler.is_compiling():
        raise RuntimeError(message)
    raise PlanError(message)


def _call_shape(args: tuple, kwargs: dict) -> str:
    """``1 tensor``, ``2 arguments``, ``1 tensor and keywords mask``: how a unit was called, in a few words."""
    what = "1 tensor" if len(args) == 1 and isinstance(args[0], torch.Tensor) else f"{len(args)} positional arguments"
    return what + (f" and keywords {', '.join(kwargs)}" if kwargs else "")


POLICIES: dict[Action, Policy] = {
    Action.KEEP: Keep(), Action.RECOMPUTE: Recompute(),
    Action.SELECTIVE: Recompute(Action.SELECTIVE, _selective_policy), Action.LIGHT: Recompute(Action.LIGHT, _light_policy),
    Action.OFFLOAD: Offload(), Action.CHUNKED: Chunked(),
}


def _on_cuda(module: nn.Module) -> bool:
    p = next(module.parameters(), None)
    return p is not None and p.is_cuda


def check_preconditions(model: nn.Module, actions: Mapping[str, Action]) -> None:
    """Refuse, in one line, the first unit (FQN -> action; units the model lacks are passed over) whose action
    cannot run on it (``Policy.unmet``; ``chain`` has no policy of its own: its region's first unit has one)."""
    modules = dict(model.named_modules())
    for unit, action in actions.items():
        policy = POLICIES.get(action)
        if unit in modules and policy is not None and (why := policy.unmet(model, modules[unit])) is not None:
            raise PlanError(f"action '{action.value}' (unit '{unit}') {why}")


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
                  strict: bool = True, compile_unit: Compiler | None = None) -> AppliedPlan:
    """Install the plan's per-unit wrappers, one :class:`Region` per chain, on ``model``; check it fits first.

    ``compile_unit`` (regional compilation, ``env.measure.compiled.unit_compiler``): every unit of the
    plan, kept ones too, runs a compiled forward: ``recompute`` and ``selective`` compile the unit with its
    checkpoint (the partitioner recomputes inside the unit's backward graph, and a selective policy sees
    the ops), ``keep`` the unit's own forward, and a chain region checkpoints its units' compiled
    forwards eagerly (one compile per unit, not one per region length; its recompute runs them again)."""
    if strict:
        check_plan(plan, model, units)
    names = {n for n, _ in model.named_modules()}
    handle = AppliedPlan(model, plan)
    if not strict:
        handle.skipped = [u for u in plan.actions if u not in names]
    wanted = {u: a for u, a in plan.actions.items() if u in names}
    check_preconditions(model, wanted)
    blocks = _block_forwards(model, wanted, compile_unit)  # by parent
    in_regions = {**_region_forwards(model, plan.actions, names, compile_unit), **blocks}
    for fqn, action in [(u, a) for u, a in wanted.items() if a != Action.BLOCK] + [(p, Action.BLOCK) for p in blocks]:
        module = model.get_submodule(fqn)
        if _MARK in module.__dict__:
            handle.remove()
            raise PlanError(f"unit '{fqn}' already has a plan applied; remove it first (handle.remove())")
        wrapped = in_regions[fqn] if fqn in in_regions else _wrap(module, action, compile_unit)
        if wrapped is not None:
            if "forward" in module.__dict__:
                handle.previous_forward[fqn] = module.__dict__["forward"]
            module.forward = wrapped  # instance attribute: shadows the class's forward only
            module.__dict__[_MARK] = action
            handle.applied[fqn] = action
    return handle


def _wrap(module: nn.Module, action: Action, compile_unit: Compiler | None) -> Callable[..., Any] | None:
    """The forward ``action`` installs on ``module`` (None: leave it), compiled as ``apply_actions`` says."""
    policy = POLICIES[action]
    if compile_unit is None:
        return policy.wrap(module, module.forward)
    if action in (Action.RECOMPUTE, Action.SELECTIVE, Action.LIGHT):  # the compiler sees the checkpoint: it recomputes in
        return compile_unit(policy.wrap(module, module.forward), True)  # its backward graph; a policy sees the ops
    compiled = compile_unit(module.forward, False)
    return policy.wrap(module, compiled) or compiled


def _region_forwards(model: nn.Module, actions: Mapping[str, Action], names: set[str],
                     compile_unit: Compiler | None = None) -> dict[str, Callable[..., Any]]:
    """The forwards of the units in the regions of ``actions`` (unit -> action, in execution order;
    ``env.data.plan.regions``), by FQN; ``names``: the model's module names. With ``compile_unit`` the
    region checkpoints its units' compiled forwards."""
    fqns = list(actions)
    out: dict[str, Callable[..., Any]] = {}
    for start, stop in regions(list(actions.values())):
        run = fqns[start:stop]
        missing = [u for u in run if u not in names]
        if missing:
            raise PlanError(f"the chain region '{run[0]}' .. '{run[-1]}' names unit '{missing[0]}' which "
                            f"{type(model).__name__} does not have; make the plan for this model")
        modules = [model.get_submodule(u) for u in run]
        forwards = [m.forward if compile_unit is None else compile_unit(m.forward, True) for m in modules]
        out.update(zip(run, Region(run, modules).wrap(forwards)))
    return out


def block_parents(actions: Mapping[str, Action]) -> dict[str, list[str]]:
    """The parent modules that ``block`` units (FQN -> action) recompute, each with its units, by FQN."""
    out: dict[str, list[str]] = {}
    for unit, action in actions.items():
        if action == Action.BLOCK:
            out.setdefault(unit.rpartition(".")[0], []).append(unit)
    return out


def runs_forward(module: nn.Module) -> bool:
    """Whether ``module`` has a forward of its own to recompute (a ``ModuleList`` or ``ModuleDict`` has none)."""
    return type(module).forward is not nn.Module.forward


def _block_forwards(model: nn.Module, actions: Mapping[str, Action],
                    compile_unit: Compiler | None = None) -> dict[str, Callable[..., Any]]:
    """The forward of each parent that ``block`` units recompute (a ``recompute`` of the parent, compiled with
    ``compile_unit``), by the parent's FQN; refused in one line where a parent is the model itself, runs no forward
    of its own, or has a unit that is not ``block``."""
    out: dict[str, Callable[..., Any]] = {}
    for parent, units in block_parents(actions).items():
        if not parent:
            raise PlanError(f"unit '{units[0]}' is 'block', which recomputes its parent module, and its parent is "
                            f"the model itself; make it recompute")
        others = [u for u, a in actions.items() if u.startswith(parent + ".") and a != Action.BLOCK]
        if others:
            raise PlanError(f"unit '{units[0]}' is 'block' and '{others[0]}', another unit of its parent '{parent}', "
                            f"is '{actions[others[0]].value}': 'block' recomputes the whole parent; make every unit "
                            f"of '{parent}' block, or none")
        module = model.get_submodule(parent)
        if not runs_forward(module):
            raise PlanError(f"unit '{units[0]}' is 'block' and its parent '{parent}' is a {type(module).__name__}, "
                            "which runs no forward of its own; recompute the units instead")
        out[parent] = _wrap(module, Action.RECOMPUTE, compile_unit)  # type: ignore[assignment]
    return out


def plan_for(model: nn.Module, units: Sequence[str], actions: Sequence[Action | str]) -> Plan:
    """The plan giving ``actions[i]`` to ``units[i]`` of this model."""
    return Plan.from_list(units, actions, fingerprint(model, units))


def planned_units(model: nn.Module) -> list[str]:
    """FQNs of the units of ``model`` that have a plan's wrapper installed now."""
    return [name for name, m in model.named_modules() if _MARK in m.__dict__]

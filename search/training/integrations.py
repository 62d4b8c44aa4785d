"""Plans in other people's training stacks: Hugging Face transformers, and FSDP's wrapper.

Hugging Face (optional: ``pip install 'ckpt-search[hf]'``):

- ``hf_units(model)``: the decision units of a transformers model, the layers transformers
  itself would checkpoint (its ``GradientCheckpointingLayer`` s: ``transformer.h.0`` ...,
  ``bert.encoder.layer.0`` ...).
- ``apply_hf_plan(model, plan)``: :func:`search.apply_plan` after two checks. transformers'
  own gradient checkpointing must be off (both would recompute the same layers), and the
  key/value cache must be off in training (a recomputed layer would write to it twice, which
  is why transformers turns it off under its own checkpointing too).

FSDP: ``fsdp_check_fn(model, plan)`` is the ``check_fn`` for
``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing``:
true for the plan's ``recompute`` units, so FSDP users keep their wrapping code. A plan with
chain regions is refused: that wrapper checkpoints one module at a time, and recomputing a
region's units one by one would keep every unit's input, more memory than the plan was chosen
for. Such a plan goes in with :func:`search.apply_plan` before ``fully_shard``.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Callable, Iterable

import torch.nn as nn

from env.data.errors import PlanError
from env.data.plan import Action, Plan, check_plan, regions
from env.measure.peers import is_hf_checkpointing_layer
from env.runtime.apply import AppliedPlan, block_parents
from env.units.find import find_units
from search.training.apply import PlanSource, apply_plan, read_plan

HF_INSTALL = "pip install 'ckpt-search[hf]' (transformers)"


def hf_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def hf_units(model: nn.Module) -> list[str]:
    """The outermost layers transformers can checkpoint, in order; else :func:`find_units`."""
    units: list[str] = []
    for name, module in model.named_modules():
        if is_hf_checkpointing_layer(module) and not any(name.startswith(u + ".") for u in units):
            units.append(name)
    return units or find_units(model)


def check_hf_model(model: nn.Module) -> None:
    """Refuse transformers' own checkpointing; turn the KV cache off for training (warns)."""
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        raise PlanError(
            f"{type(model).__name__} has transformers' gradient checkpointing on, and a plan would checkpoint "
            "the same layers again; call model.gradient_checkpointing_disable() (activation_checkpointing_disable() "
            "in transformers 5) before applying the plan"
        )
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        warnings.warn(f"{type(model).__name__}: use_cache=True is incompatible with checkpointing in training "
                      "(a recomputed layer writes its cache twice); setting config.use_cache=False", stacklevel=3)
        config.use_cache = False


def apply_hf_plan(model: nn.Module, plan_or_path: PlanSource, strict: bool = True) -> AppliedPlan:
    """:func:`search.apply_plan` for a transformers model, after :func:`check_hf_model`."""
    check_hf_model(model)
    return apply_plan(model, plan_or_path, strict=strict)


def fsdp_check_fn(model: nn.Module, plan_or_path: PlanSource, strict: bool = True,
                  actions: Iterable[Action] = (Action.RECOMPUTE,)) -> Callable[[nn.Module], bool]:
    """``check_fn`` for ``apply_activation_checkpointing``: true for the plan's ``recompute`` units, and for the
    parents its ``block`` units recompute whole.

    Call it on the model before wrapping (units are matched by identity, so the wrapper's
    renaming does not matter). ``selective`` and ``offload`` need their own context and are
    not expressible as a ``check_fn``: use :func:`search.apply_plan` for plans that have them.
    """
    plan = read_plan(plan_or_path)
    if strict:
        check_plan(plan, model)
    spans = regions(list(plan.actions.values()))
    if spans:
        units = list(plan.actions)
        start, stop = spans[0]
        raise PlanError(f"plan recomputes '{units[start]}' .. '{units[stop - 1]}' as one chain region, which "
                        "apply_activation_checkpointing cannot express (it wraps one module at a time); apply the plan "
                        "with search.apply_plan before fully_shard, or search without chain (--actions keep recompute "
                        "selective)")
    chosen = set(actions)
    modules = dict(model.named_modules())
    ids = {id(modules[u]) for u, a in plan.actions.items() if a in chosen and u in modules}
    if Action.RECOMPUTE in chosen:  # a block is its parent recomputed
        ids |= {id(modules[p]) for p in block_parents(plan.actions) if p in modules}
    return lambda module: id(module) in ids


def hf_plan_for(model: nn.Module, actions: Iterable[Action | str]) -> Plan:
    """The plan giving ``actions[i]`` to the i-th of :func:`hf_units`."""
    from env.runtime.apply import plan_for

    return plan_for(model, hf_units(model), list(actions))

"""``apply_plan(model, plan)``: put an exported checkpoint plan into training code.

    from search import apply_plan
    handle = apply_plan(model, "plan.json")   # a Plan, a path to a plan file, or its JSON text
    ...train...
    handle.remove()                           # or: with apply_plan(model, plan): ...

With ``torch.compile``: apply the plan first, then compile the model. The planned units trace
into the compiled graph without a graph break (``fullgraph=True`` works) and the compiler
recomputes them in backward, with the same gradients as without the plan::

    apply_plan(model, "plan.json")
    model = torch.compile(model)              # or model.compile()

A plan searched with ``--compile`` (``--compile-scope units``, the default) was measured with each unit
compiled on its own and the plan's checkpoints around it (regional compilation); apply it the same way::

    apply_plan(model, "plan.json", compile_units=True)   # compile nothing else

Applying or removing a plan on a model already compiled is seen by dynamo's guards (the units'
``forward`` changed): the next call compiles again, or reuses the graph of that plan from before.

With FSDP2: apply the plan first, then ``fully_shard`` the units (or their parents) and the root, as
torchtitan does: checkpointing inside, sharding outside::

    apply_plan(model, "plan.json")
    for block in model.blocks:                # the plan's units, or modules that contain them
        fully_shard(block)
    fully_shard(model)

A plan applied to a model already sharded that way composes the same (the plan replaces a unit's
``forward``, which ``fully_shard``'s hooks surround either way; the fingerprint sees through the
``FSDP<Class>`` that ``fully_shard`` makes), with the same gradients (``tests/test_fsdp.py``).

The work is done by :func:`env.runtime.apply.apply_actions` (the one place that checkpoints); this
module reads the plan from wherever it comes and decides what to do with a plan made for
another model: refuse it (``strict=True``), or apply the units the model has, list the rest in
``handle.skipped`` and warn (``strict=False``).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch.nn as nn

from env.data.errors import PlanError
from env.data.plan import Plan, fingerprint
from env.runtime.apply import AppliedPlan, apply_actions, compile_forward

PlanSource = Plan | str | Path


class PlanMismatchWarning(UserWarning):
    """A plan applied with ``strict=False`` that does not match the model exactly."""


def read_plan(plan_or_path: PlanSource) -> Plan:
    """A :class:`Plan` from a Plan, a path to a plan JSON file, or the JSON text itself."""
    if isinstance(plan_or_path, Plan):
        return plan_or_path
    if isinstance(plan_or_path, str) and plan_or_path.lstrip().startswith("{"):
        return Plan.from_json(plan_or_path, source="plan JSON text")
    if isinstance(plan_or_path, (str, Path)):
        return Plan.load(plan_or_path)
    raise PlanError(f"cannot read a plan from {type(plan_or_path).__name__}; "
                    "give a Plan, a path to a plan JSON file, or its JSON text")


def apply_plan(model: nn.Module, plan_or_path: PlanSource, strict: bool = True,
               compile_units: bool = False) -> AppliedPlan:
    """Apply a plan to ``model`` in place; returns the handle (``.remove()``, context manager).

    ``strict=True`` refuses a plan whose fingerprint is not this model's. ``strict=False``
    applies the units the model has, lists the others in ``handle.skipped`` and warns.
    ``compile_units=True``: every unit of the plan runs under ``torch.compile``, as ``--compile``
    measured it (``env.runtime.apply.apply_actions``' ``compile_unit``).
    """
    plan = read_plan(plan_or_path)
    compile_unit = compile_forward if compile_units else None
    if strict:
        return apply_actions(model, plan, strict=True, compile_unit=compile_unit)
    handle = apply_actions(model, plan, strict=False, compile_unit=compile_unit)
    present = [u for u in plan.actions if u not in handle.skipped]
    fp = fingerprint(model, present)
    if handle.skipped or fp != plan.fingerprint:
        skipped = ", ".join(handle.skipped[:5]) + (", ..." if len(handle.skipped) > 5 else "")
        why = (f"plan fingerprint {plan.fingerprint} is not this {type(model).__name__}'s ({fp})"
               if fp != plan.fingerprint else f"the plan names units this {type(model).__name__} lacks")
        warnings.warn(
            f"{why}: applied {len(present)} of {len(plan.actions)} units"
            + (f", skipped {len(handle.skipped)} the model lacks ({skipped})" if handle.skipped else "")
            + "; search this model to get a plan made for it",
            PlanMismatchWarning, stacklevel=2)
    return handle

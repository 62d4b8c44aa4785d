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

import torch
import torch.nn as nn

from env.data.errors import PlanError
from env.data.plan import Plan, fingerprint
from env.runtime.apply import AppliedPlan, apply_actions, compile_forward
from env.workloads.spec import precision_note

PlanSource = Plan | str | Path


class PlanMismatchWarning(UserWarning):
    """A plan applied with ``strict=False`` that does not match the model exactly."""


def read_plan(plan_or_path: PlanSource) -> Plan:
    """A :class:`Plan` with actions from a Plan, a path to a plan JSON file, or the JSON text itself; a plan
    with no actions is refused in one line (there is nothing to apply)."""
    if isinstance(plan_or_path, Plan):
        plan = plan_or_path
    elif isinstance(plan_or_path, str) and plan_or_path.lstrip().startswith("{"):
        plan = Plan.from_json(plan_or_path, source="plan JSON text")
    elif isinstance(plan_or_path, (str, Path)):
        plan = Plan.load(plan_or_path)
    else:
        raise PlanError(f"cannot read a plan from {type(plan_or_path).__name__}; "
                        "give a Plan, a path to a plan JSON file, or its JSON text")
    if not plan.actions:
        raise PlanError("the plan has no actions (it names no unit), so there is nothing to apply; export a plan "
                        "from a run with python -m search.export RUN_DIR")
    return plan


class PrecisionWarning(UserWarning):
    """A plan measured at one precision applied to a step at another."""


def applied_precision(model: nn.Module, precision: str | None) -> str | None:
    """The precision the plan is applied at: ``precision`` when given; else ``bf16-true`` for a model whose
    weights are bf16, None otherwise (autocast cannot be seen from the model)."""
    if precision is not None:
        return precision
    p = next(model.parameters(), None)
    return "bf16-true" if p is not None and p.dtype == torch.bfloat16 else None


def warn_precision(plan: Plan, model: nn.Module, precision: str | None) -> None:
    """One line (``PrecisionWarning``) when the plan was measured at another precision than it is applied at."""
    applied = applied_precision(model, precision)
    if applied is None and plan.precision == "bf16-true":
        applied = "32"  # fp32 weights: not the bf16-true step the plan was measured for
    note = precision_note(plan.precision, applied) if applied is not None else None
    if note:
        warnings.warn(note, PrecisionWarning, stacklevel=3)


def apply_plan(model: nn.Module, plan_or_path: PlanSource, strict: bool = True,
               compile_units: bool = False, precision: str | None = None) -> AppliedPlan:
    """Apply a plan to ``model`` in place; returns the handle (``.remove()``, context manager).

    ``strict=True`` refuses a plan whose fingerprint is not this model's. ``strict=False``
    applies the units the model has, lists the others in ``handle.skipped`` and warns.
    ``compile_units=True``: every unit of the plan runs under ``torch.compile``, as ``--compile``
    measured it (``env.runtime.apply.apply_actions``' ``compile_unit``). ``precision``: the step's precision
    (Lightning's name); a plan measured at another says so in one line (``PrecisionWarning``), as does a plan
    measured at ``bf16-true`` applied to fp32 weights or the other way round.
    """
    plan = read_plan(plan_or_path)
    warn_precision(plan, model, precision)
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

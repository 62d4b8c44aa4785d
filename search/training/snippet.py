"""A standalone Python snippet that applies a plan with nothing but torch installed.

The snippet defines ``apply_checkpoint_plan(model) -> remove``. Rather than a second,
hand-written copy of the checkpointing code, it is *generated from the source of*
``env/runtime/apply.py`` (the policy classes with what each action needs, ``check_preconditions``, the chain regions and blocks, the saved-op lists of ``selective`` and ``light``,
the buffer restore during recompute), of ``env/runtime/offload.py`` (the overlapped offload: side stream,
events, pinned buffer pool) and of ``env.data.plan`` (``Action``, ``fingerprint``, ``regions``),
read with ``ast``.
So the snippet runs the same code as :func:`search.apply_plan` and a change to ``env/runtime/apply.py``
reaches every snippet exported afterwards. Only the install loop (a dozen lines) is written
here. The snippet's imports are merged into one statement per module, and it has no
``from __future__ import annotations``: with string annotations, ``dataclasses`` looks the
module up in ``sys.modules``, which a file loaded with ``importlib.util.spec_from_file_location``
is not (the annotations are then evaluated, so the snippet needs Python 3.10+). The tests check
that a snippet gives the same gradients and the same measured peak as
``apply_plan``, in a process that imports no part of this project, and that its wrappers
compile with ``torch.compile(fullgraph=True)`` (apply the plan, then compile).
"""

from __future__ import annotations

import ast
import inspect
import json
from typing import Sequence

import env.data.plan
import env.runtime.apply
import env.runtime.offload
from env.data.plan import Plan

# Top-level definitions of env/runtime/apply.py that the snippet carries, in source order.
APPLY_NAMES: tuple[str, ...] = (
    "_aten", "SAVED_OPS", "_restore_buffers", "draws_random", "_selective_policy", "LIGHT_SAVED_OPS", "_light_policy", "_eager_contexts", "_restore_after",
    "Policy", "Keep", "Recompute", "Offload", "is_loss_unit", "Chunked", "_RegionState", "Region", "_refuse_sharded", "_refuse", "_call_shape",
    "POLICIES",
    "_on_cuda", "check_preconditions", "Compiler", "RECOMPUTED_UNIT_OPTIONS", "compile_forward", "_wrap", "_region_forwards",
    "block_parents", "runs_forward", "_block_forwards",
)
# Top-level definitions of env/runtime/offload.py that the snippet carries (``Offload`` calls ``offloaded_forward``).
OFFLOAD_NAMES: tuple[str, ...] = (
    "MIN_OFFLOAD_BYTES", "state_storages", "is_model_state", "dense_strides", "HostPool", "OffloadStats", "_Group", "_Saved",
    "ActivationOffloader", "_OFFLOADERS", "offloader_for", "_device_of", "offloaded_forward",
)
EXTRA_IMPORTS = ("import hashlib", "import warnings", "from enum import Enum")
# The snippet's own error for a plan that does not fit the model (the project's PlanError, without the project).
PLAN_ERROR = ("class PlanError(ValueError):\n"
              '    """A plan that does not fit the model (as ckpt-search\'s PlanError)."""\n')

_INSTALL = '''

PLAN: dict[str, str] = {plan}
FINGERPRINT = {fingerprint!r}  # of the model the plan was made for
PRECISION = {precision!r}  # the step's precision the plan was measured at (Lightning's name)


def apply_checkpoint_plan(model: nn.Module, strict: bool = True, compile_units: bool = False,
                          precision: str | None = None) -> Callable[[], None]:
    """Apply PLAN to ``model`` in place; returns a function that removes it again.

    ``strict=True`` refuses a model whose fingerprint is not the plan's (another model).
    ``compile_units=True``: each unit runs under torch.compile, the checkpoints around it (regional
    compilation, as ``--compile`` measured the plan); compile nothing else. ``precision``: the step's
    precision; a plan measured at another says so in one line (a warning).
    """
    if precision is not None and precision != PRECISION:
        warnings.warn(f"this plan was measured at precision {{PRECISION}} and is applied at {{precision}}: its peak and "
                      f"time were measured for another step; search again with --precision {{precision}}")
    modules = dict(model.named_modules())
    if strict:
        missing = [u for u in PLAN if u not in modules]
        if missing:
            raise ValueError(f"plan names unit '{{missing[0]}}' which {{type(model).__name__}} does not have; "
                             "export the plan for this model, or pass strict=False")
        fp = fingerprint(model, list(PLAN))
        if fp != FINGERPRINT:
            raise ValueError(f"plan was made for another model (fingerprint {{FINGERPRINT}}, this model {{fp}}); "
                             "export the plan for this model, or pass strict=False")
    installed: list[nn.Module] = []
    actions = {{fqn: Action(name) for fqn, name in PLAN.items()}}
    compile_unit = compile_forward if compile_units else None
    check_preconditions(model, actions)  # each action's own (offload: a CUDA model; chunked: a loss unit)
    in_regions = _region_forwards(model, actions, set(modules), compile_unit)  # chain regions: one checkpoint each
    present = {{fqn: action for fqn, action in actions.items() if fqn in modules}}
    blocks = _block_forwards(model, present, compile_unit)  # blocks: each parent recomputed whole, by parent
    in_regions.update(blocks)
    todo = [(fqn, a) for fqn, a in present.items() if a != Action.BLOCK] + [(p, Action.BLOCK) for p in blocks]
    for fqn, action in todo:
        module = modules[fqn]
        wrapped = in_regions[fqn] if fqn in in_regions else _wrap(module, action, compile_unit)
        if wrapped is not None:
            module.forward = wrapped  # instance attribute: shadows the class's forward only
            installed.append(module)

    def remove() -> None:
        for module in installed:
            module.__dict__.pop("forward", None)
        installed.clear()

    return remove
'''


def _segments(module: object, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The module's non-project imports, and the source of each named top-level definition."""
    source = inspect.getsource(module)  # type: ignore[arg-type]
    tree = ast.parse(source)
    lines = source.splitlines()
    imports: list[str] = []
    found: dict[str, str] = {}
    for node in tree.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        text = "\n".join(lines[start - 1:node.end_lineno])
        if isinstance(node, ast.ImportFrom) and node.module != "__future__" and not (node.module or "").startswith("env"):
            imports.append(text)
        elif isinstance(node, ast.Import):
            imports.append(text)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            found[node.name] = text
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in names:
            found[node.targets[0].id] = text
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names:
            found[node.target.id] = text
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(f"{getattr(module, '__name__', module)} no longer defines {', '.join(missing)}; "
                           "update search.training.snippet.APPLY_NAMES / OFFLOAD_NAMES")
    return imports, found


def merge_imports(statements: Sequence[str]) -> list[str]:
    """Import statements merged: ``import m`` once each, one ``from m import a, b`` per module (no ``__future__``)."""
    plain: dict[str, None] = {}
    names: dict[str, dict[str, None]] = {}
    for node in ast.parse("\n".join(statements)).body:
        if isinstance(node, ast.Import):
            plain.update({ast.unparse(ast.Import(names=[a])): None for a in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            alias = (f"{a.name} as {a.asname}" if a.asname else a.name for a in node.names)
            names.setdefault("." * node.level + (node.module or ""), {}).update(dict.fromkeys(alias))
    return sorted(plain) + [f"from {m} import {', '.join(sorted(n))}" for m, n in sorted(names.items())]


def plan_snippet(plan: Plan, title: str = "") -> str:
    """Python source, needing only torch, that defines ``apply_checkpoint_plan(model)`` for ``plan``."""
    offload_imports, offload_defs = _segments(env.runtime.offload, OFFLOAD_NAMES)
    imports, defs = _segments(env.runtime.apply, APPLY_NAMES)
    imports = merge_imports([*EXTRA_IMPORTS, *offload_imports, *imports])
    header = (f'"""Activation-checkpointing plan{f" for {title}" if title else ""}: {plan.summary()}.\n\n'
              "Needs only torch (and Python 3.10+). Usage:\n\n"
              "    remove = apply_checkpoint_plan(model)   # before training; remove() undoes it\n\n"
              "With torch.compile, apply the plan first, then compile; the wrappers trace into one graph\n"
              "(fullgraph=True works) and the compiler recomputes the planned units in backward:\n\n"
              "    remove = apply_checkpoint_plan(model)\n"
              "    model = torch.compile(model)\n\n"
              "A plan searched with --compile (each unit compiled on its own) is applied as it was measured:\n\n"
              "    remove = apply_checkpoint_plan(model, compile_units=True)\n\n"
              "With FSDP2, apply the plan first, then fully_shard the planned units (or their parents) and the\n"
              "root: checkpointing inside, sharding outside (a model already sharded so takes the plan the same\n"
              "way, with the same gradients):\n\n"
              "    remove = apply_checkpoint_plan(model)\n"
              "    for block in model.blocks:\n"
              "        fully_shard(block)\n"
              "    fully_shard(model)\n"
              '"""\n')
    body = [
        header, *imports, "", PLAN_ERROR,
        inspect.getsource(env.data.plan.Action) + "\n", inspect.getsource(env.data.plan.fingerprint) + "\n",
        inspect.getsource(env.data.plan.regions) + "\n",
    ]
    body += [offload_defs[n] + "\n" for n in OFFLOAD_NAMES]
    body += [defs[n] + "\n" for n in APPLY_NAMES]
    plan_text = json.dumps({k: v.value for k, v in plan.actions.items()}, indent=4)
    text = "\n".join(body) + _INSTALL.format(plan=plan_text, fingerprint=plan.fingerprint, precision=plan.precision)
    compile(text, "<checkpoint plan snippet>", "exec")  # a broken snippet fails here, not in training
    return text

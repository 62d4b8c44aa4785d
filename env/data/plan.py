"""Checkpoint plans: one action per decision unit, bound to a model by its fingerprint.

A plan is plain data with a versioned JSON form::

    {"schema_version": 1, "fingerprint": "3f2a...", "actions": {"blocks.0": "recompute", ...}}

The fingerprint hashes the unit FQNs with their classes and every parameter's name and shape,
so a plan made for one model is refused by another.

**Chains.** A run of consecutive units can be recomputed as one region that keeps only the
run's input, as ``torch.utils.checkpoint.checkpoint_sequential`` and rotor do: the run's first
unit is ``recompute`` and each following unit of the run is ``chain`` ("recomputed together
with the unit before it, as one region"). A ``chain`` after anything but ``recompute`` or
``chain``, or on the first unit, is refused. Why an action rather than a list of regions beside
the actions: the plan stays one decision per unit, in execution order, which is how the env,
the agents, the cost model and the exact solver walk it (a region is a decision that continues
the one before it); the JSON stays unit -> action; and a plan without chains is exactly what
it was (same JSON, same digest). A plan with chains is written as schema version 2, so that a
ckpt-search that cannot run chains says "upgrade" instead of "unknown action"; one with
``chunked`` (the loss unit's head and loss over chunks of tokens) as version 3, one with ``light`` (the graded
selective checkpoint, ``env.runtime.apply.LIGHT_SAVED_OPS``) as version 4; versions 1 to 5 are read.
Which units can chain is the model's business (each unit's input must be the
previous unit's output): ``env.runtime.chains`` finds out, ``env.runtime.apply`` refuses a
region over units that do not.

**Blocks.** Units that are all of one parent module's units (a transformer block's norms, attention and MLP)
rarely chain: a residual sum made between them feeds the next. ``block`` on every one of them recomputes the
parent as one region that keeps only the parent's input, residual sums included, as torchtitan's layer policy and
``checkpoint_sequential`` do at block units. Which runs of units are a parent's is the model's business too
(``env.runtime.chains.block_spans``); a plan with ``block`` is written as schema version 5.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from env.data.errors import PlanError

if TYPE_CHECKING:  # plans are plain data: torch is needed only to fingerprint or check a model
    import torch.nn as nn

SCHEMA_VERSION = 5  # the newest plan schema this version reads and writes: 2 adds 'chain', 3 'chunked', 4 'light', 5 'block'
READ_VERSIONS = (1, 2, 3, 4, 5)
# the first schema version with each action (an action not listed is in version 1): a plan is written as the newest
# of its actions' versions, so that a ckpt-search that cannot run one says "upgrade" instead of "unknown action"
ACTION_VERSIONS: dict[str, int] = {"chain": 2, "chunked": 3, "light": 4, "block": 5}


class Action(str, Enum):
    """What a unit does with its activations."""

    KEEP = "keep"  # store them (no checkpointing)
    RECOMPUTE = "recompute"  # store the unit's inputs only; rerun its forward in backward
    SELECTIVE = "selective"  # store matmul/conv/attention outputs; recompute the cheap ops
    OFFLOAD = "offload"  # store them in pinned CPU memory (CUDA only)
    CHAIN = "chain"  # recomputed with the unit before it as one region, which keeps only the region's input
    CHUNKED = "chunked"  # a loss unit (env.workloads.lm_loss.LMLoss): head and loss over chunks of tokens, each recomputed
    LIGHT = "light"  # as selective, and store the normalizations' and softmaxes' outputs too: recompute only the cheapest ops
    BLOCK = "block"  # recomputed with the other units of its parent module, as that module: keeps only its input

    def __str__(self) -> str:
        return self.value


ACTIONS: tuple[Action, ...] = tuple(Action)
ACTION_NAMES: tuple[str, ...] = tuple(a.value for a in Action)


def parse_action(value: str | Action) -> Action:
    try:
        return Action(value)
    except ValueError:
        raise PlanError(f"unknown action '{value}'; choose one of {', '.join(ACTION_NAMES)}") from None


REGION_STARTS = frozenset({Action.RECOMPUTE, Action.CHAIN})  # what a 'chain' may follow


def chain_error(units: Sequence[str], actions: Sequence[Action | str]) -> str | None:
    """Why these actions (one per unit, in execution order) are not a valid plan of chains; None if they are."""
    for i, a in enumerate(actions):
        if a != Action.CHAIN:
            continue
        if i == 0:
            return (f"unit '{units[0]}' is 'chain' but is the first unit: a chain continues the region of the unit "
                    "before it; make it recompute to start a region")
        if Action(actions[i - 1]) not in REGION_STARTS:
            return (f"unit '{units[i]}' is 'chain' after '{units[i - 1]}', which is '{Action(actions[i - 1]).value}': "
                    "a chain continues a region; make the unit before it recompute (or chain), or this one recompute")
    return None


def regions(actions: Sequence[Action | str]) -> list[tuple[int, int]]:
    """(start, stop) of each region of two or more units: a ``recompute`` and the ``chain`` units after it."""
    out: list[tuple[int, int]] = []
    for i, a in enumerate(actions):
        if a == Action.CHAIN and out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        elif a == Action.CHAIN and i > 0 and actions[i - 1] == Action.RECOMPUTE:
            out.append((i - 1, i + 1))
    return out


def plan_digest(fingerprint: str, actions: Mapping[str, str]) -> str:
    """Stable id of a plan's content (unit -> action name): same decisions, same model, same digest."""
    body = json.dumps({"fp": fingerprint, "a": dict(sorted(actions.items()))})
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def action_summary(actions: Iterable[str | Action]) -> str:
    """``recompute 4, keep 2`` style: counts per action, most used first."""
    counts: dict[str, int] = {}
    for a in actions:
        name = a.value if isinstance(a, Action) else str(a)
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def fingerprint(model: "nn.Module", units: Sequence[str]) -> str:
    """Hash of the unit FQNs and classes and every parameter's name and shape.

    A module sharded by FSDP2's ``fully_shard`` hashes as the class it was (``fully_shard`` makes it an
    ``FSDP<Class>`` subclass; a sharded parameter keeps its name and its full shape), so a plan fits a
    model before and after sharding alike."""
    h = hashlib.sha256()
    for u in sorted(units):
        cls = type(model.get_submodule(u))
        if len(cls.__bases__) == 2 and cls.__bases__[0].__name__ == "FSDPModule":  # fully_shard's subclass
            cls = cls.__bases__[1]
        h.update(f"unit:{u}:{cls.__name__};".encode())
    for name, p in model.named_parameters():
        h.update(f"param:{name}:{tuple(p.shape)};".encode())
    return h.hexdigest()[:16]


class Plan(BaseModel):
    """Unit FQN -> action, for the model whose fingerprint it carries."""

    model_config = ConfigDict(frozen=True)

    fingerprint: str
    actions: dict[str, Action]  # in execution order: a 'chain' continues the unit before it
    precision: str = "32"  # the step's precision the plan was measured at (env.workloads.precision); JSON: when not 32

    @field_validator("actions", mode="before")
    @classmethod
    def _known_actions(cls, v: dict) -> dict:
        if isinstance(v, dict):
            for unit, action in v.items():
                if isinstance(action, str) and action not in ACTION_NAMES:
                    raise PlanError(f"unknown action '{action}' for unit '{unit}'; choose one of {', '.join(ACTION_NAMES)}")
        return v

    @model_validator(mode="after")
    def _valid_chains(self) -> "Plan":
        why = chain_error(list(self.actions), list(self.actions.values()))
        if why:
            raise PlanError(why)
        return self

    @property
    def schema_version(self) -> int:
        """1 for a plan without chains, chunks, 'light' or blocks (readable by every version), else the newest of
        its actions' versions (``ACTION_VERSIONS``: 2 with chains, 3 with 'chunked', 4 with 'light', 5 with 'block')."""
        return max((ACTION_VERSIONS.get(a.value, 1) for a in self.actions.values()), default=1)

    @classmethod
    def uniform(cls, units: Iterable[str], action: Action | str, fp: str) -> "Plan":
        a = parse_action(action)
        return cls(fingerprint=fp, actions={u: a for u in units})

    @classmethod
    def from_list(cls, units: Sequence[str], actions: Sequence[Action | str], fp: str) -> "Plan":
        if len(units) != len(actions):
            raise PlanError(f"{len(actions)} actions for {len(units)} units; give one action per unit")
        return cls(fingerprint=fp, actions={u: parse_action(a) for u, a in zip(units, actions)})

    def action_list(self, units: Sequence[str]) -> list[Action]:
        return [self.actions.get(u, Action.KEEP) for u in units]

    @property
    def digest(self) -> str:
        """Stable id of the plan's content: same decisions for the same model, same digest."""
        return plan_digest(self.fingerprint, {k: v.value for k, v in self.actions.items()})

    def summary(self) -> str:
        """``recompute 4, keep 2`` style: counts per action, most used first."""
        return action_summary(self.actions.values())

    def to_json(self) -> str:
        extra = {"precision": self.precision} if self.precision != "32" else {}
        return json.dumps(
            {"schema_version": self.schema_version, "fingerprint": self.fingerprint,
             "actions": {k: v.value for k, v in self.actions.items()}, **extra}, indent=2)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> "Plan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"{source} is not JSON ({e.msg} at line {e.lineno}); export it again with python -m search.export") from None
        if not isinstance(data, dict) or "actions" not in data:
            raise PlanError(f"{source} is not a checkpoint plan (no 'actions'); export one with python -m search.export")
        if "plan" in data and isinstance(data["plan"], dict) and "actions" in data["plan"]:
            data = data["plan"]
        version = data.get("schema_version")
        if version not in READ_VERSIONS:
            hint = "upgrade ckpt-search" if isinstance(version, int) and version > SCHEMA_VERSION else "re-export it with this version"
            raise PlanError(f"{source} has plan schema version {version!r}, this ckpt-search reads versions "
                            f"{', '.join(map(str, READ_VERSIONS))}; {hint}")
        try:
            return cls.model_validate(data)
        except PlanError as e:
            raise PlanError(f"{source}: {e}") from None
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise PlanError(f"{source} is not a valid plan: {where}: {first['msg']}; export it again with python -m search.export") from None

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        path = Path(path)
        if path.is_dir():
            plans = sorted(p.name for p in (path / "plans").glob("*.json")) if (path / "plans").is_dir() else []
            hint = f" or give one of its plans/ ({', '.join(plans[:3])}{', ...' if len(plans) > 3 else ''})" if plans else ""
            raise PlanError(f"'{path}' is a folder, not a plan file; export a plan from a run folder with python -m "
                            f"search.export {path} --budget-mb MB --out plan.json and give that file{hint}")
        if not path.is_file():
            raise PlanError(f"plan file '{path}' does not exist; export one with python -m search.export RUN_DIR")
        return cls.from_json(path.read_text(), source=f"plan file '{path}'")


def check_plan(plan: Plan, model: "nn.Module", units: Sequence[str] | None = None) -> None:
    """Refuse a plan for another model, or one naming units the model does not have (a plan with no actions
    fits every model: it is the all-keep baseline a measurement applies)."""
    names = {n for n, _ in model.named_modules()}
    missing = [u for u in plan.actions if u not in names]
    if missing:
        raise PlanError(
            f"plan names unit '{missing[0]}' which {type(model).__name__} does not have"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; "
            "make the plan for this model, or apply with strict=False to skip missing units"
        )
    fp = fingerprint(model, units if units is not None else list(plan.actions))
    if fp != plan.fingerprint:
        raise PlanError(
            f"plan was made for another model (fingerprint {plan.fingerprint}, this model {fp}); "
            "search this model again, or apply with strict=False to apply the units that match"
        )

"""Decision units: the submodules a plan makes one decision for, named by their FQN.

Found automatically as the children of the model's largest ``nn.ModuleList`` /
``nn.Sequential`` (the repeated blocks: ``blocks.0`` .. ``blocks.N``), one level finer with
``granularity="sub-block"`` (``blocks.0.attn``, ``blocks.0.mlp``, ...), or given by the user as
FQNs or globs over dotted names: ``*`` stays within one name (``blocks.*`` is the blocks,
``blocks.*.mlp`` their MLPs), ``**`` spans any depth (``**.mlp``).
"""

from __future__ import annotations

import difflib
import fnmatch
from typing import Sequence

import torch.nn as nn

from env.data.errors import UnitError

GRANULARITIES: tuple[str, ...] = ("block", "sub-block")


def _n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _largest_container(model: nn.Module) -> str:
    best: tuple[int, int, str] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)) and len(mod) >= 2:
            key = (len(mod), _n_params(mod), name)
            if best is None or key[:2] > best[:2]:
                best = key
    if best is None:
        raise UnitError(
            f"{type(model).__name__} has no nn.ModuleList or nn.Sequential with 2 or more children; "
            "name the units yourself (e.g. --units 'encoder.layer.*')"
        )
    return best[2]


def find_units(model: nn.Module, granularity: str = "block",
               patterns: Sequence[str] | None = None) -> list[str]:
    """The decision units of ``model`` as FQNs, in registration order."""
    if patterns:
        return _match_patterns(model, patterns)
    if granularity not in GRANULARITIES:
        raise UnitError(f"unknown granularity '{granularity}'; choose one of {', '.join(GRANULARITIES)}")
    container = _largest_container(model)
    prefix = f"{container}." if container else ""
    blocks = [f"{prefix}{name}" for name, _ in model.get_submodule(container).named_children()]
    if granularity == "block":
        return blocks
    finer: list[str] = []
    for block in blocks:
        children = [f"{block}.{n}" for n, c in model.get_submodule(block).named_children() if _n_params(c) > 0]
        finer.extend(children or [block])
    return finer


def _glob_match(name: Sequence[str], pattern: Sequence[str]) -> bool:
    """Dotted-name glob: ``*``/``?``/``[..]`` match within one segment, ``**`` any number of them."""
    if not pattern:
        return not name
    if pattern[0] == "**":
        return any(_glob_match(name[k:], pattern[1:]) for k in range(len(name) + 1))
    return bool(name) and fnmatch.fnmatchcase(name[0], pattern[0]) and _glob_match(name[1:], pattern[1:])


def _glob_example(names: Sequence[str]) -> str:
    """A glob over the model's repeated blocks, to show the syntax with the model's own names."""
    for name in names:
        head, _, tail = name.rpartition(".")
        if head and tail.isdigit():
            return f"{head}.*"
    return names[0] if names else "*"


def _match_patterns(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    names = [n for n, _ in model.named_modules() if n]
    chosen: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if _glob_match(n.split("."), pattern.split("."))]
        if not hits:
            close = difflib.get_close_matches(pattern, names, n=3) or names[:6]
            raise UnitError(
                f"unit pattern '{pattern}' matches no module of {type(model).__name__}; give module FQNs or "
                f"shell globs (e.g. '{_glob_example(names)}'); modules named like it: {', '.join(close)}"
            )
        chosen.extend(h for h in hits if h not in chosen)
    chosen.sort(key=names.index)
    for a in chosen:
        for b in chosen:
            if b.startswith(a + "."):
                raise UnitError(f"units overlap: '{a}' contains '{b}'; name units at one level only")
    return chosen

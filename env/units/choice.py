"""Decision units chosen where the activation memory is, from one instrumented step.

"The children of the largest ModuleList" (``env.units.find.find_units``) is right for transformer
stacks only. Measured on library models it leaves most of the activations outside the units
(diffusers' UNet2DModel: the up blocks only; HF T5: the decoder only; HF ResNet-50: the four
stages). Here the units come from a memory profile of the module tree instead:

1. **Instrumented step** (:func:`module_memory`): forward pre/post hooks on every module say
   which module is running; ``torch.autograd.graph.saved_tensors_hooks`` attributes each tensor
   saved for backward to the innermost running module. Storages are counted once (by
   ``untyped_storage().data_ptr()``), parameters, buffers and the batch not at all (they are
   live before the step). Each module gets its forward call count, the storages its subtree
   saves, the storages of its inputs, and when its output's gradient arrived in backward.
2. **Choice** (:func:`choose_units`), top-down: start from the root's children (any container
   type, plain named children too); a module called other than exactly once per step is never
   a unit (descend into it; a leaf is dropped), nor one whose output needs no gradient. Then
   repeatedly split the unit holding the most saved bytes into its children (through
   single-child wrappers) while the count stays within ``max_units``, and keep, among the sets
   met on the way whose estimated peak of recomputing every unit (E below) is within 1% of the
   best, the fewest-unit one that holds at least 95% of the saved bytes (the fewest-unit one
   when none does: the estimate decides, coverage only breaks ties). Then drop units whose
   removal barely raises E (a final norm whose input is kept anyway), keeping that coverage.
3. **Order**: units must run in the profile's order (forward 0..n-1, backward n-1..0, see
   ``env.measure.profiler``). Skip connections keep it: autograd runs the ready node created last
   first, so a U-Net's down blocks get their gradients after all up blocks, in reverse (checked
   on diffusers' UNet2DModel and on ``examples/unet_skips.py``). It breaks when a unit's first
   output was made before the unit ran (a block that passes its skip input through first);
   such a pair is repaired by merging it into its common parent (when that is a valid unit)
   or dropping one of the two, whichever gives the lower E.

The estimated peak of recomputing every unit of a set U (bytes above the start of the step)::

    kept(U) = saved outside the units  +  inputs of the units         (live through the step)
    E(U)    = |kept(U)| + max over u in U of |saved(u) - kept(U)|      (+ the recomputed unit)

A loss unit (``env.workloads.lm_loss.LMLoss``: final norm, head and loss) is never split, and its
term in the max is one chunk's share (``chunked`` recomputes the logits a chunk at a time).

A unit that is too big makes the max term large; too many small units keep too many inputs
and lose the bytes their parents save between children (residual adds, activations).

``max_units`` defaults to 32: the exact solver's time and its frontier, which the search measures,
grow with the unit count (docs/measurement.md, "The default unit count"); the profile's cost does
not depend on the count.

The result is a :class:`UnitChoice`: plain data (JSON round-trip), for the report and dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

from env.data.errors import UnitError
from env.data.unit_choice import UnitChoice
from env.measure.timeline import _first_grad_tensor
from env.runtime.apply import is_loss_unit
from env.runtime.chains import state_kept
from env.workloads.lm_loss import CHUNKS
from env.units.find import GRANULARITIES, find_units
from env.workloads.workload import Workload

MAX_UNITS = 32  # see the module docstring
AUTO = "auto"
MODES = (AUTO, "blocks", "sub-blocks")  # besides FQNs/globs


# ---------------------------------------------------------------------------------------------
# The instrumented step

@dataclass
class ModuleStats:
    """One module's part of an instrumented step."""

    calls: int = 0  # forward calls in the step
    first_call: int = -1  # order of its first forward call among all modules' calls
    own: set[int] = field(default_factory=set)  # storages first saved while it was the innermost module
    inputs: set[int] = field(default_factory=set)  # storages of its tensor arguments (first call)
    grad_order: int = -1  # order in which its output's gradient arrived in backward (-1: never)


@dataclass
class ModuleMemory:
    """Per module (by FQN, root ``""``) what one step saves for backward; storage sizes in bytes."""

    modules: dict[str, ModuleStats]
    children: dict[str, list[str]]
    nbytes: dict[int, int]  # storage key -> bytes
    outside: set[int]  # storages saved while no module ran (loss_fn)
    loss_units: set[str] = field(default_factory=set)  # loss modules (``is_loss_unit``): never split, can be chunked

    def bytes_of(self, keys: set[int]) -> int:
        return sum(self.nbytes[k] for k in keys)


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(key, bytes) of a tensor's storage; None for a tensor without one (sparse, nested, meta)."""
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (s.data_ptr(), s.nbytes()) if s.data_ptr() else None


def module_memory(workload: Workload) -> ModuleMemory:
    """One instrumented forward and backward of ``workload`` (model state left as it was)."""
    model = workload.model
    names = {id(m): n for n, m in model.named_modules()}
    stats = {n: ModuleStats() for n in names.values()}
    children = {n: [f"{n}.{c}" if n else c for c, _ in m.named_children()] for n, m in model.named_modules()}
    state: set[int] = set()
    for t in [*model.parameters(), *model.buffers(), *_tensors(workload.inputs)]:
        key = _storage(t)
        if key:
            state.add(key[0])
    nbytes: dict[int, int] = {}
    outside: set[int] = set()
    attributed: set[int] = set()
    stack: list[str] = []
    alive: list[torch.Tensor] = []  # every tensor keyed, so that no storage address is reused mid-forward
    counters = {"call": 0, "grad": 0}

    def pre(module: nn.Module, args: Any, kwargs: Any) -> None:
        name = names[id(module)]
        st = stats[name]
        st.calls += 1
        if st.first_call < 0:
            st.first_call = counters["call"]
            st.inputs = {k for t in _tensors((args, kwargs)) if (k := _key(t)) is not None}
        counters["call"] += 1
        stack.append(name)

    def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        name = stack.pop()
        st = stats[name]
        out = _first_grad_tensor(output)
        if st.calls == 1 and out is not None:
            out.register_hook(lambda grad, st=st: _grad_arrived(st))

    def _grad_arrived(st: ModuleStats) -> None:
        if st.grad_order < 0:
            st.grad_order = counters["grad"]
            counters["grad"] += 1

    def _key(t: torch.Tensor) -> int | None:
        found = _storage(t)
        if found is None or found[0] in state:
            return None
        if found[0] not in nbytes:
            nbytes[found[0]] = found[1]
            alive.append(t)  # held until the forward ends: its address cannot be reused by another
        return found[0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _key(t)
        if key is not None and key not in attributed:  # a storage belongs to its first saver
            attributed.add(key)
            (stats[stack[-1]].own if stack else outside).add(key)
        return t

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        with state_kept(model):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = workload.loss()
            alive.clear()
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    losses = {n for n, m in model.named_modules() if n and is_loss_unit(m)}
    return ModuleMemory(stats, children, nbytes, outside, losses)


# ---------------------------------------------------------------------------------------------
# The choice

SLACK = 0.01  # estimated-peak bytes, as a share of everything saved, not worth more units for
COVERAGE = 0.95  # units should hold this share of what the submodules save, where the splits allow it


class _Tree:
    """The instrumented step seen as candidate units and the estimated recompute-all peak."""

    def __init__(self, mem: ModuleMemory) -> None:
        self.mem = mem
        self.sub: dict[str, set[int]] = {}
        for name in sorted(mem.modules, key=lambda n: -n.count(".") if n else 1):  # leaves first, root last
            keys = set(mem.modules[name].own)
            for child in mem.children.get(name, ()):
                keys |= self.sub[child]
            self.sub[name] = keys
        self.saved = {n: mem.bytes_of(k) for n, k in self.sub.items()}
        self.everything = mem.outside | self.sub[""]
        self.coverable_bytes = mem.bytes_of(self.sub[""] - mem.modules[""].own)

    def is_unit(self, name: str) -> bool:
        st = self.mem.modules[name]
        return bool(name) and st.calls == 1 and st.grad_order >= 0 and self.saved[name] > 0

    def below(self, name: str) -> list[str]:
        """The valid units at or under ``name``'s children: modules run twice or never are descended into."""
        out: list[str] = []
        for child in self.mem.children.get(name, ()):
            out.extend([child] if self.is_unit(child) else self.below(child))
        return out

    def split(self, name: str) -> list[str]:
        """``name``'s units one level down, through single-child wrappers (``resnet`` -> its parts); none for a
        loss unit, which is one decision (keep, recompute or chunked)."""
        if name in self.mem.loss_units:
            return []
        kids = self.below(name)
        while len(kids) == 1 and len(self.below(kids[0])) > 0:
            kids = self.below(kids[0])
        return kids

    def peak(self, units: Sequence[str]) -> int:
        """E(U): bytes kept through the step with every unit recomputed, plus the largest recompute."""
        if not units:
            return self.mem.bytes_of(self.everything)
        covered: set[int] = set().union(*(self.sub[u] for u in units))
        kept = (self.everything - covered).union(*(self.mem.modules[u].inputs for u in units))
        return self.mem.bytes_of(kept) + max(self.mem.bytes_of(self.sub[u] - kept)
                                             // (CHUNKS if u in self.mem.loss_units else 1) for u in units)

    def coverage(self, units: Sequence[str]) -> float:
        """Share of the bytes the model's submodules save that ``units`` hold."""
        return sum(self.saved[u] for u in units) / self.coverable_bytes if self.coverable_bytes else 0.0

    def ordered(self, units: Sequence[str]) -> list[str]:
        return sorted(units, key=lambda u: self.mem.modules[u].first_call)


def _trajectory(tree: _Tree, units: list[str], max_units: int) -> list[list[str]]:
    """The unit sets met splitting the largest unit into its children, one split at a time.

    Stops when the largest unit cannot be split (a leaf: no split lowers the max term of E any
    more) or a split would exceed ``max_units``.
    """
    sets = [units]
    while True:
        largest = max(units, key=lambda u: (u not in tree.mem.loss_units, tree.saved[u]))  # a loss unit is not split
        kids = tree.split(largest)
        if not kids or len(units) - 1 + len(kids) > max_units:
            return sets
        at = units.index(largest)
        units = units[:at] + kids + units[at + 1:]
        sets.append(units)


def _prune(tree: _Tree, units: list[str], slack: int, floor: float) -> list[str]:
    """Drop units whose removal raises E by at most ``slack`` bytes in all (nothing worth recomputing),
    keeping the coverage at ``floor`` or above."""
    budget = slack
    while len(units) > 1:
        e = tree.peak(units)
        costs = [(tree.peak(rest) - e, u) for u in units for rest in [[v for v in units if v != u]]
                 if tree.coverage(rest) >= floor]
        if not costs:
            return units
        cost, drop = min(costs, key=lambda c: (c[0], tree.saved[c[1]]))
        if cost > budget:
            return units
        budget -= max(cost, 0)
        units = [v for v in units if v != drop]
    return units


def _common_parent(a: str, b: str) -> str:
    pa, pb = a.split("."), b.split(".")
    k = 0
    while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
        k += 1
    return ".".join(pa[:k])


def _repair_order(tree: _Tree, units: list[str]) -> list[str]:
    """Make output gradients arrive in reverse forward order, as ``env.measure.profiler`` requires."""
    while True:
        units = tree.ordered(units)
        grads = [tree.mem.modules[u].grad_order for u in units]
        bad = next((i for i in range(len(units) - 1) if grads[i] <= grads[i + 1]), None)
        if bad is None:
            return units
        a, b = units[bad], units[bad + 1]
        options = [[u for u in units if u != a], [u for u in units if u != b]]
        parent = _common_parent(a, b)
        if tree.is_unit(parent):
            options.append([u for u in units if not u.startswith(parent + ".")] + [parent])
        units = min(options, key=tree.peak)


def out_of_order(mem: ModuleMemory, units: Sequence[str]) -> tuple[str, str] | None:
    """The first pair (a, b) of units, a running first in forward, whose gradients arrive a first; or None."""
    ordered = sorted(units, key=lambda u: mem.modules[u].first_call)
    for a, b in zip(ordered, ordered[1:]):
        if mem.modules[a].grad_order <= mem.modules[b].grad_order:
            return a, b
    return None


def _record(tree: _Tree, units: Sequence[str], mode: str) -> UnitChoice:
    return UnitChoice(units=list(units), saved_bytes=[tree.saved[u] for u in units],
                      total_saved_bytes=tree.mem.bytes_of(tree.everything), coverable_bytes=tree.coverable_bytes,
                      coverage=tree.coverage(units), mode=mode)


def choose_units(mem: ModuleMemory, max_units: int = MAX_UNITS) -> UnitChoice:
    """Automatic units from an instrumented step (see the module docstring)."""
    if max_units < 1:
        raise UnitError(f"max_units={max_units} must be at least 1 (default {MAX_UNITS})")
    tree = _Tree(mem)
    units = tree.below("")
    if not units:
        raise UnitError("no submodule of the model runs exactly once per step on the gradient path and saves "
                        "activations for backward; name the units yourself (e.g. --units 'layers.*')")
    # more top-level units than max_units (a deep stack): all are kept, as the old rule would;
    # max_units bounds the splits, and pruning drops only those not worth a decision
    # the fewest units whose estimate is within SLACK of the best met: a finer split that gains
    # less than that adds decisions to the search for no memory
    # The estimate decides; coverage only breaks ties among sets within SLACK of the best estimate.
    # (Requiring coverage first kept a whole model as one unit where its own forward, e.g. the loss
    # over the logits, saved more than 1 - COVERAGE of the bytes: no split could cover, none was taken.)
    slack = int(SLACK * tree.mem.bytes_of(tree.everything))
    sets = _trajectory(tree, units, max_units)
    best = min(tree.peak(u) for u in sets)
    close = [u for u in sets if tree.peak(u) <= best + slack]
    units = next((u for u in close if tree.coverage(u) >= COVERAGE), close[0])
    floor = COVERAGE if tree.coverage(units) >= COVERAGE else 0.0
    units = _repair_order(tree, _prune(tree, units, slack // 2, floor))
    return _record(tree, units, AUTO)


def _check_given(tree: _Tree, units: Sequence[str]) -> None:
    for u in units:
        st = tree.mem.modules[u]
        if st.calls != 1:
            raise UnitError(f"unit '{u}' runs {st.calls} times in a training step; a unit must run exactly once "
                            "(a shared or reused module cannot be checkpointed as one); name its parent or its "
                            "children instead, or use --units auto")
        if st.grad_order < 0:
            raise UnitError(f"unit '{u}' has an output that needs no gradient (or is not used by the loss); "
                            "checkpointing it saves nothing; leave it out, or use --units auto")
    pair = out_of_order(tree.mem, units)
    if pair:
        a, b = pair
        raise UnitError(f"units '{a}' and '{b}' are out of the profile's order: '{a}' runs first in forward but "
                        f"backward reaches its output first too (does '{b}' return a tensor made before it ran?); "
                        "name their common parent as one unit, leave one out, or use --units auto")


def resolve_units(workload: Workload, spec: Sequence[str] = (AUTO,), max_units: int = MAX_UNITS) -> UnitChoice:
    """The decision units a CLI spec names, with the bytes each holds (one instrumented step).

    ``spec``: ``["auto"]`` (default; also ``[]``) chooses where the activation memory is;
    ``["blocks"]`` / ``["sub-blocks"]`` are the old rules (``env.units.find.find_units``: the children
    of the largest ModuleList/Sequential, or their children with parameters); anything else
    is FQNs or globs (``blocks.*``, ``**.mlp``).
    """
    spec = list(spec) or [AUTO]
    mem = module_memory(workload)
    if spec == [AUTO]:
        return choose_units(mem, max_units)
    rules = dict(zip(("blocks", "sub-blocks"), GRANULARITIES))
    if len(spec) == 1 and spec[0] in rules:
        units, mode = find_units(workload.model, rules[spec[0]]), spec[0]
    elif any(s in MODES for s in spec):
        raise UnitError(f"units {spec}: '{next(s for s in spec if s in MODES)}' must be given alone; give one of "
                        f"{', '.join(MODES)}, or module FQNs/globs")
    else:
        units, mode = find_units(workload.model, patterns=spec), "patterns"
    tree = _Tree(mem)
    _check_given(tree, units)
    return _record(tree, tree.ordered(units), mode)

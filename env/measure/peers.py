"""Peers: the checkpointing users pick instead of a searched plan, measured the same way.

A peer is plain data (:class:`Peer`: a name, a kind and its parameters) and :func:`prepared`
installs it on a workload and undoes it, so :func:`measure_peer` measures it with the same
code as a plan (:func:`env.measure.measurement.measure_prepared`). Peers export nothing: they are measured
and shown beside the plans. :func:`peers_for` lists the ones that apply to a workload.

=====================  ==========================================================  =======================  ================================
kind                   what runs                                                   parameters               applies to
=====================  ==========================================================  =======================  ================================
compile_budget         ``torch.compile`` with the partitioner's                    ``budget`` 0.0 ... 1.0   every workload
                       ``torch._functorch.config.activation_memory_budget``
                       set while compiling; a fresh compile per budget
hf_checkpointing       transformers' ``activation_checkpointing_enable``           ``every_n_layers``       transformers models that support
                       (``gradient_checkpointing_enable`` before v5), kwargs       1, 2, 3, 4               gradient checkpointing
                       ``use_reentrant=False``; ``every_n_layers`` is
                       transformers' own (v5: layer ``i`` is checkpointed when
                       ``i % n == 0``)
checkpoint_sequential  ``torch.utils.checkpoint.checkpoint_sequential`` over the   ``segments`` k           models whose blocks run as a
                       model's chain of blocks in k segments (every segment but                             chain (:func:`find_chain`)
                       the last is recomputed), ``use_reentrant=False``
torchtitan_op_sac      torchtitan's op selective AC on every block: attention's    (none)                   models with blocks
                       and every second matmul's outputs saved, the rest                                    (:attr:`ModelFacts.blocks`)
                       recomputed (``env.measure.block_policies``)
torchtitan_layer_sac   torchtitan's layer selective AC: every n-th block fully     ``every`` n (2, as       models with blocks
                       checkpointed (``env.measure.block_policies``)               torchtitan's default)
torch_auto_sac         PyTorch's auto-SAC (``torch.distributed._tools``): its      ``budget`` 0.0 ... 1.0   models with blocks, where PuLP
                       estimators over one step, its ILP (``sac_milp``) picks      (its lowest reachable    and pwlf are installed (the
                       modules and its per-op policies run on them through         peak ... its unplanned   ``autosac`` extra)
                       ``create_selective_checkpoint_contexts``                    peak)
                       (``env.measure.auto_sac``)
=====================  ==========================================================  =======================  ================================

Each kind is one entry of ``KINDS`` (:class:`KindSpec`): how it is offered, installed and described, whether it
compiles, which ``--peers`` group selects it (``kinds_selected``), and where it is a plan of ours (``as_plan``: every ``checkpoint_sequential``, transformers' checkpointing and torchtitan's
layer policy, when their blocks are decision units), so a search measures it once, as that plan.

auto-SAC's ``budget`` is a fraction, as a compile budget's is, so that one list of budgets serves every model:
its ILP takes GiB, given as that fraction of the way from the lowest peak the ILP can meet to its estimate of the
unplanned step's peak (``env.measure.auto_sac``, which also says what runs in place of its CUDA-only estimates on a
CPU; ``Peer.note`` says so). ``env.measure.auto_sac.solve`` gives its estimated peak and recompute time, to set
beside the measured ones. Without PuLP the kind is not offered, with a one-line warning; nor where the peers are
measured compiled (``peers_for(compiled=True)``): its per-op decisions are made for the eager ops its estimator
saw, and a compiled step traces others.

All of them keep the gradients of no checkpointing (dropout masks are replayed; tested), except
compile budgets below 1.0 on a model with dropout: in torch 2.13 the partitioner may recompute a
dropout in backward with fresh random numbers (pytorch/pytorch#190758, open; reproduced here on
CPU, aot_eager and inductor alike; ``Peer.note`` says so). ``gradient_error`` checks a peer on a
workload: one step with it against one without, from the same RNG state. ``checkpoint_sequential``
is skipped by dynamo, so compiled it runs with graph breaks (counted in the measurement).
Unlike a plan, ``checkpoint_sequential``, transformers' checkpointing and torchtitan's policies update
BatchNorm's running statistics again when they recompute: that is how users get them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from enum import Enum
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn
from pydantic import BaseModel, ConfigDict

from env.data.errors import PlanError, WorkloadError
from env.data.measured import MeasuredPlan
from env.data.plan import Action
from env.data.segments import checkpoint_sequential_actions
from env.measure.block_policies import layer_picks
from env.measure.compiled import CompileOptions, compiled
from env.measure.peer_installs import (
    checkpoint_sequential_blocks,
    compile_budget,
    eager,
    hf_checkpointing,
    hf_model,
    is_hf_checkpointing_layer,
    supports_every_n,
    titan_layer_sac,
    titan_op_sac,
    auto_sac_plan,
    torch_auto_sac,
)
from env.measure.measurement import compile_options, measure_prepared
from env.runtime.apply import planned_units
from env.runtime.chains import Step, step_error, training_step
from env.workloads.workload import Workload

BUDGETS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))  # 0.0, 0.1, ..., 1.0
EVERY_N_LAYERS: tuple[int, ...] = (1, 2, 3, 4)
TORCHTITAN_LAYER_EVERY: tuple[int, ...] = (2,)  # torchtitan's default selective_ac_option
GRADIENT_TOLERANCE = 1e-3  # ``gradient_error`` above this: the peer changes the gradients (summation order: ~1e-6)


class PeerKind(str, Enum):
    COMPILE_BUDGET = "compile_budget"
    HF_CHECKPOINTING = "hf_checkpointing"
    CHECKPOINT_SEQUENTIAL = "checkpoint_sequential"
    TORCHTITAN_OP_SAC = "torchtitan_op_sac"
    TORCHTITAN_LAYER_SAC = "torchtitan_layer_sac"
    TORCH_AUTO_SAC = "torch_auto_sac"

    def __str__(self) -> str:
        return self.value


class Peer(BaseModel):
    """One peer configuration: ``compile-budget-0.5``, ``hf-checkpointing-every-2``, ``checkpoint-sequential-3``."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: PeerKind
    params: dict[str, float | int | str]  # budget / every_n_layers / segments / every (and chain / blocks: an FQN)
    note: str = ""  # a caveat to show beside its measurement (a known bug of the peer)

    @property
    def digest(self) -> str:
        """What a measurement of this peer is filed under, in place of a plan digest."""
        return f"peer:{self.name}"

    @property
    def label(self) -> str:
        """The peer in words."""
        return KINDS[self.kind].label(self)

    @property
    def compiled(self) -> bool:
        """Whether its step is compiled whatever the run measures (a compile budget is the compiler's choice)."""
        return KINDS[self.kind].compiled


# pytorch/pytorch#190758 (open in torch 2.13, tested here): below 1.0 the partitioner may recompute random ops
BUDGET_DROPOUT_NOTE = ("torch <= 2.13: with dropout, a budget below 1.0 may recompute its mask with fresh random "
                       "numbers in backward, and the gradients are then wrong (pytorch/pytorch#190758)")


def compile_budget_peer(budget: float) -> Peer:
    return Peer(name=f"compile-budget-{budget:.1f}", kind=PeerKind.COMPILE_BUDGET, params={"budget": float(budget)},
                note=BUDGET_DROPOUT_NOTE if budget < 1.0 else "")


def hf_checkpointing_peer(every_n_layers: int = 1) -> Peer:
    name = "hf-checkpointing" + (f"-every-{every_n_layers}" if every_n_layers > 1 else "")
    return Peer(name=name, kind=PeerKind.HF_CHECKPOINTING, params={"every_n_layers": int(every_n_layers)})


def checkpoint_sequential_peer(segments: int, chain: str) -> Peer:
    return Peer(name=f"checkpoint-sequential-{segments}", kind=PeerKind.CHECKPOINT_SEQUENTIAL,
                params={"segments": int(segments), "chain": chain})


def torchtitan_op_sac_peer(blocks: str) -> Peer:
    """torchtitan's op policy on the blocks of container ``blocks`` (``ModelFacts.container``)."""
    return Peer(name="torchtitan-op-sac", kind=PeerKind.TORCHTITAN_OP_SAC, params={"blocks": blocks})


def torchtitan_layer_peer(every: int, blocks: str) -> Peer:
    """torchtitan's layer policy, every ``every``-th block of container ``blocks`` checkpointed."""
    return Peer(name=f"torchtitan-layer-every-{every}", kind=PeerKind.TORCHTITAN_LAYER_SAC,
                params={"every": int(every), "blocks": blocks})


def decided(workload: Workload, peer: Peer) -> Peer:
    """The peer with its decisions made once and carried (``params['decided']``, ``AutoSacPlan.to_json``) where it
    is auto-SAC, whose ILP decides from op times measured as it runs: solved again in another process, its plan
    could move between the search's measurements and a quote. Other peers, as they are."""
    if peer.kind is not PeerKind.TORCH_AUTO_SAC or "decided" in peer.params or "no_plan" in peer.params:
        return peer
    from env.measure.auto_sac import NoAutoSacPlan

    try:
        plan = auto_sac_plan(workload, peer)
    except NoAutoSacPlan as e:  # offered as it is, with why it has no decisions: never measured (``measurable``)
        return peer.model_copy(update={"params": {**peer.params, "no_plan": str(e)}})
    return peer.model_copy(update={"params": {**peer.params, "decided": plan.to_json()}})


def measurable(peers: Sequence[Peer]) -> tuple[list[Peer], list[str]]:
    """The ``peers`` that can be measured, and a line for each that cannot (auto-SAC with no decisions at its
    budget on this model, ``decided``): a peer the tool it comes from cannot apply is not a measurement."""
    lines = [f"peer {p.name} not measured: {p.params['no_plan']}" for p in peers if "no_plan" in p.params]
    return [p for p in peers if "no_plan" not in p.params], lines


# where torch's estimators cannot run as shipped (they need CUDA), what the ILP is given instead (env.measure.auto_sac)
AUTO_SAC_CPU_NOTE = ("auto-SAC's ILP solved with op times measured on this CPU: torch's estimators ran on the real "
                     "model with each op timed by the step's clock, in place of their CUDA-only roofline and benchmark")


def torch_auto_sac_peer(budget: float, device_type: str = "cpu") -> Peer:
    """PyTorch's auto-SAC at ``budget`` (0.0: the lowest peak its ILP meets, 1.0: its estimate of the unplanned
    peak), on a model on ``device_type`` (its estimators run as shipped on CUDA only: elsewhere the note says what
    replaced them)."""
    return Peer(name=f"auto-sac-{budget:.1f}", kind=PeerKind.TORCH_AUTO_SAC, params={"budget": float(budget)},
                note="" if device_type == "cuda" else AUTO_SAC_CPU_NOTE)


# ---------------------------------------------------------------------------------------------
# Which peers apply

def find_chain(workload: Workload) -> str | None:
    """FQN of the largest ``ModuleList``/``Sequential`` whose children run as a chain, else None.

    A chain: in one forward each child runs once, in order, on one positional tensor that is
    the previous child's output, and returns one tensor. That is what ``checkpoint_sequential``
    can segment. Found by one forward without gradients (RNG state restored afterwards).
    """
    model = workload.model
    containers = {name: m for name, m in model.named_modules()
                  if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2}
    calls: dict[int, list[tuple[int, Any, Any, dict]]] = {}  # id(child) -> [(order, args, output, kwargs)]
    order = iter(range(1 << 62))

    def hook(module: nn.Module, args: Any, kwargs: dict, output: Any) -> None:
        calls.setdefault(id(module), []).append((next(order), args, output, kwargs))

    handles = [child.register_forward_hook(hook, with_kwargs=True)
               for m in containers.values() for child in m.children()]
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            workload.loss()
    finally:
        for h in handles:
            h.remove()
    chains = [name for name, m in containers.items() if _is_chain(list(m.children()), calls)]
    if not chains:
        return None
    return max(chains, key=lambda n: (sum(p.numel() for p in containers[n].parameters()), len(containers[n])))


def _is_chain(children: list[nn.Module], calls: dict[int, list[tuple[int, Any, Any, dict]]]) -> bool:
    previous: tuple[int, Any] | None = None
    for child in children:
        seen = calls.get(id(child), [])
        if len(seen) != 1:
            return False
        at, args, output, kwargs = seen[0]
        if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor) or not isinstance(output, torch.Tensor):
            return False
        if previous is not None and (at < previous[0] or args[0] is not previous[1]):
            return False
        previous = (at, output)
    return True


def _layer_sets(n_layers: int, every_n: Sequence[int]) -> list[int]:
    """The ``every_n`` values that checkpoint distinct sets of layers, in order."""
    seen: set[frozenset[int]] = set()
    kept = []
    for n in every_n:
        if n < 1:
            raise WorkloadError(f"every_n_layers={n} must be at least 1 (1 checkpoints every layer)")
        layers = frozenset(range(0, n_layers, n))
        if layers not in seen:
            seen.add(layers)
            kept.append(n)
    return kept


def default_segments(n_blocks: int) -> list[int]:
    """2, sqrt(n) (Chen et al. 2016) and n segments: the usual choices, each at most n."""
    return sorted({k for k in (2, round(math.sqrt(n_blocks)), n_blocks) if 2 <= k <= n_blocks})


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What decides which peers apply to a model, found once (``model_facts``)."""

    hf: bool  # a transformers model with its own gradient checkpointing
    hf_every_n: bool  # ... that takes every_n_layers (transformers 5)
    hf_layers: tuple[str, ...]  # FQNs of its checkpointing layers, in module order
    chain: str | None  # find_chain: the container whose blocks run as a chain
    chain_blocks: tuple[str, ...]  # its children's FQNs, in order
    device_type: str = "cpu"  # where the model runs (auto-SAC's estimators run as shipped on cuda only)

    @property
    def blocks(self) -> tuple[str, ...]:
        """The blocks torchtitan's policies wrap: transformers' checkpointing layers, else the chain's blocks."""
        return self.hf_layers or self.chain_blocks

    @property
    def container(self) -> str | None:
        """The FQN of the module whose children the blocks are (None: no blocks, or not all children of one)."""
        parents = {b.rpartition(".")[0] for b in self.blocks}
        return parents.pop() if len(parents) == 1 else None


def model_facts(workload: Workload) -> ModelFacts:
    model = workload.model
    hf = hf_model(model)
    layers = tuple(n for n, m in model.named_modules() if is_hf_checkpointing_layer(m)) if hf else ()
    chain = find_chain(workload)
    blocks = tuple(f"{chain}.{n}" for n, _ in model.get_submodule(chain).named_children()) if chain else ()
    return ModelFacts(hf, hf and supports_every_n(model), layers, chain, blocks, workload.device.type)


@dataclasses.dataclass(frozen=True)
class Offer:
    """Which configurations of each kind a search offers (``peers_for``)."""

    budgets: Sequence[float] = BUDGETS
    every_n: Sequence[int] = EVERY_N_LAYERS
    segments: Sequence[int] | None = None  # None: default_segments
    titan_every: Sequence[int] = TORCHTITAN_LAYER_EVERY
    compiled: bool = False  # the peers are measured compiled (auto-SAC is not offered: its decisions name eager ops)


def peers_for(workload: Workload, budgets: Sequence[float] = BUDGETS, every_n: Sequence[int] = EVERY_N_LAYERS,
              segments: Sequence[int] | None = None, compiled: bool = False) -> list[Peer]:
    """The peers that apply to this workload, kind by kind in ``KINDS`` order: compile budgets always;
    transformers' checkpointing on a transformers model; ``checkpoint_sequential`` (``segments``, default
    :func:`default_segments`) where the model has a chain of blocks; torchtitan's policies where it has blocks, and
    auto-SAC at ``budgets`` there too, where PuLP is installed and the peers are not measured ``compiled``."""
    facts, offer = model_facts(workload), Offer(budgets, every_n, segments, compiled=compiled)
    return [p for spec in KINDS.values() for p in spec.offer(facts, offer)]


def _offer_budgets(facts: ModelFacts, offer: Offer) -> list[Peer]:
    return [compile_budget_peer(b) for b in offer.budgets]


def _offer_hf(facts: ModelFacts, offer: Offer) -> list[Peer]:
    if not facts.hf:
        return []
    return [hf_checkpointing_peer(n) for n in (_layer_sets(len(facts.hf_layers), offer.every_n) if facts.hf_every_n
                                               else [1])]


def _offer_sequential(facts: ModelFacts, offer: Offer) -> list[Peer]:
    if facts.chain is None:
        return []
    n = len(facts.chain_blocks)
    ks = default_segments(n) if offer.segments is None else [k for k in offer.segments if 1 <= k <= n]
    return [checkpoint_sequential_peer(k, facts.chain) for k in ks]


def _offer_titan_op(facts: ModelFacts, offer: Offer) -> list[Peer]:
    return [torchtitan_op_sac_peer(facts.container)] if facts.container is not None else []


def _offer_titan_layer(facts: ModelFacts, offer: Offer) -> list[Peer]:
    if facts.container is None:
        return []
    return [torchtitan_layer_peer(n, facts.container) for n in offer.titan_every if 1 < n <= len(facts.blocks)]


def _offer_auto_sac(facts: ModelFacts, offer: Offer) -> list[Peer]:
    """Not where the peers are compiled: its per-op decisions are made for the eager ops its estimator saw, and a
    compiled step traces other ops (its policy refuses them: ``env.measure.auto_sac.op_policy``)."""
    if facts.container is None or not offer.budgets or offer.compiled:
        return []
    from env.measure.auto_sac import missing

    reason = missing()
    if reason is not None:
        warnings.warn(reason, stacklevel=3)
        return []
    return [torch_auto_sac_peer(b, facts.device_type) for b in offer.budgets]


# ---------------------------------------------------------------------------------------------
# A peer as a plan of ours

def peer_plan(workload: Workload, peer: Peer, units: Sequence[str], facts: ModelFacts | None = None) -> list[Action] | None:
    """The plan of ours over ``units`` that ``peer`` is (the same step: the same tensors saved and recomputed),
    or None where it is none: its blocks are not all units (in order, side by side where it recomputes them as
    one region), or its kind decides per op or by a compiler. ``facts``: ``model_facts(workload)``, found once."""
    return KINDS[peer.kind].as_plan(facts or model_facts(workload), peer, list(units))


def _on_blocks(units: list[str], blocks: Sequence[str], actions: Sequence[Action]) -> list[Action] | None:
    """``actions`` on ``blocks`` among ``units``, every other unit kept; None where a block is not a unit, or
    (with a chain region among them) the blocks are not side by side in order. A block that is no unit but whose
    parts are (sub-block units) is ``block`` on each of them where it recomputes, kept where it keeps; a chain
    region over such blocks is none of our plans."""
    if not blocks:
        return None
    parts = {b: [b] if b in units else [u for u in units if u.startswith(b + ".")] for b in blocks}
    split = [a for b, a in zip(blocks, actions) if parts[b] != [b]]
    if any(not p for p in parts.values()) or any(a not in (Action.RECOMPUTE, Action.KEEP) for a in split) or (
            Action.CHAIN in actions and split):
        return None
    at = [units.index(b) for b in blocks if b in units]
    if Action.CHAIN in actions and at != list(range(at[0], at[0] + len(at))):
        return None
    plan = [Action.KEEP] * len(units)
    for b, a in zip(blocks, actions):
        for u in parts[b]:
            plan[units.index(u)] = a if parts[b] == [b] else Action.BLOCK if a == Action.RECOMPUTE else Action.KEEP
    return plan


def _no_plan(facts: ModelFacts, peer: Peer, units: list[str]) -> list[Action] | None:
    return None


def _sequential_plan(facts: ModelFacts, peer: Peer, units: list[str]) -> list[Action] | None:
    n = len(facts.chain_blocks)
    if facts.chain != peer.params["chain"] or not 1 <= int(peer.params["segments"]) <= n:
        return None
    return _on_blocks(units, facts.chain_blocks,
                      checkpoint_sequential_actions(n, int(peer.params["segments"]), [False] + [True] * (n - 1)))


def _hf_plan(facts: ModelFacts, peer: Peer, units: list[str]) -> list[Action] | None:
    n = int(peer.params["every_n_layers"])  # transformers 5: layer i checkpointed where i % n == 0
    return _on_blocks(units, facts.hf_layers,
                      [Action.RECOMPUTE if i % n == 0 else Action.KEEP for i in range(len(facts.hf_layers))])


def _titan_layer_plan(facts: ModelFacts, peer: Peer, units: list[str]) -> list[Action] | None:
    picks = layer_picks(len(facts.blocks), int(peer.params["every"]))
    return _on_blocks(units, facts.blocks, [Action.RECOMPUTE if p else Action.KEEP for p in picks])


# ---------------------------------------------------------------------------------------------
# Installing a peer, and measuring it

def _refuse_plan(workload: Workload, peer: Peer) -> None:
    planned = planned_units(workload.model)
    if planned:
        raise PlanError(f"peer '{peer.name}' on workload '{workload.spec}': unit '{planned[0]}' has a plan applied; "
                        "remove the plan first (handle.remove()), a peer is measured on the bare model")


PEER_GROUPS: tuple[str, ...] = ("none", "eager", "all")  # the ``--peers`` choices, each selecting the kinds before it


@dataclasses.dataclass(frozen=True)
class KindSpec:
    """One kind of peer, all that the rest of the code knows of it: which configurations apply to a model
    (``offer``), how one is installed on a workload (``install``: yields the compile options it needs, None eager;
    undone on exit), what it is in words (``label``), where it is a plan of ours (``as_plan``: the plan over the
    units, None where it is none), whether its step is compiled whatever the run measures (``compiled``) and the
    smallest ``--peers`` group that selects it (``group``, one of ``PEER_GROUPS`` but none)."""

    offer: Callable[[ModelFacts, Offer], list[Peer]]
    install: Callable[[Workload, Peer], contextlib.AbstractContextManager[CompileOptions | None]]
    label: Callable[[Peer], str]
    as_plan: Callable[[ModelFacts, Peer, list[str]], list[Action] | None] = _no_plan
    compiled: bool = False
    group: str = "eager"


def _every(p: Peer, key: str, unit: str) -> str:
    n = int(p.params[key])
    return f", every {n} {unit}" if n > 1 else ""


KINDS: dict[PeerKind, KindSpec] = {
    PeerKind.COMPILE_BUDGET: KindSpec(
        _offer_budgets, compile_budget,
        lambda p: f"torch.compile, activation_memory_budget {float(p.params['budget']):.1f}", compiled=True,
        group="all"),
    PeerKind.HF_CHECKPOINTING: KindSpec(
        _offer_hf, lambda w, p: eager(hf_checkpointing, w, p),
        lambda p: "transformers' gradient checkpointing" + _every(p, "every_n_layers", "layers"), _hf_plan),
    PeerKind.CHECKPOINT_SEQUENTIAL: KindSpec(
        _offer_sequential, lambda w, p: eager(checkpoint_sequential_blocks, w, p),
        lambda p: f"checkpoint_sequential, {p.params['segments']} segments", _sequential_plan),
    PeerKind.TORCHTITAN_OP_SAC: KindSpec(
        _offer_titan_op, lambda w, p: eager(titan_op_sac, w, p),
        lambda p: "torchtitan's op selective AC (attention and every second matmul saved)"),
    PeerKind.TORCHTITAN_LAYER_SAC: KindSpec(
        _offer_titan_layer, lambda w, p: eager(titan_layer_sac, w, p),
        lambda p: "torchtitan's layer selective AC" + _every(p, "every", "blocks"), _titan_layer_plan),
    # auto-SAC only with --peers all: its estimators, a pwlf fit per module and an ILP per budget cost seconds
    # before its first step, and it is a peer per budget, which the default run does not pay
    PeerKind.TORCH_AUTO_SAC: KindSpec(
        _offer_auto_sac, lambda w, p: eager(torch_auto_sac, w, p),
        lambda p: f"PyTorch's auto-SAC (sac_milp), budget {float(p.params['budget']):.1f}", group="all"),
}
assert all(spec.group in PEER_GROUPS[1:] for spec in KINDS.values()), "every peer kind needs a --peers group"


def kinds_selected(group: str) -> tuple[str, ...]:
    """The kinds that ``--peers group`` measures: those whose group is ``group`` or one before it in
    ``PEER_GROUPS`` (``none``: no kind)."""
    if group not in PEER_GROUPS:
        raise ValueError(f"peers group '{group}' is unknown; choose one of {', '.join(PEER_GROUPS)}")
    return tuple(kind.value for kind, spec in KINDS.items()
                 if PEER_GROUPS.index(spec.group) <= PEER_GROUPS.index(group))


@contextlib.contextmanager
def prepared(workload: Workload, peer: Peer) -> Iterator[CompileOptions | None]:
    """Install ``peer`` on the workload; yields the compile options it needs (None: eager). Undone on exit."""
    _refuse_plan(workload, peer)
    with KINDS[peer.kind].install(workload, peer) as options:
        yield options


def measure_peer(workload: Workload, peer: Peer, repeats: int = 5, warmup: int = 1,
                 compile: bool | CompileOptions = False, source: str = "", measurement_id: str = "",
                 known: MeasuredPlan | None = None, stop_above: int | None = None) -> MeasuredPlan:
    """Measure ``peer`` as a plan is measured, filed under ``peer.digest``. ``compile`` compiles the
    eager peers too (a ``compile_budget`` peer is always compiled, with its budget), always the whole model
    (scope ``model``): a peer is measured as its users run it. ``known``: the peer measured before at this
    batch, whose peak an eager peer takes on CPU as a plan does (``env.measure.measurement.reuses_peak``);
    ``stop_above``: as ``env.measure.measurement.measure_prepared`` says."""
    asked = compile_options(compile)
    if asked is not None:  # a peer is compiled as its users compile it: the whole model
        asked = dataclasses.replace(asked, scope="model")
    with prepared(workload, peer) as options:
        if options is None:
            options = asked
        elif asked is not None:  # the caller's compile options, with the peer's budget
            options = dataclasses.replace(asked, activation_memory_budget=options.activation_memory_budget)
        return measure_prepared(workload, peer.digest, [], repeats, warmup, options or False,
                                source or peer.digest, measurement_id, known, stop_above)


def gradient_error(workload: Workload, peer: Peer, seed: int = 0, reference: Step | None = None) -> float:
    """How far a training step with ``peer`` installed lies from the same step without it, from the same RNG
    state, dropout on (``env.runtime.chains.step_error``): near 0 (summation order) where the peer keeps the
    gradients, above ``GRADIENT_TOLERANCE`` where it does not. ``reference``: the step without it from ``seed``
    (``training_step``), where the caller checks several peers on one workload.

    A compile budget, where the compiler's partitioner decides what to recompute, is compiled here with the
    ``aot_eager`` backend: the partitioner with eager kernels and eager random numbers, so that an unplanned
    compiled step gives the eager step (inductor draws its own random numbers, and the two steps would differ
    whatever was recomputed). Budget 1.0 gives the eager step on every bench workload; where it does not, the
    model's own graph breaks are at work, and the check says nothing of the budgets. The other peers are
    checked eagerly, where what they recompute is decided: compiled, a model that breaks the graph
    (``checkpoint_sequential`` is skipped by dynamo) draws other random numbers than the eager step whether or
    not anything is recomputed (diffusers/unet2d with one segment, which recomputes nothing: error 1.75)."""
    reference = training_step(workload, seed) if reference is None else reference
    with prepared(workload, peer) as needs:
        if needs is None:
            return step_error(training_step(workload, seed), reference)
        with compiled(workload, dataclasses.replace(needs, backend="aot_eager", fullgraph=False)) as session:
            return step_error(training_step(workload, seed, model=session.workload.model), reference)

"""The run store's meta keys, each declared once with its type and what it holds.

A run store's ``meta`` table maps a key to a JSON value (``search.records.store``). Every key a
run writes is a ``MetaKey`` here: its name (as stored, so older stores still open), the type its
value is checked against on write and on read (pydantic), the value a store that lacks it reads
as, and a docstring. ``RunStore.read(key)`` / ``RunStore.write(key, value)`` take these keys;
``meta_key(name)`` finds one by its stored name and refuses a name no key declares.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Callable, Generic, TypeVar

from pydantic import StringConstraints, TypeAdapter
from typing_extensions import NotRequired, TypedDict

from env.data.errors import CkptSearchError
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan_check import PlanCheck
from env.data.unit_choice import UnitChoice
from search.records.throughput import ThroughputCurve

T = TypeVar("T")

# running, finished, interrupted, or failed with its cause in one line ("failed: the model raised ...")
RunStatus = Annotated[str, StringConstraints(pattern=r"^(running|finished|interrupted|failed(: [^\n]+)?)$")]


class MetaKeyError(CkptSearchError):
    """A run meta key that no ``MetaKey`` declares."""


class DriverProcess(TypedDict):
    """The process that drives a run: a run marked running whose process is gone reads ``stopped``."""

    pid: int
    host: str


class EvaluatorInfo(TypedDict):
    """One Evaluator of the run, as ``EvaluatorPool.describe`` gives it."""

    name: str
    label: str  # evaluator@node: what its measurements are labelled with
    node: str | None
    device: str | None  # the device model its plans are compared on
    pid: int | None
    restarts: int
    alive: bool
    warm_up_steps: NotRequired[int | None]
    rank_pids: NotRequired[list[int]]  # an FSDP group (--fsdp): the process of each rank, in rank order


class FsdpRun(TypedDict):
    """How a run measured under FSDP2 (``--fsdp N``): every peak and time in it is per rank."""

    ranks: int  # ranks per Evaluator (one process group each)
    backend: str  # gloo (CPU) or nccl (GPU)
    sharded: list[str]  # the modules fully_shard wrapped ('' for the root)
    peers: str  # why peers were not measured


class BaselineOnEvaluator(TypedDict):
    """The baseline (all keep) as one Evaluator measured it: a systematically slower device shows."""

    peak_bytes: int
    step_seconds: float
    clock: str


class PeerEntry(TypedDict):
    """A measured peer (``env.measure.peers``): its record, every measurement merged, and why it is one.
    A peer that is a plan of ours (``plan``: that plan's digest) is measured as that plan, and its record
    is the plan's, as it was when last written. ``spec``: the peer itself (``env.measure.peers.Peer`` as JSON),
    so that the passes at the end of a run measure it again; ``label``: the peer in words."""

    record: MeasuredPlan
    note: str
    plan: NotRequired[str | None]
    spec: NotRequired[dict[str, Any]]
    label: NotRequired[str]


class AgentBudget(TypedDict):
    """An agent and the memory budget its exported plan is chosen for (``plans/budget_<N>MB.json``)."""

    name: str
    budget_bytes: int


class AnswerRound(TypedDict):
    """One answer round: plans the agents proposed that were new to the pool, and how many were measured."""

    proposed: int
    measured: int


class BatchPoint(TypedDict):
    """A frontier plan measured at one batch size."""

    batch_size: int
    peak_bytes: int
    step_seconds: float
    oom: NotRequired[bool]
    clock: NotRequired[str]


class BatchRecord(TypedDict):
    """A plan or peer measured at a micro-batch in a throughput search: every measurement there merged."""

    micro_batch: int
    record: MeasuredPlan


@dataclass(frozen=True)
class MetaKey(Generic[T]):
    """One meta key: ``name`` as stored, the type its value has, and what a store without it reads as."""

    name: str
    value_type: Any  # as pydantic validates it
    doc: str
    missing: Callable[[], T] = field(default=lambda: None)  # type: ignore[assignment,return-value]

    @cached_property
    def adapter(self) -> TypeAdapter[T]:
        return TypeAdapter(self.value_type)

    def dumps(self, value: T) -> str:
        """The value checked against the key's type, as JSON (pydantic's ``ValidationError`` if it is not)."""
        checked = self.adapter.validate_python(value)
        return json.dumps(self.adapter.dump_python(checked, mode="json"))

    def loads(self, text: str) -> T:
        """A stored value, checked against the key's type (pydantic's ``ValidationError`` if it is not)."""
        return self.adapter.validate_python(json.loads(text))


KEYS: dict[str, MetaKey[Any]] = {}


def _key(name: str, type_: Any, doc: str, missing: Callable[[], Any] = lambda: None) -> MetaKey[Any]:
    key: MetaKey[Any] = MetaKey(name, type_, doc, missing)
    KEYS[name] = key
    return key


def meta_key(name: str) -> MetaKey[Any]:
    """The declared key stored under ``name``; a name no key declares is refused in one line."""
    if name not in KEYS:
        raise MetaKeyError(f"unknown run meta key '{name}'; the keys are {', '.join(sorted(KEYS))} "
                           "(declare a new one in search/records/meta.py)")
    return KEYS[name]


# -- the run ----------------------------------------------------------------------------------
STORE_SCHEMA_VERSION: MetaKey[int | None] = _key(
    "store_schema_version", int | None, "The store's schema version; a store of another version is refused.")
CONFIG: MetaKey[dict[str, Any] | None] = _key(
    "config", dict[str, Any] | None, "The run's ``SearchConfig`` as JSON: what ``--resume`` continues with.")
STATUS: MetaKey[RunStatus | None] = _key(
    "status", RunStatus | None, "running (while its driver lives), finished, interrupted (resumable) or failed: <cause>.")
DRIVER: MetaKey[DriverProcess | None] = _key(
    "driver", DriverProcess | None, "The driving process, so that a killed run reads as stopped.")
STARTED_AT: MetaKey[float | None] = _key("started_at", float | None, "Unix time the run was first started.")
FINISHED_AT: MetaKey[float | None] = _key("finished_at", float | None, "Unix time the run finished.")

# -- what the search prepared -----------------------------------------------------------------
PROFILE: MetaKey[ModelProfile | None] = _key(
    "profile", ModelProfile | None,
    "The workload's profile: what the cost model, the exact solver and the agents read.")
UNIT_CHOICE: MetaKey[UnitChoice | None] = _key(
    "unit_choice", UnitChoice | None, "The decision units with the bytes each saves for backward.")
HEADROOM: MetaKey[str | None] = _key(
    "headroom", str | None, "Why no plan over the units can lower the peak by much; None where one can.")
UNITS: MetaKey[list[str] | None] = _key("units", list[str] | None, "The decision units' FQNs, in execution order.")
FINGERPRINT: MetaKey[str | None] = _key(
    "fingerprint", str | None, "The model's fingerprint: a plan for another model is refused.")
EVALUATORS: MetaKey[list[EvaluatorInfo]] = _key(
    "evaluators", list[EvaluatorInfo], "Every Evaluator of the run, with its deaths and restarts.", list)
EVENTS: MetaKey[list[str]] = _key(
    "events", list[str], "What the report must mention, as it happened: an Evaluator's or agent's death and restart, "
    "a configuration recorded as not fitting (an allocation failed, or it killed its Evaluators).", list)
FSDP: MetaKey[FsdpRun | None] = _key(
    "fsdp", FsdpRun | None, "Measured under FSDP2 with N ranks per Evaluator (peaks and times per rank); None: one "
    "device.")
MAX_MEASUREMENTS: MetaKey[int | None] = _key(
    "max_measurements", int | None, "Most plans the run measures, rules and baseline included.")
MEASUREMENT_MODE: MetaKey[str] = _key(
    "measurement_mode", str, "Whether the agents train while the Evaluators measure, in words.", str)
AGENTS: MetaKey[list[AgentBudget]] = _key(
    "agents", list[AgentBudget], "Each agent and the memory budget its exported plan is chosen for.", list)

# -- what the search measured and how it ranks it ---------------------------------------------
RULES: MetaKey[dict[str, str]] = _key(
    "rules", dict[str, str], "Each measured baseline rule's name -> its plan's digest.", dict)
BASELINE_DIGEST: MetaKey[str | None] = _key(
    "baseline_digest", str | None,
    "The baseline's (all keep) digest: the reference every plan's time is ranked against.")
BASELINE_BY_EVALUATOR: MetaKey[dict[str, BaselineOnEvaluator]] = _key(
    "baseline_by_evaluator", dict[str, BaselineOnEvaluator],
    "With more than one Evaluator: the baseline as each measured it, by Evaluator label.", dict)
PEERS: MetaKey[dict[str, PeerEntry]] = _key(
    "peers", dict[str, PeerEntry], "Each measured peer's name -> its record and note; never on the plans' frontier.",
    dict)
WHOLE_MODEL: MetaKey[dict[str, MeasuredPlan]] = _key(
    "whole_model", dict[str, MeasuredPlan],
    "--compile-scope both: each frontier plan's digest -> its measurement with the whole model compiled.", dict)
EXACT_RELATIVE: MetaKey[float | None] = _key(
    "exact_relative", float | None, "The exact solver's merge step (0: exact), by the number of units.")
EXACT: MetaKey[list[str]] = _key(
    "exact", list[str], "The digests of the cost model's optimal frontier, fewest bytes first.", list)
ANSWER_ROUNDS: MetaKey[list[AnswerRound] | None] = _key(
    "answer_rounds", list[AnswerRound] | None,
    "Hybrid reward: the answer rounds after training, each with the plans proposed and measured.")
DECIDED_FROM: MetaKey[dict[str, int] | None] = _key(
    "decided_from", dict[str, int] | None,
    "Per Evaluator label, the place in its order where the deciding passes began: a plan measured in them "
    "is ranked on those measurements alone (``search.records.ranking.Ranking``).")
DECIDING_PASSES: MetaKey[list[list[str]] | None] = _key(
    "deciding_passes", list[list[str]] | None, "The digests each deciding pass measured, pass by pass.")
REMEASURED: MetaKey[list[str] | None] = _key(
    "remeasured", list[str] | None, "The digests the deciding passes measured, in order.")
CONFIRMED_FROM: MetaKey[dict[str, int] | None] = _key(
    "confirmed_from", dict[str, int] | None,
    "Per Evaluator label, the place in its order where the confirming passes began: a frontier plan measured "
    "in them is ranked and reported on those measurements alone (``search.records.ranking.Ranking``).")
CONFIRMED: MetaKey[list[str] | None] = _key(
    "confirmed", list[str] | None, "The digests the confirming passes measured, in order.")
CONFIRMING_NOISE: MetaKey[float | None] = _key(
    "confirming_noise", float | None,
    "The run's timing noise (a share) the confirming passes chose their plans by; the frontier shown is chosen "
    "by it too (``search.engine.shown.confirmable``), not by the noise the later measurements give.")
PHASE_SECONDS: MetaKey[dict[str, float]] = _key(
    "phase_seconds", dict[str, float],
    "Wall seconds the run spent in each phase, in the order first met (a resumed run adds to them).", dict)
EVALUATOR_SECONDS: MetaKey[dict[str, float]] = _key(
    "evaluator_seconds", dict[str, float],
    "Seconds the Evaluators spent measuring, summed over them: 'plans', 'references' (the all-keep plan "
    "measured again against drift), and their counts 'plan_measurements', 'reference_measurements'.", dict)

GATE: MetaKey[dict[str, PlanCheck]] = _key(
    "gate", dict[str, PlanCheck],
    "The correctness gate: each plan checked before it was shown, digest -> its verdict (loss and gradients "
    "against the unplanned step, ``env.measure.gate``). A plan that failed is never shown or exported, and "
    "every plan proposed after keeps the units it names.", dict)

# -- memory pricing ---------------------------------------------------------------------------
BATCH_SCALING: MetaKey[dict[str, list[BatchPoint]]] = _key(
    "batch_scaling", dict[str, list[BatchPoint]],
    "Frontier plans measured at a second batch size: digest -> its points, smaller batch first.", dict)
BATCH_SIZE: MetaKey[int | None] = _key("batch_size", int | None, "The run's batch size (built-in workloads).")

# -- throughput: (plan, micro-batch) under memory caps ------------------------------------------
THROUGHPUT_PROFILES: MetaKey[dict[int, ModelProfile]] = _key(
    "throughput_profiles", dict[int, ModelProfile],
    "Profiles at other micro-batches than the workload's own, by micro-batch: what the per-unit fit is made from.",
    dict)
THROUGHPUT_MEASURED: MetaKey[list[BatchRecord]] = _key(
    "throughput_measured", list[BatchRecord],
    "A store of schema version 2 only: every plan and peer its throughput search measured, per micro-batch; "
    "opening the store moves them into ``evaluations`` (a row per micro-batch) and removes the key.", list)
THROUGHPUT: MetaKey[ThroughputCurve | None] = _key(
    "throughput", ThroughputCurve | None,
    "The throughput search's answer per memory cap beside the peers, as quoted; None until it finished.")

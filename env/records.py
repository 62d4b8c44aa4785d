"""The plain data every layer above the measurement reads; nothing here imports torch.

- ``ModelProfile`` (with ``Segment`` and ``UnitCost``): per unit and action, the memory and time
  of that unit's part of a training step (measured by ``env.profile``). The cost model, the
  exact solver, the agents and the dashboard see a model only through it.
- ``MeasuredPlan``: one plan measured on one workload and device, the one record that travels
  from the Evaluator to the store, the archive, ``frontier.json``, the report, the dashboard
  and the benchmarks. Repeated measurements of a plan merge in one place, ``merged()``.
- ``UnitChoice``: the decision units and how much of the activation memory they hold
  (chosen by ``env.unit_choice``).
- The statistics of step-time samples (``median_seconds``, ``spread_seconds``), ``MIB`` and
  the reward modes.

A step's timeline is cut by the unit marks (see ``env.timeline``) into segments::

    pre | F_0 | F_1 | ... | F_{n-1} | post | B_{n-1} | ... | B_0 | tail

``F_i`` is unit i's forward (until the next unit starts; for the last unit, until its output's
gradient arrives, so the head and the loss are part of it), ``B_i`` its backward (from its
output's gradient until the previous unit's), ``pre``/``tail`` the rest (embeddings, optimizer
step). ``post`` is empty: the head's bytes depend on the last unit's action, so they are
measured as part of that unit under each action.
"""

from __future__ import annotations

import statistics
from enum import Enum
from typing import Mapping, Sequence

from pydantic import BaseModel, Field

from env.errors import MeasurementError
from env.plan import Action

MIB = 2**20  # memory is shown in MiB ("MB" in option names, as nvidia-smi says)


class RewardMode(str, Enum):
    """Where the agents' reward reads a plan's peak and time from."""

    MEASURED = "measured"  # every new plan measured
    MODEL = "model"  # the cost model only
    HYBRID = "hybrid"  # the cost model corrected by measurements (env.correction); frontier points measured

    def __str__(self) -> str:
        return self.value


def median_seconds(samples: Sequence[float]) -> float:
    """Median step time; infinite for a plan without samples (it never ran: out of memory)."""
    return statistics.median(samples) if samples else float("inf")


def spread_seconds(samples: Sequence[float]) -> float:
    """Interquartile range of step times (with fewer than 4 samples: max - min)."""
    s = sorted(samples)
    if len(s) < 4:
        return (s[-1] - s[0]) if s else 0.0
    q = statistics.quantiles(s, n=4)
    return q[2] - q[0]


class MeasuredPlan(BaseModel):
    """One plan measured on one workload and device: every repeat of it, merged."""

    workload: str
    batch_shape: str
    digest: str  # env.plan.plan_digest of the plan
    actions: list[str]  # action name per unit, in the profile's unit order
    sources: list[str] = Field(default_factory=list)  # everyone who proposed it, first first
    peak_bytes: int  # everything live at the step's peak
    live_before_bytes: int  # parameters, optimizer state and inputs, before the step
    peak_reserved_bytes: int | None = None  # CUDA caching allocator's reserve at its peak
    step_seconds_samples: list[float]  # one per timed step, all repeats together
    # per sample: the median step of the reference plan (all keep) measured on the same Evaluator just before,
    # so that plans measured minutes apart compare as if side by side (``paired``); empty: not measured so
    reference_seconds: list[float] = Field(default_factory=list)
    clock: str  # what the samples were read from: env.timeline.step_clock
    device: str
    torch_version: str
    oom: bool = False  # the plan ran out of memory: infeasible on this device
    measurement_ids: list[str] = Field(default_factory=list)  # one per measurement merged in
    evaluators: list[str] = Field(default_factory=list)  # who measured it (evaluator@node), per measurement
    compile_seconds: float | None = None  # torch.compile's warm-up, apart from the steps; None: eager steps
    recompiles: int | None = None  # graphs compiled again during the measured steps (compiled only; 0 expected)
    graph_breaks: int | None = None  # graph breaks of the compiled model (compiled only; 0: one graph)

    @property
    def source(self) -> str:
        """Who proposed it first."""
        return self.sources[0] if self.sources else ""

    @property
    def activation_bytes(self) -> int:
        return self.peak_bytes - self.live_before_bytes

    @property
    def step_seconds(self) -> float:
        return median_seconds(self.step_seconds_samples)

    @property
    def spread_seconds(self) -> float:
        return spread_seconds(self.step_seconds_samples)

    @property
    def is_paired(self) -> bool:
        """Every sample has its reference (``reference_seconds``)."""
        return len(self.reference_seconds) == len(self.step_seconds_samples)

    @property
    def has_references(self) -> bool:
        """Measured with references: at least one sample, and each with its reference."""
        return bool(self.reference_seconds) and self.is_paired

    @property
    def n_measurements(self) -> int:
        return max(1, len(self.measurement_ids))

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.workload, self.batch_shape, self.digest)

    def proposed_by(self, *sources: str) -> "MeasuredPlan":
        """This record with ``sources`` added to its proposers (first proposer stays first)."""
        new = [s for s in sources if s and s not in self.sources]
        return self.model_copy(update={"sources": self.sources + new}) if new else self

    def merged(self, other: "MeasuredPlan") -> "MeasuredPlan":
        """This record with another measurement of the same plan added: samples appended, peak the
        larger, proposers united. A measurement already merged in (same id) is not added twice;
        measurements taken with another clock or on another device model are refused."""
        if other.key != self.key:
            raise MeasurementError(f"cannot merge measurements of different plans {self.key} and {other.key}")
        if (self.compile_seconds is None) != (other.compile_seconds is None):
            raise MeasurementError(f"cannot merge a compiled and an eager measurement of plan {self.digest}; "
                                   "keep compiled and eager records apart")
        if other.clock != self.clock or other.device != self.device:
            raise MeasurementError(
                f"plan {self.digest}: a measurement by the {other.clock} clock on {other.device} cannot join those "
                f"by the {self.clock} clock on {self.device}; compare plans measured on one device model and clock")
        fresh = [i for i in other.measurement_ids if i not in self.measurement_ids]
        merged = self.proposed_by(*other.sources)
        if other.measurement_ids and not fresh:
            return merged  # every measurement in ``other`` is here already
        return merged.model_copy(update={
            "peak_bytes": max(self.peak_bytes, other.peak_bytes),
            "peak_reserved_bytes": max(self.peak_reserved_bytes or 0, other.peak_reserved_bytes or 0) or None,
            "step_seconds_samples": self.step_seconds_samples + other.step_seconds_samples,
            "reference_seconds": (self.reference_seconds + other.reference_seconds
                                  if self.is_paired and other.is_paired else []),
            "oom": self.oom and other.oom,
            "measurement_ids": self.measurement_ids + fresh,
            "evaluators": self.evaluators + other.evaluators,
        })


def paired(record: MeasuredPlan, scale: float | None) -> MeasuredPlan:
    """The record with each sample taken relative to the reference measured beside it, times
    ``scale`` (the reference's median over the run): a machine that slows down or speeds up
    during a search, or a slower Evaluator, moves a plan and its reference alike and drops out,
    so plans measured minutes apart compare as if measured side by side. The copy's references
    are ``scale``, so pairing it again with another scale rescales it. Unchanged when a sample
    lacks its reference (old stores, compiled runs) or there is no scale."""
    if not scale or not record.is_paired or not record.step_seconds_samples:
        return record
    samples = [s * scale / r for s, r in zip(record.step_seconds_samples, record.reference_seconds)]
    return record.model_copy(update={"step_seconds_samples": samples, "reference_seconds": [scale] * len(samples)})


def no_faster_than(record: MeasuredPlan, seconds: float) -> MeasuredPlan:
    """The record with its samples scaled so that its median is a hair above ``seconds`` (the
    baseline's) if it was below. Recomputing, selectively recomputing or offloading a unit adds
    work to the step, so a plan measured faster than keeping everything measured noise; among the
    plans that save a little memory for a little time, one always measures lucky, and on raw
    medians it pushed the baseline, the fastest plan there is, off the frontier (unet2d, resnet50:
    the frontier's top point then quoted 7-11% slower than the baseline). The hair keeps both."""
    if record.oom or not record.step_seconds_samples or record.step_seconds > seconds:
        return record
    f = seconds * (1 + 1e-9) / record.step_seconds
    return record.model_copy(update={"step_seconds_samples": [s * f for s in record.step_seconds_samples]})


NEAREST_REFERENCES = 3  # a measurement is ranked against this many reference measurements nearest to it


def measurements_of(record: MeasuredPlan) -> list[tuple[str, int, list[float]]] | None:
    """Each measurement merged in ``record``: (who measured it, its place in that measurer's order,
    its samples), read from its ``measurement_ids`` (``<evaluator>:<n>``, n counting everything that
    Evaluator measured); None when the ids do not tell (none, one without its place, samples that do
    not split evenly between them)."""
    ids, samples = record.measurement_ids, record.step_seconds_samples
    if not ids or not samples or len(samples) % len(ids):
        return None
    per = len(samples) // len(ids)
    out = []
    for k, mid in enumerate(ids):
        who, _, n = mid.rpartition(":")
        if not who or not n.isdigit():
            return None
        out.append((who, int(n), samples[k * per:(k + 1) * per]))
    return out


class Ranking:
    """What a search ranks a measured plan by, given its baseline as measured (None: not yet): the
    plan's samples taken relative to the reference (all keep) measured beside them, in the baseline's
    median seconds (``scale``), and unless it is the baseline, no faster than the baseline ranked so
    (``no_faster_than``).

    Beside means on both sides: each measurement against the pooled samples of the
    ``NEAREST_REFERENCES`` reference measurements of its Evaluator nearest to it in that Evaluator's
    order, those after it included once they exist (the baseline's record holds them all). The
    Evaluator labels each sample with the references before it (``paired``), all it knows then; a
    machine that sped up after two slow references kept every plan of the next minutes paired with
    the slow ones (gpt/small: plans ranked 10-15% faster than they quoted, and one of them kept the
    rule ``segments_2`` off the agents' frontier). Records whose ids do not place them (older
    stores) are ``paired`` as labelled.

    With ``decided_from`` (per Evaluator, the place in its order where a search's deciding passes
    began; ``search.driver.Driver.remeasure_frontier``), a plan measured in those passes is ranked
    on those measurements alone, taken side by side with the other plans that decide the frontier;
    an Evaluator the mapping does not name started after they began. The baseline keeps all its
    measurements: they are the references. Pairing removes a drift that moves every plan alike,
    not one that changes the plans' ratios to each other: on a 6-unit hf/gpt2 search the all-keep
    step measured 928 ms for 54 measurements and 840 ms after, and all-recompute's ratio to it
    went from 1.37 to 1.51; a plan measured three times in the first phase ranked 1.205 and kept
    two plans off the agents' frontier that its quote put 6% ahead of it."""

    def __init__(self, baseline: MeasuredPlan | None, decided_from: Mapping[str, int] | None = None) -> None:
        ran = baseline is not None and not baseline.oom
        self.baseline_digest = baseline.digest if ran else None
        self.decided_from = dict(decided_from) if decided_from is not None else None
        self.scale = baseline.step_seconds if ran else None
        self._references: dict[str, list[tuple[int, list[float]]]] = {}
        for who, n, samples in (measurements_of(baseline) or []) if ran and baseline.has_references else []:
            self._references.setdefault(who, []).append((n, samples))
        self.floor = self._paired(baseline).step_seconds if ran else None

    def _reference(self, who: str, n: int) -> float | None:
        near = sorted(self._references.get(who, []), key=lambda r: (abs(r[0] - n), r[0]))[:NEAREST_REFERENCES]
        return median_seconds([x for _, samples in near for x in samples]) if near else None

    def _paired(self, record: MeasuredPlan) -> MeasuredPlan:
        parts = measurements_of(record) if self.scale and record.has_references else None
        refs = [self._reference(who, n) for who, n, _ in parts or []]
        if not parts or any(r is None for r in refs):
            return paired(record, self.scale)
        samples = [s * self.scale / r for (_, _, part), r in zip(parts, refs) for s in part]
        return record.model_copy(update={"step_seconds_samples": samples,
                                         "reference_seconds": [self.scale] * len(samples)})

    def decided(self, record: MeasuredPlan) -> MeasuredPlan:
        """The record cut to its measurements of the deciding passes, when it has any (and is not
        the baseline); else as it is."""
        parts = measurements_of(record) if self.decided_from is not None else None
        if not parts or record.digest == self.baseline_digest:
            return record
        late = [k for k, (who, n, _) in enumerate(parts) if n >= self.decided_from.get(who, 0)]
        if not late or len(late) == len(parts):
            return record
        per = len(record.step_seconds_samples) // len(parts)
        at = [k * per + j for k in late for j in range(per)]
        return record.model_copy(update={
            "step_seconds_samples": [record.step_seconds_samples[i] for i in at],
            "reference_seconds": [record.reference_seconds[i] for i in at] if record.is_paired else [],
            "measurement_ids": [record.measurement_ids[k] for k in late],
            "evaluators": ([record.evaluators[k] for k in late] if len(record.evaluators) == len(parts)
                           else record.evaluators)})

    def __call__(self, record: MeasuredPlan) -> MeasuredPlan:
        out = self._paired(self.decided(record))
        if self.floor is None or record.digest == self.baseline_digest:
            return out
        return no_faster_than(out, self.floor)


class UnitChoice(BaseModel):
    """The decision units of a workload and how much of the activation memory they hold."""

    units: list[str]  # FQNs, in forward execution order
    saved_bytes: list[int]  # per unit: bytes its subtree saves for backward
    total_saved_bytes: int  # everything saved for backward in one step, also outside any module
    coverable_bytes: int  # saved inside the model's submodules: what units can hold
    coverage: float  # sum(saved_bytes) / coverable_bytes (0.0 when not measured)
    mode: str  # auto, blocks, sub-blocks or patterns

    def lines(self) -> list[str]:
        """Human-readable: each unit with its saved MiB and share, then the coverage."""
        width = max((len(u) for u in self.units), default=0)
        share = [b / self.coverable_bytes if self.coverable_bytes else 0.0 for b in self.saved_bytes]
        out = [f"{u:<{width}}  {b / MIB:8.2f} MiB  {s:6.1%}"
               for u, b, s in zip(self.units, self.saved_bytes, share)]
        outside = self.total_saved_bytes - self.coverable_bytes
        out.append(f"{len(self.units)} units ({self.mode}) hold {self.coverage:.1%} of the "
                   f"{self.coverable_bytes / MIB:.1f} MiB the model's modules save for backward"
                   + (f"; {outside / MIB:.1f} MiB more is saved outside them (loss, top-level ops)" if outside else ""))
        return out


class Segment(BaseModel):
    delta_bytes: int  # net bytes allocated (negative: freed) over the segment
    rise_bytes: int  # highest point above the segment's start, >= 0
    seconds: float  # median time, read from the profile's clock


class UnitCost(BaseModel):
    fwd: Segment
    bwd: Segment

    @property
    def kept_bytes(self) -> int:
        """Bytes this unit keeps for backward (forward's net allocation)."""
        return self.fwd.delta_bytes

    @property
    def backward_peak_bytes(self) -> int:
        """Bytes live above the start of its backward: recomputed activations and gradients."""
        return self.bwd.rise_bytes

    @property
    def grad_bytes(self) -> int:
        """What the unit leaves live after its backward (its weight gradients)."""
        return self.fwd.delta_bytes + self.bwd.delta_bytes

    @property
    def seconds(self) -> float:
        return self.fwd.seconds + self.bwd.seconds


class ModelProfile(BaseModel):
    """What the cost model, the exact solver and the agents see of a model."""

    workload: str
    batch_shape: str
    device: str
    fingerprint: str
    units: list[str]  # in execution order
    actions: list[Action]  # the actions profiled, in this order
    base_bytes: int  # live before the step
    pre: Segment
    post: Segment
    tail: Segment
    costs: dict[Action, list[UnitCost]]  # costs[action][unit index]
    baseline: MeasuredPlan | None = None  # all-keep, measured
    clock: str = "wall"  # what segment seconds were read from (env.timeline.step_clock)

    def cost(self, unit: int, action: Action) -> UnitCost:
        return self.costs[action][unit]

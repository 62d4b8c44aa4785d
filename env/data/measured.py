"""``MeasuredPlan``: one plan measured on one workload and device, the one record that travels
from the Evaluator to the store, the archive, ``frontier.json``, the report, the dashboard and
the benchmarks. Repeated measurements of a plan merge in one place, ``merged()``. Beside it the
statistics of step-time samples (``median_seconds``, ``spread_seconds``) and the test by which two measurements
at micro-batches compare (``within_spreads``, ``compare_times``). Torch-free.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from pydantic import BaseModel, Field

from env.data.errors import MeasurementError


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


def within_spreads(a: tuple[float, int, float], b: tuple[float, int, float]) -> bool:
    """Whether two measurements, each (seconds a step, micro-batch, spread seconds), differ in seconds per sample
    by no more than either's spread per sample: the test by which the throughput search's run-off, the grid's
    quote and the throughput bench's view call two configurations apart or not."""
    (sa, ba, pa), (sb, bb, pb) = a, b
    return abs(sa / ba - sb / bb) <= max(pa / ba, pb / bb)


class TimeVerdict(BaseModel):
    """Two step times compared, each with its spread: ``faster`` or ``slower`` (the first against the second)
    only where they differ by more than both spreads; else ``within noise``."""

    verdict: str  # "faster", "slower" or "within noise"
    ratio: float  # first / second seconds (per sample)
    noise: float  # the larger spread over the second's seconds (per sample): the "±x%" of "within noise"

    def __str__(self) -> str:
        if self.verdict == "within noise":
            return f"within noise (±{self.noise:.0%})"
        return f"{self.ratio:.2f}x, {self.verdict} beyond both spreads"


def compare_times(first: tuple[float, float], second: tuple[float, float],
                  micro_batches: tuple[int, int] = (1, 1)) -> TimeVerdict:
    """``first`` against ``second``, each (seconds a step, spread seconds), per sample at ``micro_batches``: the
    one verdict the report, the dashboard and the benchmarks give when they call a plan or peer faster."""
    (sa, pa), (sb, pb) = first, second
    ba, bb = micro_batches
    noise = max(pa / ba, pb / bb) / (sb / bb)
    ratio = (sa / ba) / (sb / bb)
    if within_spreads((sa, ba, pa), (sb, bb, pb)):
        return TimeVerdict(verdict="within noise", ratio=ratio, noise=noise)
    return TimeVerdict(verdict="faster" if ratio < 1 else "slower", ratio=ratio, noise=noise)


class MeasuredPlan(BaseModel):
    """One plan measured on one workload and device: every repeat of it, merged."""

    workload: str
    batch_shape: str
    digest: str  # env.data.plan.plan_digest of the plan
    actions: list[str]  # action name per unit, in the profile's unit order
    sources: list[str] = Field(default_factory=list)  # everyone who proposed it, first first
    peak_bytes: int  # everything live at the step's peak
    live_before_bytes: int  # parameters, optimizer state and inputs, before the step
    peak_reserved_bytes: int | None = None  # CUDA caching allocator's reserve at its peak
    step_seconds_samples: list[float]  # one per timed step, all repeats together
    # per sample: the median step of the reference plan (all keep) measured on the same Evaluator just before,
    # so that plans measured minutes apart compare as if side by side (``paired``); empty: not measured so
    reference_seconds: list[float] = Field(default_factory=list)
    clock: str  # what the samples were read from: env.measure.timeline.step_clock
    device: str
    torch_version: str
    oom: bool = False  # the plan ran out of memory: infeasible on this device
    requested_bytes: int | None = None  # oom: the bytes the failed allocation asked for, where its error said
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
            "requested_bytes": self.requested_bytes if other.requested_bytes is None else other.requested_bytes,
            "measurement_ids": self.measurement_ids + fresh,
            "evaluators": self.evaluators + other.evaluators,
        })

"""The throughput curve: for each memory cap, the fastest (plan, micro-batch) measured, beside what users do.

A throughput search (``--memory-cap``) answers, per cap, with the (plan, micro-batch) of the highest
measured samples per second whose measured peak fits the cap. These records carry that answer from
the search to ``frontier.json`` (``FrontierFile.throughput``), the report, the export and the
dashboard. Torch-free.

- ``ThroughputPoint``: one configuration (our plan, a rule, a peer) measured at one micro-batch.
- ``CapRow``: one cap's answer and the peers, each at the largest micro-batch it fits, as measured
  again after the choice in interleaved rounds (``quote``); ``selected`` is the answer as it was
  chosen, on the measurements that chose it, which a reader should not compare with the quote.
- ``ThroughputCurve``: every cap, the micro-batches searched, the fit's checks, and the measured
  memory/time frontier at each micro-batch.

With a global batch (``--global-batch N``) a micro-batch ``b`` takes ``ceil(N / b)`` accumulation
steps, and from the second one on every parameter's gradient is live through the step: a peak is
then counted with ``gradient_bytes`` added (an upper bound), so an answer fits while accumulating.
"""

from __future__ import annotations

import math
from typing import Sequence

from pydantic import BaseModel, Field

from env.data.measured import MeasuredPlan
from env.data.plan import Action
from env.data.types import MIB


def accumulation_steps(micro_batch: int, global_batch: int | None) -> int:
    """Micro-batches per optimizer step: ``ceil(global / micro)``; 1 without a global batch."""
    return max(1, math.ceil(global_batch / micro_batch)) if global_batch else 1


def counted_peak(peak_bytes: int, micro_batch: int, global_batch: int | None, gradient_bytes: int) -> int:
    """The peak a cap is checked against: with accumulation, the gradients live through every step."""
    return peak_bytes + (gradient_bytes if accumulation_steps(micro_batch, global_batch) > 1 else 0)


class ThroughputPoint(BaseModel):
    """One configuration measured at one micro-batch (every sample of those measurements merged)."""

    name: str  # "ours", or a rule's or a peer's source: rule:none, peer:hf-checkpointing, ...
    label: str  # what it is, in words: "no checkpointing", "recompute everything", ...
    digest: str  # the plan's digest, or peer:<name>
    plan: dict[str, Action] | None = None  # the plan's actions per unit; None: a peer outside the plan space
    micro_batch: int
    accumulation: int = 1  # micro-batches per optimizer step (global batch / micro-batch, rounded up)
    peak_bytes: int  # measured, everything live at the step's peak
    counted_peak_bytes: int  # what the cap was checked against (with accumulation: plus the gradients)
    step_seconds: float  # median of the samples: one micro-batch's training step
    spread_seconds: float = 0.0
    samples_per_second: float
    tokens_per_second: float | None = None  # where the workload knows its tokens per sample
    n_samples: int = 0  # timed steps behind step_seconds
    source: str = ""  # who proposed the plan (exact, agent_<b>, a rule), for ours

    @classmethod
    def of(cls, m: MeasuredPlan, name: str, label: str, micro_batch: int, global_batch: int | None,
           gradient_bytes: int, tokens_per_sample: int | None, units: Sequence[str] | None = None) -> "ThroughputPoint":
        """The point of measurement ``m`` (a plan's when ``units`` is given, a peer's otherwise)."""
        per_second = micro_batch / m.step_seconds if m.step_seconds > 0 and not m.oom else 0.0
        return cls(name=name, label=label, digest=m.digest, micro_batch=micro_batch,
                   plan={u: Action(a) for u, a in zip(units, m.actions)} if units is not None else None,
                   accumulation=accumulation_steps(micro_batch, global_batch), peak_bytes=m.peak_bytes,
                   counted_peak_bytes=counted_peak(m.peak_bytes, micro_batch, global_batch, gradient_bytes),
                   step_seconds=m.step_seconds, spread_seconds=m.spread_seconds, samples_per_second=per_second,
                   tokens_per_second=per_second * tokens_per_sample if tokens_per_sample else None,
                   n_samples=len(m.step_seconds_samples), source=m.source)


class CapRow(BaseModel):
    """One memory cap: our answer and the peers, each at the largest micro-batch it fits."""

    cap_bytes: int
    answer: ThroughputPoint | None = None  # ours, as quoted (measured again after the choice); None: nothing fits
    selected: ThroughputPoint | None = None  # ours, on the measurements that chose it
    model_optimal: ThroughputPoint | None = None  # the exact solver's best (plan, micro-batch) on the fitted cost model
    # the answer's step as the model priced it when the search chose it: the per-unit fit alone, and scaled by the
    # steps timed at the nearest micro-batch (what the search ranks by); None: no answer, or a run before them
    fit_seconds: float | None = None
    predicted_seconds: float | None = None
    quote: list[ThroughputPoint] = Field(default_factory=list)  # ours first, then the peers: the quote's measurements
    unfit: dict[str, str] = Field(default_factory=dict)  # peer -> why it has no micro-batch that fits
    why: str = ""  # when nothing fits: the lowest measured peak
    # the best measured (plan, micro-batch) that fits, by who proposed it ("exact", "agent"), as quoted
    by_proposer: dict[str, ThroughputPoint] = Field(default_factory=dict)

    def peers(self) -> list[ThroughputPoint]:
        return [p for p in self.quote if p.name != "ours"]


class FitCheckRow(BaseModel):
    """The fitted cost model's prediction of a plan at a micro-batch against its measurement there."""

    micro_batch: int
    plan: str
    fitted: bool  # the fit was made from a profile at this micro-batch
    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_seconds: float
    measured_seconds: float | None = None  # None: the peak alone (above every cap, or above the fit and not quoted)


class ThroughputCurve(BaseModel):
    """What a throughput search found: per cap the answer and the peers; the search's own facts beside."""

    caps: list[CapRow]
    micro_batches: list[int]  # the ladder: the micro-batches measured and searched
    default_micro_batch: int  # the workload's own batch (its frontier is the file's points)
    global_batch: int | None = None
    tokens_per_sample: int | None = None
    gradient_bytes: int = 0  # added to a peak with accumulation (see the module)
    batching: str = ""  # how the workload's micro-batch was changed
    profiled_batches: list[int] = Field(default_factory=list)  # the profiles the per-unit fit was made from
    fit_checks: list[FitCheckRow] = Field(default_factory=list)
    frontiers: dict[int, list[ThroughputPoint]] = Field(default_factory=dict)  # measured frontier per micro-batch
    quote_rounds: int = 0  # rounds in which the quote measured every configuration again
    evaluators: int = 1  # Evaluators that measured at micro-batches side by side (each one measurement at a time)
    not_fitting: list[str] = Field(default_factory=list)  # configurations that ran out of memory, in words

    def answers(self) -> list[ThroughputPoint]:
        """Every cap's quoted answer, lowest cap first (caps nothing fits left out)."""
        return [r.answer for r in sorted(self.caps, key=lambda r: r.cap_bytes) if r.answer is not None]

    def best_within(self, cap_bytes: int) -> ThroughputPoint | None:
        """The quoted answer with the most samples per second whose counted peak fits ``cap_bytes``."""
        fits = [a for a in self.answers() if a.counted_peak_bytes <= cap_bytes]
        return max(fits, key=lambda a: a.samples_per_second) if fits else None

    def lowest_peak(self) -> ThroughputPoint | None:
        answers = self.answers()
        return min(answers, key=lambda a: a.counted_peak_bytes) if answers else None


def mib(nbytes: float) -> str:
    return f"{nbytes / MIB:.1f} MiB"

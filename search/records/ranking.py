"""How a search ranks a measured plan's step time against its references (all keep), in one place.

Plans measured minutes apart are compared as if measured side by side: each measurement is taken
relative to the reference measurements nearest to it on the same Evaluator (``Ranking``), a plan
is never ranked faster than the baseline (``no_faster_than``), and a plan measured in the deciding
passes at the end of a search is ranked on those measurements alone. Why each rule holds, with the
runs that showed it: ``docs/measurement.md``.
"""

from __future__ import annotations

from typing import Mapping

from env.data.measured import MeasuredPlan, median_seconds


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
    began; ``search.engine.driver.Driver.remeasure_frontier``), a plan measured in those passes is ranked
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

"""How a search ranks a measured plan's step time, in one place: the drift policy.

- References: each Evaluator measures the reference plan (all keep) again when its last reference
  is older than ``reference_every`` seconds and at least ``REFERENCE_MIN_PLANS`` plans were measured
  since (``reference_due``), and labels each sample with the pooled median of its last
  ``REFERENCE_WINDOW`` references (``pooled_reference``): what it knows when it measures.
- Pairing: the search takes each measurement relative to the ``NEAREST_REFERENCES`` reference
  measurements of its Evaluator nearest to it, on both sides (``Ranking``; ``paired`` where the ids
  do not place it), in the baseline's median seconds, so plans measured minutes apart compare as if
  side by side.
- Floor: no plan ranks faster than the baseline (``no_faster_than``).
- Deciding passes: from the place where they began (``decided_from``), a plan measured in them is
  ranked on those measurements alone (``Ranking.decided``).
- Confirming passes: from the place where they began (``confirmed_from``), after the deciding
  passes, a frontier plan measured in them is ranked and reported on those measurements alone:
  measurements that chose a plan for the frontier are its luckiest, and are not the time it is shown at.
- Noise: a run's timing noise (``timing_noise``) is the margin within which a plan off the frontier
  still contends for it.

Why each rule holds, with the runs that showed it: see docs/measurement.md#ranking-and-drift-why.
"""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence

from env.cost.correction import TIME_NOISE
from env.data.measured import MeasuredPlan, median_seconds

REFERENCE_MIN_PLANS = 4  # at most one reference measurement per this many plans: <= 1/5 of the time
REFERENCE_WINDOW = 3  # a sample's label: the median of the samples of this many last reference measurements
NEAREST_REFERENCES = 3  # a measurement is ranked against this many reference measurements nearest to it


def reference_due(age_seconds: float | None, plans_since: int, every: float) -> bool:
    """Whether an Evaluator measures its reference again before the next plan: references on
    (``every`` > 0), and none yet (``age_seconds`` None), or the last one older than ``every`` with
    ``REFERENCE_MIN_PLANS`` plans measured since."""
    if not every:
        return False
    return age_seconds is None or (age_seconds > every and plans_since >= REFERENCE_MIN_PLANS)


def pooled_reference(window: Sequence[Sequence[float]]) -> float:
    """The label of the samples measured next: the median of the last references' samples pooled.
    One reference is a median of a few steps; pooled over a few it errs less and still follows a
    drift over minutes."""
    return median_seconds([x for samples in window for x in samples])


def timing_noise(records: Sequence[MeasuredPlan]) -> float:
    """A run's timing noise: the median spread of its plans' step times over their medians, at
    least ``TIME_NOISE``."""
    spreads = [r.spread_seconds / r.step_seconds for r in records if len(r.step_seconds_samples) > 1]
    return max(TIME_NOISE, statistics.median(spreads)) if spreads else TIME_NOISE


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
    baseline's) if it was below: recomputing, selectively recomputing or offloading a unit adds
    work to the step, so a plan measured faster than keeping everything measured noise, and the
    hair keeps both it and the baseline on the frontier (see docs/measurement.md#ranking-and-drift-why)."""
    if record.oom or not record.step_seconds_samples or record.step_seconds > seconds:
        return record
    f = seconds * (1 + 1e-9) / record.step_seconds
    return record.model_copy(update={"step_seconds_samples": [s * f for s in record.step_seconds_samples]})


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
    order, those after it included once they exist (the baseline's record holds them all), since
    the label the Evaluator gave it knows only the references before it. Records whose ids do not
    place them (older stores) are ``paired`` as labelled.

    With ``decided_from`` (per Evaluator, the place in its order where a search's deciding passes
    began; ``search.engine.phases.deciding``), a plan measured in those passes is ranked on those
    measurements alone, taken side by side with the other plans that decide the frontier, since
    pairing removes a drift that moves every plan alike but not one that changes the plans' ratios
    to each other; an Evaluator the mapping does not name started after they began. With
    ``confirmed_from`` (where the confirming passes began, after the deciding ones), a plan measured
    in those is ranked on them alone, in the same way. The baseline keeps all its measurements: they
    are the references. See docs/measurement.md#ranking-and-drift-why."""

    def __init__(self, baseline: MeasuredPlan | None, decided_from: Mapping[str, int] | None = None,
                 confirmed_from: Mapping[str, int] | None = None) -> None:
        ran = baseline is not None and not baseline.oom
        self.baseline_digest = baseline.digest if ran else None
        # the windows, latest first: a record is cut to its measurements in the latest one it has any in
        self.windows = [dict(w) for w in (confirmed_from, decided_from) if w is not None]
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
        """The record cut to its measurements of the latest passes it was measured in (confirming, else
        deciding), when it has any (and is not the baseline); else as it is."""
        parts = measurements_of(record) if self.windows else None
        if not parts or record.digest == self.baseline_digest:
            return record
        for since in self.windows:
            late = [k for k, (who, n, _) in enumerate(parts) if n >= since.get(who, 0)]
            if late:
                break
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

    def __call__(self, record: MeasuredPlan, floor: bool = True) -> MeasuredPlan:
        """The record as ranked; ``floor=False``: not held to the baseline's time (a measurement of another
        step than the baseline's, as a plan's with the whole model compiled against the regional baseline)."""
        out = self._paired(self.decided(record))
        if not floor or self.floor is None or record.digest == self.baseline_digest:
            return out
        return no_faster_than(out, self.floor)


def decided_from(records: Sequence[MeasuredPlan]) -> dict[str, int]:
    """Where passes that begin now begin: per Evaluator, the place in its order after the last of its
    measurements in ``records`` (``Ranking``'s ``decided_from`` and ``confirmed_from``)."""
    since: dict[str, int] = {}
    for m in records:
        for who, n, _ in measurements_of(m) or []:
            since[who] = max(since.get(who, 0), n + 1)
    return since

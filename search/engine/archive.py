"""ParetoArchive: what a search knows about plans, and which of them form the frontier.

Two kinds of knowledge, kept apart:
- ``measured``: plan digest -> its ``MeasuredPlan`` (the truth; only these form the frontier);
- ``predicted``: plan indices -> predicted (peak_bytes, step_seconds) of plans proposed by the
  agents (and the exact solver with warm start): the pool measurement candidates come from.
Either can be narrowed to the plans some kinds of proposer proposed (``Kinds``: the agents, the
exact solver, ...; ``env.data.types.SourceKind``).
Frontier and hypervolume use medians of measured step times on baseline-normalised axes
(``search.records.pareto``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import numpy as np

from env.data.measured import MeasuredPlan
from env.data.types import Indices, PlanSource, SourceKind
from search.records.pareto import fastest_within, hypervolume, nondominated, normalise

T = TypeVar("T")
Kinds = tuple[SourceKind, ...] | None  # the proposers whose plans count; None: everyone's


def spread_picks(items: Sequence[T], k: int) -> list[T]:
    """At most k items, evenly spaced over the sequence (its ends included)."""
    if k <= 0 or not items:
        return []
    if len(items) <= k:
        return list(items)
    picks = np.linspace(0, len(items) - 1, k).round().astype(int)
    return [items[i] for i in sorted(set(picks))]


def frontier_of(records: Sequence[MeasuredPlan]) -> list[MeasuredPlan]:
    """The non-dominated records that ran (no OOM), by peak bytes ascending."""
    rows = [r for r in records if not r.oom]
    if not rows:
        return []
    mask = nondominated([(r.peak_bytes, r.step_seconds) for r in rows])
    return sorted([r for r, keep in zip(rows, mask) if keep], key=lambda r: r.peak_bytes)


def hypervolume_of(records: Sequence[MeasuredPlan], baseline: MeasuredPlan | None) -> float:
    """Hypervolume of the records on axes relative to ``baseline`` (``search.records.pareto``)."""
    rows = [r for r in records if not r.oom]
    if baseline is None or not rows:
        return 0.0
    pts = [(r.peak_bytes, r.step_seconds) for r in rows]
    return hypervolume(normalise(pts, baseline.peak_bytes, baseline.step_seconds))


@dataclass
class ParetoArchive:
    measured: dict[str, MeasuredPlan] = field(default_factory=dict)
    predicted: dict[Indices, tuple[int, float]] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # digests the correctness gate failed: on no frontier

    def add(self, record: MeasuredPlan) -> None:
        """A plan's whole record (every measurement merged, every proposer)."""
        self.measured[record.digest] = record

    def propose(self, idx: Indices, digest: str, source: PlanSource, peak_bytes: int, step_seconds: float,
                candidate: bool = True) -> None:
        """A proposal; ``candidate`` plans (agents', warm start) join the measurement pool."""
        if digest in self.measured:
            self.measured[digest] = self.measured[digest].proposed_by(source)
        if candidate:
            self.predicted[idx] = (peak_bytes, step_seconds)

    def points(self, kinds: Kinds = None) -> list[MeasuredPlan]:
        """Measured plans that ran (no OOM) and that the correctness gate did not refuse; with ``kinds``, only those a proposer of one of them
        proposed (an agent that proposes a plan a rule also gives still found it)."""
        rows = [r for r in self.measured.values() if not r.oom and r.digest not in self.refused]
        if kinds is not None:
            rows = [r for r in rows if any(PlanSource(p).kind in kinds for p in r.sources)]
        return rows

    def frontier(self, kinds: Kinds = None) -> list[MeasuredPlan]:
        """Non-dominated measured plans, by peak bytes ascending."""
        return frontier_of(self.points(kinds))

    def contenders(self, margin: float, kinds: Kinds = None) -> list[MeasuredPlan]:
        """Measured plans (of ``kinds``' proposers) off their frontier by less than ``margin``: their median
        step time within that share of the frontier's fastest at no more memory. Timing noise put
        them there as easily as the frontier's plans on it; nearest first, at most as many as the
        frontier has."""
        front = self.frontier(kinds)
        on = {r.digest for r in front}
        peaks, seconds = [f.peak_bytes for f in front], [f.step_seconds for f in front]
        near = []
        for r in self.points(kinds):
            i = fastest_within(peaks, seconds, r.peak_bytes)
            if r.digest not in on and i is not None and r.step_seconds < seconds[i] * (1 + margin):
                near.append((r.step_seconds / seconds[i], r))
        return [r for _, r in sorted(near, key=lambda x: x[0])][:len(front)]

    def rivals(self, kinds: tuple[SourceKind, ...]) -> list[MeasuredPlan]:
        """Plans of the whole measured frontier that the frontier of ``kinds``' plans does not
        reach: none of those plans at no more memory is as fast (a rule, a warm-start plan), by peak."""
        return [r for _, r in self._leads(kinds)]

    def _leads(self, kinds: tuple[SourceKind, ...]) -> list[tuple[float, MeasuredPlan]]:
        """``rivals`` with how far each is ahead: the ``kinds``' fastest time at its memory over
        its own (inf where none fits), by peak."""
        own = self.frontier(kinds)
        peaks, seconds = [r.peak_bytes for r in own], [r.step_seconds for r in own]
        out = []
        for r in self.frontier():
            i = fastest_within(peaks, seconds, r.peak_bytes)
            if i is None or seconds[i] > r.step_seconds:
                out.append((float("inf") if i is None else seconds[i] / r.step_seconds, r))
        return out

    def candidates(self, limit: int, digest_of: Callable[[Indices], str],
                   predict: Callable[[Indices], tuple[int, float]] | None = None,
                   baseline: MeasuredPlan | None = None, known_kinds: Kinds = None,
                   margin: float = 0.0) -> list[Indices]:
        """Unmeasured plans of the pool worth measuring next. ``predict`` (e.g.
        ``env.cost.correction.MeasuredCorrection.predict``) ranks the pool instead of the predictions
        recorded at proposal time.

        With ``known_kinds``, first the answers to their rivals (``rivals``): for each, the fastest
        plan of the pool predicted to fit its peak, if predicted within ``margin`` (the run's timing
        noise) of its time; at most half the limit, the rivals furthest ahead of the agents'
        frontier first, since ranked by hypervolume alone such a plan adds only the sliver between
        its neighbours on the agents' frontier and may never be measured (see
        docs/measurement.md#ranking-and-drift-why). Then, with the ``baseline`` measured: greedily, the
        plan whose predicted point adds most
        hypervolume to the measured frontier of ``known_kinds``' plans (all plans: None) and the
        plans picked before it, so measurements go where that frontier has gaps rather than where
        proposals are dense. Then, once no predicted
        point adds any, as without a baseline: the predicted fronts of the pool, best front first,
        each spread over memory. The first front alone leaves measurements unspent when the cost
        model's time error hides plans (near-baseline plans differ by less than it), so later
        fronts fill up."""
        pool = [(idx, predict(idx) if predict else v) for idx, v in self.predicted.items()
                if digest_of(idx) not in self.measured]
        out: list[Indices] = []
        answers: list[tuple[int, float]] = []  # the predicted points of the rivals' answers
        if known_kinds is not None:
            for _, rival in sorted(self._leads(known_kinds), key=lambda x: x[0], reverse=True):
                if len(out) >= (limit + 1) // 2:
                    break
                fits = [k for k, (_, (peak, secs)) in enumerate(pool)
                        if peak <= rival.peak_bytes and secs <= rival.step_seconds * (1 + margin)]
                if not fits:
                    continue
                best = min(fits, key=lambda k: pool[k][1][::-1])
                out.append(pool[best][0])
                answers.append(pool.pop(best)[1])
        if baseline is not None and pool and len(out) < limit:
            base = (baseline.peak_bytes, baseline.step_seconds)
            known = list(normalise([(r.peak_bytes, r.step_seconds) for r in self.frontier(known_kinds)] + answers,
                                   *base))
            while pool and len(out) < limit:
                now = hypervolume(known)
                # a point another pool point dominates never adds more than that one: the pool's front suffices
                front = np.flatnonzero(nondominated([v for _, v in pool]))
                pts = {int(i): normalise(pool[i][1], *base)[0] for i in front}
                gains = {i: hypervolume(known + [q]) - now for i, q in pts.items()}
                best = max(gains, key=gains.__getitem__)
                if gains[best] <= 1e-12:
                    break
                out.append(pool[best][0])
                known.append(pts[best])
                del pool[best]
        while pool and len(out) < limit:
            mask = nondominated([v for _, v in pool])
            front = sorted((item for item, keep in zip(pool, mask) if keep), key=lambda item: item[1][0])
            out += spread_picks([idx for idx, _ in front], limit - len(out))
            pool = [item for item, keep in zip(pool, mask) if not keep]
        return out

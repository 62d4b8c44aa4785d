"""The search's ledger: every plan proposed, predicted, measured and remeasured, in one place.

It owns the run's ``ParetoArchive`` (what the driver reasons with), the ``RunStore`` (what
survives the process) and the ``PlanCodec`` (plan forms), and keeps them in step: a proposal
goes to both, a measurement is merged by the store (``MeasuredPlan.merged``, never twice) and
the archive gets the merged record back. The driver decides what to do; the ledger only
records and answers; the peers' records are kept by ``search.engine.peer_records.PeerRecords``, and what was
measured at other micro-batches (a throughput search, the price page's batch scaling) by its ``batches``
(``search.engine.batch_book.BatchBook``), rows of the same store table.

The store keeps every sample as measured; the archive keeps each record as the search ranks it
(``search.records.ranking.Ranking``): paired with the reference plan measured beside it, in the baseline's
median seconds, so that the frontier, the candidates, the correction and the report compare
plans as if measured side by side, and no plan ranked faster than the baseline.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

from env.cost.correction import MeasuredCorrection
from env.cost.cost_model import CostModel
from env.data.codec import PlanCodec
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan import Action
from env.data.plan_check import PlanCheck
from env.data.types import Indices, PlanSource, SourceKind
from search.engine.archive import Kinds, ParetoArchive, hypervolume_of
from search.engine.batch_book import BatchBook
from search.engine.peer_records import PeerRecords
from search.records import meta
from search.records.ranking import Ranking, decided_from
from search.records.store import RunStore


@dataclass(frozen=True)
class SearchSetup:
    """What a search knows before its loop starts: the profile and what is made from it."""

    profile: ModelProfile
    cost_model: CostModel
    codec: PlanCodec

    @classmethod
    def from_profile(cls, profile: ModelProfile) -> "SearchSetup":
        return cls(profile, CostModel(profile), PlanCodec(profile.units, profile.actions, profile.fingerprint))


@dataclass
class Ledger(PeerRecords):
    setup: SearchSetup
    store: RunStore
    archive: ParetoArchive = field(default_factory=ParetoArchive)
    events: list[str] = field(default_factory=list)  # what the report must mention (deaths, OOMs)
    n_new_measurements: int = 0
    # measurements may arrive on another thread (agents training meanwhile): one writer at a time
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def __post_init__(self) -> None:
        self.baseline_digest: str | None = self.store.read(meta.BASELINE_DIGEST)
        self.batches = BatchBook(self.store)  # the rows at other micro-batches
        self.events[:0] = self.store.read(meta.EVENTS)  # a resumed run's
        self._rank = Ranking(None)  # from the baseline as the store has it, once measured
        self._condemned: set[str] = set()  # units a failed correctness check named (``record_check``)

    @property
    def scale(self) -> float | None:
        """The baseline's median: the seconds paired times are given in."""
        return self._rank.scale

    @property
    def codec(self) -> PlanCodec:
        return self.setup.codec

    def load_store(self) -> list[MeasuredPlan]:
        """A resumed run: the store's measured plans join the archive (they are never measured again)."""
        known = self.store.measured()
        failed = [c for c in self.store.read(meta.GATE).values() if not c.passed]
        self.archive.refused = {c.digest for c in failed}
        self._condemned = {u for c in failed for u in c.culprits}
        self._rescale(known)
        return known

    def record_check(self, check: PlanCheck) -> None:
        """The correctness gate's verdict on a plan (store meta ``gate``); a plan that failed leaves every frontier."""
        with self.lock:
            checks = self.store.read(meta.GATE)
            checks[check.digest] = check
            self.store.write(meta.GATE, checks)
            if not check.passed:
                self.archive.refused.add(check.digest)
                self._condemned |= set(check.culprits)

    def condemned(self) -> set[str]:
        """The units a failed check named: every plan proposed after keeps them."""
        return set(self._condemned)

    def recomputes_condemned(self, idx: Sequence[int]) -> bool:
        """Whether the plan (indices) does anything but keep a unit the correctness gate condemned."""
        return bool(self._condemned) and any(u in self._condemned and a != Action.KEEP.value
                                             for u, a in zip(self.codec.units, self.codec.names(idx)))

    def set_baseline(self, digest: str) -> None:
        """The all-keep plan's digest: the reference every plan's time is paired with."""
        self.store.write(meta.BASELINE_DIGEST, digest)
        with self.lock:
            self.baseline_digest = digest
            self._rescale()

    def decide_from_here(self, key: meta.MetaKey[dict[str, int] | None] = meta.DECIDED_FROM) -> dict[str, int]:
        """From now on, a plan measured again is ranked on its measurements from here alone
        (``search.records.ranking.decided_from`` of what the store has, into store meta ``key``:
        ``decided_from``, or ``confirmed_from`` for the confirming passes); returns the mapping."""
        with self.lock:
            since = decided_from(self.store.measured())
            self.store.write(key, since)
            self._rescale()
            return since

    def _rescale(self, known: list[MeasuredPlan] | None = None) -> None:
        """The baseline measured again (or a store resumed): every measured record, as the store has
        it (``known``, or read once), ranked anew into the archive."""
        known = self.store.measured() if known is None else known
        self._rank = self.store.ranking()
        for m in known:
            self.archive.add(self._rank(m))

    def propose(self, idx: Sequence[int], source: PlanSource, candidate: bool | None = None) -> str:
        """Record a plan someone proposed, with its cost-model prediction; returns its digest.
        Agents' and warm-start plans become measurement candidates; rules' do not."""
        idx = tuple(int(a) for a in idx)
        pred = self.setup.cost_model.predict(list(idx))
        digest = self.codec.digest(idx)
        is_candidate = PlanSource(source).kind is not SourceKind.RULE if candidate is None else candidate
        if self.recomputes_condemned(idx):
            is_candidate = False  # recomputes a unit the correctness gate condemned: never measured
        with self.lock:
            self.archive.propose(idx, digest, source, pred.peak_bytes, pred.step_seconds, candidate=is_candidate)
            self.store.propose(digest, list(self.codec.names(idx)), source, pred.peak_bytes, pred.step_seconds)
        return digest

    def record(self, m: MeasuredPlan) -> MeasuredPlan:
        """A measurement into the store and the archive; returns the plan's whole record."""
        with self.lock:
            row = self.store.get(m.digest)
            if row is None:
                self.propose(self.codec.indices(m.actions), PlanSource(m.source))
            before = row.measurement if row is not None else None  # as stored: a ranked record can be cut
            stored = self.store.record(m)
            merged = self._rank(stored)
            self.archive.add(merged)
            if m.digest == self.baseline_digest:
                self._rescale()
                merged = self.archive.measured[m.digest]
            if before is None or len(stored.measurement_ids) > len(before.measurement_ids):
                self.n_new_measurements += 1
                if m.oom:
                    self.note(f"plan {m.digest} ran out of memory: recorded as infeasible")
            return merged

    def note(self, event: str) -> None:
        """An event the report must mention, into the store at once (meta ``events``): each as it happened, two
        alike twice (two plans that read alike killed their Evaluators)."""
        with self.lock:
            self.events.append(event)
            self.store.write(meta.EVENTS, self.events)

    def record_whole_model(self, m: MeasuredPlan) -> MeasuredPlan:
        """A plan's measurement with the whole model compiled (store meta ``whole_model``, by the plan's
        digest): beside the plans, whose records hold their regional measurements."""
        with self.lock:
            done = self.store.read(meta.WHOLE_MODEL)
            merged = done[m.digest].merged(m) if m.digest in done else m
            done[m.digest] = merged
            self.store.write(meta.WHOLE_MODEL, done)
        return merged

    def whole_model(self) -> list[MeasuredPlan]:
        """The plans measured with the whole model compiled, ranked as the plans are but not held to the
        baseline's time: compiled whole, a plan can be faster than the baseline compiled unit by unit."""
        return [self._rank(m, floor=False) for m in self.store.read(meta.WHOLE_MODEL).values()]

    def proposers(self, idx: Indices) -> list[PlanSource]:
        with self.lock:
            row = self.store.get(self.codec.digest(idx))
        return [PlanSource(p) for p in row.proposers] if row else []

    # -- what is known -------------------------------------------------------------------------
    def points(self, kinds: Kinds = None) -> list[MeasuredPlan]:
        with self.lock:
            return self.archive.points(kinds)

    def frontier(self, kinds: Kinds = None) -> list[MeasuredPlan]:
        with self.lock:
            return self.archive.frontier(kinds)

    def contenders(self, margin: float, kinds: Kinds = None) -> list[MeasuredPlan]:
        with self.lock:
            return self.archive.contenders(margin, kinds)

    def baseline(self) -> MeasuredPlan | None:
        return self.archive.measured.get(self.baseline_digest) if self.baseline_digest else None

    def hv(self, rows: list[MeasuredPlan]) -> float:
        return hypervolume_of(rows, self.baseline())

    def corrected(self) -> MeasuredCorrection:
        """The cost model corrected by every plan measured so far, as the agents' envs see it."""
        c = MeasuredCorrection(self.setup.cost_model)
        for r in self.points():
            c.add(self.codec.indices(r.actions), r.peak_bytes, r.step_seconds)
        return c

    def candidates(self, limit: int, margin: float = 0.0) -> list[Indices]:
        """Unmeasured proposed plans worth measuring next, ranked by the corrected cost model: first
        the agents' answers to the measured plans beyond their frontier (predicted within ``margin``
        of them), then where they add most to the agents' own measured frontier. Not to the whole
        frontier: a rule or a warm-start plan measured there would leave the agents' frontier with a
        gap that none of their plans is ever measured to fill, and their own finds are what the
        search is for."""
        correction = self.corrected()
        with self.lock:
            return self.archive.candidates(limit, self.codec.digest, correction.predict, self.baseline(),
                                           known_kinds=(SourceKind.AGENT,), margin=margin)

    def snapshot(self) -> None:
        with self.lock:
            front = self.frontier()
            self.store.snapshot(len(front), self.hv(front))

"""Measurer: how the search gets plans measured, and every measurement into the ledger.

Plans and peers go to whichever Evaluator is free (``EvaluatorPool``) and each result is recorded the
moment it arrives (``Ledger.record``; at another micro-batch, its ``Ledger.batches``), so the store has it at
once: ``measure`` (a round's candidates), ``side_by_side`` (jobs at any micro-batch measured afresh, for the
passes that decide, ``search.engine.passes``), ``measure_at`` (what the ledger lacks at other micro-batches).
Every Evaluator's journal (all it
measured: the driver's jobs, its reference plan, the agents' own plans in measured mode, what finished
at Ctrl-C) is drained into the ledger after each batch: at least once, and written once, as the store
skips a measurement it has (docs/measurement.md#how-a-measurement-reaches-the-store). With ``overlap`` (GPU
Evaluators, or ``--overlap on``) a round's plans are measured in a thread while the agents train;
else the agents wait, as they would share CPU cores with the measurements.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from env.data.measured import MeasuredPlan
from env.data.types import Indices, PlanSource
from env.measure.peers import Peer
from search.engine.agent_pool import MeasureFn
from search.engine.batch_book import BatchTerms, Job
from search.engine.evaluator_pool import EvaluatorPool
from search.engine.ledger import Ledger
from search.records import meta
from search.records.meta import BatchRecord
from search.records.ranking import paired

PlanJob = tuple[Indices, PlanSource]  # a plan to measure, and who proposed it


class Measurer:
    """``measure`` (or ``measure_meanwhile`` then ``collect``) plans, ``drain`` what else was measured."""

    def __init__(self, ledger: Ledger, pool: EvaluatorPool, overlap: bool) -> None:
        self.ledger, self.pool, self.overlap = ledger, pool, overlap
        self._pending: tuple[threading.Thread, list[MeasuredPlan]] | None = None
        self.batch_terms = BatchTerms()  # how ``measure_at`` measures: a throughput search sets its own

    @property
    def mode(self) -> str:
        """Whether the agents train while the Evaluators measure, in words (store meta ``measurement_mode``)."""
        n = len(self.pool.slots)
        if self.overlap:
            return f"overlapped: agents train while {n} Evaluator(s) measure" + (
                " on GPUs" if self.pool.on_gpus else " (--overlap on)")
        return f"exclusive: agents wait while {n} Evaluator(s) measure, as they would share CPU cores"

    @property
    def evaluators(self) -> int:
        """How many Evaluators measure now (those alive)."""
        return len(self.pool.live)

    def measure(self, plans: Sequence[PlanJob], again: bool = False) -> list[MeasuredPlan]:
        """Measure (plan indices, source) pairs on the Evaluators; each is recorded as it arrives."""
        done = self.pool.measure(self._jobs(plans, again), on_result=self.ledger.record)
        self.drain()  # the reference measurements the Evaluators took before some of these plans
        self._pool_state()
        return done

    def measure_meanwhile(self, plans: Sequence[PlanJob]) -> None:
        """Measure in a thread while the agents train (recorded as they arrive); ``collect`` joins it."""
        arrived: list[MeasuredPlan] = []

        def record(m: MeasuredPlan) -> MeasuredPlan:
            arrived.append(self.ledger.record(m))
            return arrived[-1]

        self._pending = (self.pool.measure_async(self._jobs(plans, False), on_result=record), arrived)

    def collect(self) -> list[MeasuredPlan]:
        """What the measurements started by ``measure_meanwhile`` gave (waits for them)."""
        if self._pending is None:
            return []
        thread, arrived = self._pending
        thread.join()
        self._pending = None
        self.drain()
        self._pool_state()
        return arrived

    def drain(self) -> None:
        """Record the Evaluators' journals: what they measured apart from the driver's jobs (the reference plan,
        ``reference_every``; the agents' own plans, measured mode) and every answer not read before Ctrl-C. The
        answers recorded already come again and write nothing (``RunStore.record``)."""
        for m in self.pool.drain():
            self.ledger.record(m)  # proposes the plan first when it is new to the store

    def on_each(self, names: Sequence[str], source: PlanSource) -> list[MeasuredPlan]:
        """One plan (action names) measured once on every live Evaluator and recorded; returns the
        measurements themselves, one per Evaluator."""
        each = self.pool.on_each(names, source)
        for m in each:
            self.ledger.record(m)
        return each

    def measure_peers(self, peers: Sequence[Peer]) -> None:
        """``env.measure.peers.Peer``s measured as plans are, each kept beside the plans (``Ledger.record_peer``)."""
        self.side_by_side([Job(p) for p in peers])

    def side_by_side(self, jobs: Sequence[Job], record: bool = True) -> list[MeasuredPlan]:
        """Every job (a plan or a peer, at the workload's own batch or at another micro-batch) measured in this
        order, as one queue on whichever Evaluator is free; each recorded as it arrives: at the own batch by the
        ledger (a peer by ``Ledger.record_peer``; always, as the Evaluator's journal holds it), at another
        micro-batch in ``Ledger.batches`` where ``record`` (a quote's measurements are not). A plan at the own batch
        is measured again where the job says ``again``, else the Evaluator's cache may answer; at another
        micro-batch every job is measured afresh, every step timed, by the run's ``batch_terms``. Returns the
        measurements themselves, in the jobs' order: the passes (``search.engine.passes``) rank on them."""
        terms = self.batch_terms
        own = [j for j in jobs if not j.micro_batch]
        for job in own:
            if not isinstance(job.item, Peer):
                self.ledger.propose(self.ledger.codec.indices(job.item), PlanSource(job.source))
        peers = {j.item.digest: j.item for j in own if isinstance(j.item, Peer)}

        def arrived(got: MeasuredPlan | BatchRecord) -> MeasuredPlan:
            if not isinstance(got, MeasuredPlan):  # at another micro-batch
                if record:
                    self.ledger.batches.record(got)
                return got["record"]
            peer = peers.get(got.digest)
            if peer is None:
                self.ledger.record(got)
            else:
                self.ledger.record_peer(peer.name, got, peer.note, peer.model_dump(mode="json"), peer.label)
            return got

        done = self._run(list(jobs), lambda job: None, arrived, terms)
        if own:
            self.drain()
            self._pool_state()
        return done

    # -- at other micro-batches ----------------------------------------------------------------------------------
    def measure_at(self, jobs: Sequence[Job], again: bool = False, timed: bool = True,
                   terms: BatchTerms | None = None) -> list[MeasuredPlan]:
        """Each job's record at its micro-batch (``Ledger.batches``), after measuring those it lacks (all of them,
        once, with ``again``); ``timed=False``: the peaks only, no step timed (where a record holds only a peak that
        fits a cap, a timed measurement adds the times); ``terms``: these instead of the run's ``batch_terms``."""
        t = terms or self.batch_terms
        unique = list({(self.digest_at(j), j.micro_batch): j for j in jobs}.values())
        todo = sorted((j for j in unique if again or self.lacks_at(j, timed, t)), key=lambda j: j.micro_batch)
        stop = (lambda job: -1) if not timed else (lambda job: _ceiling(t, job))  # -1: every peak is above it
        self._run(todo, stop, self.ledger.batches.record, t)
        return [self.known_at(j) for j in jobs]  # type: ignore[misc]

    def digest_at(self, job: Job) -> str:
        return job.item.digest if isinstance(job.item, Peer) else self.ledger.codec.digest(
            self.ledger.codec.indices(job.item))

    def known_at(self, job: Job) -> MeasuredPlan | None:
        return self.ledger.batches.get(job.micro_batch, self.digest_at(job))

    def lacks_at(self, job: Job, timed: bool = True, terms: BatchTerms | None = None) -> bool:
        """Whether ``measure_at`` would measure the job: the ledger lacks it there, or (``timed``) holds only its
        peak and that peak fits a cap, so that its steps are worth timing."""
        known = self.known_at(job)
        if known is None:
            return True
        ceiling = _ceiling(terms or self.batch_terms, job)
        return (timed and not known.oom and not known.step_seconds_samples
                and (ceiling is None or known.peak_bytes <= ceiling))

    def smaller_not_fitting(self, job: Job) -> int | None:
        """The smallest micro-batch below the job's where the ledger holds its plan (or peer) as not fitting, or
        None. ``measure_at`` asks for the smaller sizes first, so that one Evaluator learns this before it tries a
        larger size; on ``tests/data/memory_models.py:killed_above`` each size tried above the limit cost two
        Evaluator deaths and restarts."""
        failed = [b for b, m in self.ledger.batches.of(self.digest_at(job)).items()
                  if m.oom and b < job.micro_batch]
        return min(failed, default=None)

    def _run(self, jobs: list[Job], stop_above: Callable[[Job], int | None], on_result: Callable[[Any], Any],
             terms: BatchTerms) -> list[Any]:
        """Each job measured on whichever Evaluator is free: at the own batch as ``EvaluatorPool.evaluate`` asks;
        at another micro-batch within a deadline grown with it (``terms.base``), or recorded as not fitting without
        a step where it killed ``KILLS_NOT_FITTING`` Evaluators or a smaller micro-batch of it did not fit, no step
        timed above ``stop_above(job)`` bytes. ``on_result`` gets each answer as it arrives (a ``MeasuredPlan``, at
        another micro-batch a ``BatchRecord``), and what it returns is returned, in the jobs' order."""
        def call(handle: Any, job: Job, killed: bool) -> Any:
            if not job.micro_batch:
                return self.pool.evaluate(handle, job, killed)
            known = self.known_at(job)  # its peak is lent on CPU
            not_fitting = killed or self.smaller_not_fitting(job) is not None
            return handle.measure_at.remote(job.item, job.micro_batch, terms.batch_dim, job.source, known,
                                            stop_above(job), not_fitting, terms.eager)

        return self.pool.run_jobs(jobs, call, on_result, lambda job: self.pool.measurement_seconds(job, terms.base))

    def _jobs(self, plans: Sequence[PlanJob], again: bool) -> list[Job]:
        for idx, source in plans:
            self.ledger.propose(idx, source)
        return [Job(tuple(self.ledger.codec.names(idx)), source=source, again=again) for idx, source in plans]

    def _pool_state(self) -> None:
        """The Evaluators, with their deaths and restarts, into the store (their events went there as they
        happened: ``Driver``)."""
        self.ledger.store.write(meta.EVALUATORS, self.pool.describe())


def agents_measure(pool: EvaluatorPool, action_names: list[str],
                   scale: float | None) -> Callable[[PlanSource], MeasureFn]:
    """Measured reward: for each agent, the function it calls to measure a plan, on one Evaluator
    (agent ``i`` on live Evaluator ``i`` modulo their number)."""
    return lambda agent: _remote_measure(pool.live[PlanSource(agent).index % len(pool.live)].handle,
                                         action_names, PlanSource(agent), scale)


def _remote_measure(evaluator: Any, action_names: list[str], source: PlanSource,
                    scale: float | None) -> MeasureFn:
    """The function agent ``source`` calls to measure a plan (measured reward): through the Evaluator,
    its time paired with the Evaluator's reference in the profiled baseline's seconds (``scale``)."""
    from search.engine import ray_session

    def measure(idx: list[int]) -> tuple[int, float]:
        m: MeasuredPlan = ray_session.get(evaluator.evaluate.remote([action_names[i] for i in idx], source))
        return m.peak_bytes, paired(m, scale).step_seconds

    return measure


def _ceiling(terms: BatchTerms, job: Job) -> int | None:
    """The peak bytes above which ``terms`` time no step of ``job`` (None: every step is timed)."""
    return terms.ceiling(job.micro_batch) if terms.ceiling else None

"""What a throughput search measured at each micro-batch, and how it gets measurements there.

``BatchBook`` keeps every plan and peer measured at a micro-batch, merged per (micro-batch, digest),
each one row of the run store's ``evaluations`` at its micro-batch, written as it arrives (a repeat updates
that row), so a resumed run measures nothing again. The run's own records (``Ledger``) are the rows at the
workload's own batch (micro-batch 0) of the same table.

``BatchMeasurer`` measures ``BatchJob``s on whichever Evaluator is free (``EvaluatorPool.run_jobs``):
``measure`` skips what the book has (unless ``again``) and records each result, timing no step where the
peak is above every cap (``ceiling``), or none at all where only peaks are asked for; ``fresh`` returns new
measurements without recording them, for a quote that must not reuse what selected its plans. A plan or peer
that did not fit at a micro-batch (an allocation failed, or its measurement killed Evaluators) is recorded as
not fitting at every larger one without a step (``smaller_not_fitting``): a larger micro-batch of the same
configuration holds at least its activations, and a step there would be one more kill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from env.data.measured import MeasuredPlan
from env.measure.peers import Peer
from search.engine.evaluator_pool import EvaluatorPool
from search.records.meta import BatchRecord
from search.records.store import RunStore


class BatchBook:
    """Measurements per (micro-batch, digest), every repeat merged; each one row of the run store."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.records: dict[tuple[int, str], MeasuredPlan] = {
            (b, m.digest): m for b, m in store.measured_at_micro_batches()}

    def get(self, micro_batch: int, digest: str) -> MeasuredPlan | None:
        return self.records.get((micro_batch, digest))

    def record(self, got: BatchRecord) -> MeasuredPlan:
        """A measurement into the book and its row of the store (merged there with the earlier ones of its plan at
        its micro-batch, ``RunStore.record``)."""
        b, m = got["micro_batch"], got["record"]
        if b < 1:
            raise ValueError(f"a throughput measurement's micro-batch must be 1 or more, not {b}: 0 names the "
                             "workload's own batch in the run store; record it through the Ledger")
        self.records[(b, m.digest)] = self.store.record(m, micro_batch=b)
        return self.records[(b, m.digest)]

    def credit(self, sources: dict[tuple[int, str], str]) -> None:
        """Each ``source`` named among those who proposed the plan the book holds at its (micro-batch, digest),
        (it may have been measured there before under another name, so that the configuration's row would name
        neither proposer); only the rows that gain a proposer are written."""
        for (b, digest), source in sources.items():
            m = self.records[(b, digest)]
            if source and source not in m.sources:
                self.records[(b, digest)] = m.model_copy(update={"sources": [*m.sources, source]})
                self.store.propose(digest, m.actions, source, micro_batch=b)

    def at(self, micro_batch: int) -> list[MeasuredPlan]:
        return [r for (b, _), r in self.records.items() if b == micro_batch]

    def of(self, digest: str) -> dict[int, MeasuredPlan]:
        """One plan's or peer's measurements, by micro-batch."""
        return {b: r for (b, d), r in sorted(self.records.items()) if d == digest}


@dataclass(frozen=True, eq=False)
class BatchJob:
    """A plan (action names per unit) or a peer to measure at a micro-batch, and who proposed it."""

    item: tuple[str, ...] | Peer
    micro_batch: int
    source: str = ""


class BatchMeasurer:
    """Jobs measured through the pool at their micro-batches; ``digest_of(action names)`` is the run's codec's;
    ``ceiling(micro_batch)``: the peak bytes above which a configuration fits no cap there, so that ``measure``
    times none of its steps (``env.measure.measurement.measure_prepared``: ``stop_above``)."""

    def __init__(self, pool: EvaluatorPool, book: BatchBook, batch_dim: int | None,
                 digest_of: Callable[[tuple[str, ...]], str], ceiling: Callable[[int], int] | None = None,
                 base: int = 0) -> None:
        self.pool, self.book, self.batch_dim, self.digest_of, self.ceiling = pool, book, batch_dim, digest_of, ceiling
        self.base = base  # the workload's own micro-batch: a measurement's deadline grows with the micro-batch

    def digest(self, job: BatchJob) -> str:
        return job.item.digest if isinstance(job.item, Peer) else self.digest_of(job.item)

    def known(self, job: BatchJob) -> MeasuredPlan | None:
        return self.book.get(job.micro_batch, self.digest(job))

    def measure(self, jobs: Sequence[BatchJob], again: bool = False, timed: bool = True) -> list[MeasuredPlan]:
        """Each job's record in the book, after measuring those it lacks (all of them, once, with ``again``);
        ``timed=False``: the peaks only, no step timed (where a record holds only a peak that fits a cap, a timed
        measurement adds the times)."""
        unique = list({(self.digest(j), j.micro_batch): j for j in jobs}.values())
        todo = sorted((j for j in unique if again or self.lacks(j, timed)), key=lambda j: j.micro_batch)
        self.pool.run_jobs(todo, lambda handle, job, killed: self._call(handle, job, self._stop_above(job, timed), killed),
                           self.book.record, self._deadline)
        return [self.known(j) for j in jobs]  # type: ignore[misc]

    def lacks(self, job: BatchJob, timed: bool = True) -> bool:
        """Whether ``measure`` would measure the job: the book lacks it, or (``timed``) holds only its peak and
        that peak fits a cap, so that its steps are worth timing."""
        known = self.known(job)
        if known is None:
            return True
        return (timed and not known.oom and not known.step_seconds_samples
                and (self.ceiling is None or known.peak_bytes <= self.ceiling(job.micro_batch)))

    def fresh(self, jobs: Sequence[BatchJob]) -> list[MeasuredPlan]:
        """A new measurement of each job, in the jobs' order, not recorded in the book."""
        return self.pool.run_jobs(list(jobs), lambda handle, job, killed: self._call(handle, job, None, killed),
                                  lambda got: got["record"], self._deadline)

    def _deadline(self, job: BatchJob) -> float:
        return self.pool.measurement_seconds(job, self.base)

    def _stop_above(self, job: BatchJob, timed: bool) -> int | None:
        if not timed:
            return -1  # every peak is above it
        return self.ceiling(job.micro_batch) if self.ceiling else None

    def smaller_not_fitting(self, job: BatchJob) -> int | None:
        """The smallest micro-batch below the job's where the book holds its plan (or peer) as not fitting, or
        None. ``measure`` asks for the smaller sizes first, so that one Evaluator learns this before it tries a
        larger size; on ``tests/data/memory_models.py:killed_above`` each size tried above the limit cost two
        Evaluator deaths and restarts."""
        failed = [b for b, m in self.book.of(self.digest(job)).items() if m.oom and b < job.micro_batch]
        return min(failed, default=None)

    def _call(self, handle: Any, job: BatchJob, stop_above: int | None, not_fitting: bool) -> Any:
        """The job measured by the Evaluator ``handle``, or recorded as not fitting without a step: where it killed
        ``KILLS_NOT_FITTING`` Evaluators (``not_fitting``) or a smaller micro-batch of it did not fit."""
        known = self.known(job)  # its peak is lent on CPU
        not_fitting = not_fitting or self.smaller_not_fitting(job) is not None
        return handle.measure_at.remote(job.item, job.micro_batch, self.batch_dim, job.source, known, stop_above,
                                        not_fitting)

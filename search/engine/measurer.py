"""Measurer: how the search gets plans measured, and every measurement into the ledger.

Plans go to whichever Evaluator is free (``EvaluatorPool``) and each result is recorded the
moment it arrives (``Ledger.record``), so the store has it at once. Every Evaluator's journal (all it
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
from search.engine.agent_pool import MeasureFn
from search.engine.evaluator_pool import EvaluatorPool, Job
from search.engine.ledger import Ledger
from search.records import meta
from search.records.ranking import paired

PlanJob = tuple[Indices, PlanSource]  # a plan to measure, and who proposed it


class Measurer:
    """``measure`` (or ``measure_meanwhile`` then ``collect``) plans, ``drain`` what else was measured."""

    def __init__(self, ledger: Ledger, pool: EvaluatorPool, overlap: bool) -> None:
        self.ledger, self.pool, self.overlap = ledger, pool, overlap
        self._pending: tuple[threading.Thread, list[MeasuredPlan]] | None = None

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

    def measure_peers(self, peers: Sequence[Any]) -> None:
        """``env.measure.peers.Peer``s measured as plans are, each kept beside the plans (``Ledger.record_peer``)."""
        self.side_by_side(list(peers))

    def side_by_side(self, items: Sequence[PlanJob | Any], again: bool = False) -> None:
        """Plans (indices, source) and ``env.measure.peers.Peer``s measured in this order, on whichever
        Evaluator is free, as one queue (peers and the plans they are ranked against, side by side); each
        recorded as it arrives (a peer by ``Ledger.record_peer``). ``again``: plans measured before are
        measured once more."""
        peers = {p.digest: p for p in items if not isinstance(p, tuple)}
        plans = [p for p in items if isinstance(p, tuple)]
        jobs = iter(self._jobs(plans, again))
        queue = [p if not isinstance(p, tuple) else next(jobs) for p in items]

        def call(handle: Any, item: Any, killed: bool) -> Any:
            if isinstance(item, tuple):
                return handle.evaluate.remote(list(item[0]), item[1], item[2], not_fitting=killed)
            return handle.evaluate_peer.remote(item, killed)

        def record(m: MeasuredPlan) -> MeasuredPlan:
            peer = peers.get(m.digest)
            if peer is None:
                return self.ledger.record(m)
            return self.ledger.record_peer(peer.name, m, peer.note, peer.model_dump(mode="json"), peer.label)

        self.pool.run_jobs(queue, call, record)
        self.drain()
        self._pool_state()

    def _jobs(self, plans: Sequence[PlanJob], again: bool) -> list[Job]:
        for idx, source in plans:
            self.ledger.propose(idx, source)
        return [(self.ledger.codec.names(idx), source, again) for idx, source in plans]

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

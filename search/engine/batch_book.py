"""What a run measured at micro-batches other than the workload's own, and what it asks the Evaluators to measure.

``BatchBook`` keeps every plan and peer measured at a micro-batch, merged per (micro-batch, digest),
each one row of the run store's ``evaluations`` at its micro-batch, written as it arrives (a repeat updates
that row), so a resumed run measures nothing again. It is the ``Ledger``'s (``Ledger.batches``): the rows at
the workload's own batch (micro-batch 0) of the same table are the ledger's records. A ``Job`` is a plan or
peer to measure at a micro-batch, the one kind of job the Evaluator pool runs (``search.engine.measurer.Measurer``);
``BatchTerms`` say how a run measures at another micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from env.data.measured import MeasuredPlan
from search.records.meta import BatchRecord
from search.records.store import RunStore

if TYPE_CHECKING:  # the ledger reads the book torch-free (tests/test_lint.py)
    from env.measure.peers import Peer


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
            raise ValueError(f"a measurement at another micro-batch (a throughput search's, batch scaling's): its "
                             f"micro-batch must be 1 or more, not {b}: 0 names the workload's own batch in the run "
                             "store; record it through the Ledger")
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
class Job:
    """What the Evaluator pool is asked to measure: a plan (action names per unit) or a peer, at a micro-batch (0:
    the workload's own, the search's frontier), who proposed it, and at the own batch whether to measure it
    ``again`` where the Evaluator has it already (else its cache answers)."""

    item: tuple[str, ...] | Peer
    micro_batch: int = 0
    source: str = ""
    again: bool = False


@dataclass(frozen=True)
class BatchTerms:
    """How a run measures at micro-batches: the inputs' batch dimension (``batch_dim``, None where the Evaluator
    finds it), ``ceiling(micro_batch)`` the peak bytes above which a configuration fits no cap there, so that no
    step of it is timed (``env.measure.measurement.measure_prepared``: ``stop_above``), the workload's own
    micro-batch (``base``: a measurement's deadline grows with the micro-batch; 0: as at the own batch), and
    ``eager``: uncompiled whatever the run compiles. A throughput search sets its own (``Measurer.batch_terms``);
    the price page's batch scaling measures eager steps with no cap."""

    batch_dim: int | None = None
    ceiling: Callable[[int], int] | None = None
    base: int = 0
    eager: bool = False

"""Side-by-side passes: the one way a run decides between configurations it has measured.

Every choice between measured configurations (plans and peers, each at a micro-batch: a ``Job``) is made on
measurements taken for it, side by side: the search's deciding passes, confirming passes and verdict rounds
(``search.engine.phases.deciding``), and a throughput search's deciding rounds, run-off and quote
(``search.engine.phases.throughput``, ``search.engine.throughput.quote``). ``Passes`` runs them all:

- a pass measures, once more each, the configurations that still lack measurements in the passes
  (``until(todo_of)``: ``todo_of(done)`` names them, by the keys measured so far);
- as one queue on whichever Evaluator is free (``Measurer.side_by_side``), each measurement recorded as it
  arrives, so that a Ctrl-C loses only those in flight;
- one pass in the order given and the next reversed, so that no configuration is always measured last while the
  machine's speed moves;
- with ``stretch``, ``between()`` (a reference on every Evaluator) after every ``stretch`` configurations, counted
  on from one pass into the next;
- the configurations are ranked on the passes' measurements alone. ``got`` merges each one's measurements from
  these passes: a throughput search ranks samples per second on them. At the workload's own batch the search
  ranks them paired with the references beside them (``search.records.ranking.Ranking``, from the place the
  passes began, ``Ledger.decide_from_here``), as a reference is measured at that batch only.

Why side by side, and why on those measurements alone: docs/measurement.md ("Deciding passes", "Ranking and
drift: why").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, Sequence, TypeVar

from env.data.measured import MeasuredPlan
from env.data.rounds import serpentine
from search.engine.batch_book import Job
from search.engine.measurer import Measurer

K = TypeVar("K", bound=Hashable)


@dataclass
class Passes(Generic[K]):
    """Passes over keyed jobs, as the module says. ``record``: measurements at other micro-batches into the ledger
    (at the own batch they always are); ``journal(keys)``: called before each call to the Evaluators with the keys
    measured and about to be (a store's meta, so that a resumed run knows what the passes took)."""

    measurer: Measurer
    record: bool = True
    stretch: int = 0
    between: Callable[[], object] = lambda: None
    journal: Callable[[list[K]], object] = lambda keys: None
    done: list[K] = field(default_factory=list)  # every key measured, in order
    passes: list[list[K]] = field(default_factory=list)  # each pass's keys
    got: dict[K, MeasuredPlan] = field(default_factory=dict)  # each key's measurements in the passes, merged
    since: int = 0  # configurations measured after the last ``between``

    def run(self, todo: Sequence[tuple[K, Job]]) -> None:
        """One pass over ``todo`` (key, job): in this order, or reversed where an odd number of passes ran
        (``env.data.rounds.serpentine``)."""
        order = serpentine(todo, len(self.passes))
        self.passes.append([])
        while order:
            take = order[:self.stretch - self.since] if self.stretch else order
            order = order[len(take):]
            keys = [k for k, _ in take]
            self.journal([*self.done, *keys])
            for key, m in zip(keys, self.measurer.side_by_side([j for _, j in take], self.record)):
                self.got[key] = self.got[key].merged(m) if key in self.got else m
            self.done += keys
            self.passes[-1] += keys
            self.since += len(take)
            if self.stretch and self.since >= self.stretch:
                self.between()
                self.since = 0

    def until(self, todo_of: Callable[[list[K]], Sequence[tuple[K, Job]]]) -> None:
        """Passes while ``todo_of(done)`` names any: it must name a configuration only while it lacks
        measurements, so that the passes end."""
        while todo := todo_of(self.done):
            self.run(todo)


def rounds(measurer: Measurer, jobs: dict[K, Job], count: int, record: bool = False) -> dict[K, MeasuredPlan]:
    """Every job measured ``count`` times, a pass a time (interleaved rounds); each key's measurements of these
    rounds merged. ``record``: those at other micro-batches into the ledger too."""
    passes: Passes[K] = Passes(measurer, record)
    passes.until(lambda done: [(k, j) for k, j in jobs.items() if done.count(k) < count])
    return passes.got

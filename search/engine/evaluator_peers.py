"""EvaluatorPeers: an Evaluator's peers (``env.measure.peers``): which apply to its workload, the plan of ours
each is, and each measured as plans are.

``Evaluator`` holds these methods (one device measures peers; an FSDP group offers none); they measure with its
workload, references, labels and ids (``search.engine.measuring_actor.MeasuringActor``). ``counted``
keeps the seconds of what an Evaluator measures (``Evaluator.seconds``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Sequence

from env.data.errors import model_errors
from env.data.measured import MeasuredPlan
from env.measure.compiled import CompileOptions
from env.measure.measurement import warmup_before_timing
from env.measure.peers import Peer, decided, measure_peer, model_facts, peer_plan, peers_for
from env.workloads.workload import Workload


class EvaluatorPeers:
    workload: Workload
    units: list[str]
    repeats: int
    compile: bool | CompileOptions
    busy: dict[str, Any]
    _next_id: Callable[[], str]  # ``MeasuringActor``'s
    _peers: dict[str, MeasuredPlan]

    def peers(self, kinds: Sequence[str], budgets: Sequence[float]) -> list[Peer]:
        """The peers of ``env.measure.peers`` that apply to this workload, of the given kinds (compile ``budgets``),
        auto-SAC's with its decisions made here and carried (``env.measure.peers.decided``)."""
        return [decided(self.workload, p) for p in peers_for(self.workload, budgets=budgets,
                                                              compiled=bool(self.compile)) if p.kind.value in kinds]

    def peer_plans(self, peers: Sequence[Peer]) -> list[list[str] | None]:
        """Per peer, the plan of ours over this Evaluator's units that it is (action names), None where it is none
        (``env.measure.peers.peer_plan``)."""
        facts = model_facts(self.workload)
        plans = [peer_plan(self.workload, p, self.units, facts) for p in peers]
        return [None if a is None else [x.value for x in a] for a in plans]

    def evaluate_peer(self, peer: Peer, not_fitting: bool = False) -> MeasuredPlan:
        """Measure a peer as plans are measured (compiled when the run is, or when the peer compiles): the same
        warm-up, and a peer measured before on CPU lends its peak, as a plan does; ``not_fitting``: as
        ``evaluate`` takes it."""
        if not_fitting:
            return self._labelled(self._killed(peer.digest, [], peer.digest), is_reference=False)
        self._refresh_reference()
        measurement_id = self._next_id()
        known = self._peers.get(peer.name)
        with counted(self.busy, "plans"), model_errors(f"the measurement of peer {peer.name}"):
            m = measure_peer(self.workload, peer, repeats=self.repeats,
                             warmup=warmup_before_timing(self.workload, known, self.compile), compile=self.compile,
                             measurement_id=measurement_id, known=known)
        self._peers[peer.name] = known.merged(m) if known is not None else m
        return self._labelled(m, is_reference=False)


@contextlib.contextmanager
def counted(busy: dict[str, float], kind: str) -> Iterator[None]:
    """The seconds of what runs inside, and one more measurement, counted in ``busy`` as ``kind`` (plans or
    references; ``Evaluator.seconds``)."""
    start = time.perf_counter()
    yield
    busy[kind] += time.perf_counter() - start
    busy[f"{kind[:-1]}_measurements"] += 1

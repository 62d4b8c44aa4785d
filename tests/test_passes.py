"""The one deciding mechanism (search/engine/passes.py): passes over keyed jobs, serpentine order, a reference
after every few configurations counted across passes, the keys journalled before each call, each key's
measurements merged; and the deadline of a job that compiles."""

from __future__ import annotations

from types import SimpleNamespace

from env.measure.peers import Peer, PeerKind
from search.engine.batch_book import Job
from search.engine.deadlines import COMPILE_SECONDS, Deadlines
from search.engine.evaluator_pool import EvaluatorPool
from search.engine.passes import Passes, rounds
from search.records.config import SearchConfig
from tests.test_drift import _m


class Calls:
    """The measurer's part: every call's jobs, and a measurement per job whose one sample counts the jobs so far."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.n = 0

    def side_by_side(self, jobs, record: bool = True) -> list:
        self.calls.append([job.source for job in jobs])
        out = []
        for job in jobs:
            self.n += 1
            out.append(_m(job.source, ["keep"], [float(self.n)], [], f"e:{self.n}"))
        return out


def _jobs(*names: str) -> list[tuple[str, Job]]:
    return [(n, Job(("keep",), 4, n)) for n in names]


def test_passes_alternate_their_order_and_measure_until_each_has_its_count() -> None:
    calls = Calls()
    got = rounds(calls, dict(_jobs("a", "b", "c")), 2)  # type: ignore[arg-type]
    assert calls.calls == [["a", "b", "c"], ["c", "b", "a"]]
    assert {k: m.step_seconds_samples for k, m in got.items()} == {"a": [1.0, 6.0], "b": [2.0, 5.0], "c": [3.0, 4.0]}


def test_a_reference_follows_every_stretch_counted_across_passes_and_the_keys_are_journalled_first() -> None:
    calls, journal, between = Calls(), [], []
    passes: Passes[str] = Passes(calls, stretch=2, between=lambda: between.append(list(passes.done)),  # type: ignore[arg-type]
                                 journal=lambda keys: journal.append(keys))
    passes.run(_jobs("a", "b", "c"))
    passes.run(_jobs("a", "b", "c"))
    assert calls.calls == [["a", "b"], ["c"], ["c"], ["b", "a"]]  # the second pass's first call ends the stretch
    assert between == [["a", "b"], ["a", "b", "c", "c"], ["a", "b", "c", "c", "b", "a"]]
    assert journal[1] == ["a", "b", "c"] and journal[-1] == ["a", "b", "c", "c", "b", "a"]
    assert passes.passes == [["a", "b", "c"], ["c", "b", "a"]] and passes.since == 0
    passes.until(lambda done: _jobs(*[k for k in "ab" if done.count(k) < 3]))
    assert passes.passes[-1] == ["a", "b"] and passes.done.count("a") == passes.done.count("b") == 3


def test_a_peer_that_compiles_gets_a_compile_in_its_deadline() -> None:
    pool = EvaluatorPool.__new__(EvaluatorPool)  # measurement_seconds reads the config and the deadlines alone
    pool.cfg, pool.deadlines = SearchConfig(), Deadlines(step_timeout=10.0, repeats=1)
    budget = Peer(name="compile-budget-0.5", kind=PeerKind.COMPILE_BUDGET, params={"budget": 0.5})
    layer = Peer(name="checkpoint-sequential-2", kind=PeerKind.CHECKPOINT_SEQUENTIAL, params={"segments": 2})
    plain = pool.measurement_seconds(Job(("keep",)))
    assert pool.measurement_seconds(Job(budget)) == plain + COMPILE_SECONDS
    assert pool.measurement_seconds(Job(layer)) == plain
    assert pool.measurement_seconds(SimpleNamespace(micro_batch=8, item=budget), base=4) > 2 * plain

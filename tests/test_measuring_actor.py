"""The one-device Evaluator and the FSDP group are one kind of actor (``MeasuringActor``), each implementing it
whole: the pool starts, calls and restarts either alike."""

from __future__ import annotations

import inspect

from search.engine.evaluator import Evaluator
from search.engine.fsdp.group import FsdpGroup
from search.engine.measuring_actor import MeasuringActor

# what the pool and every phase ask of any measuring actor (search/engine/evaluator_pool.py, phases/, scaling.py)
ASKED_OF_EVERY = {"info", "profile", "warm_up", "check", "peers", "preload", "evaluate", "measure_at",
                  "seconds", "drain"}


def test_both_kinds_implement_the_base_whole_and_neither_is_the_other() -> None:
    for kind in (Evaluator, FsdpGroup):
        assert issubclass(kind, MeasuringActor) and not inspect.isabstract(kind), kind.__abstractmethods__
    assert not issubclass(FsdpGroup, Evaluator) and not issubclass(Evaluator, FsdpGroup)
    public = {n for n, f in inspect.getmembers(MeasuringActor, inspect.isfunction) if not n.startswith("_")}
    assert public == ASKED_OF_EVERY


def test_the_group_says_its_ranks_through_the_base_info() -> None:
    """``info`` is the base's: what every actor says, and what its kind adds (``_described``)."""
    assert FsdpGroup.info is MeasuringActor.info is Evaluator.info
    assert "_described" in vars(FsdpGroup) and "_described" in vars(Evaluator)

"""One restart policy for Evaluators, FSDP groups and agents (``search.engine.restarts``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from search.engine.restarts import RESTARTS, Death, restart_once


@dataclass
class Slot:
    handle: Any = None
    restarts: int = 0


def test_an_actor_is_restarted_once_then_left_out_and_said_before_each_restart() -> None:
    slot, seen = Slot(), []
    say = lambda d: seen.append(("said", d))  # noqa: E731
    start = lambda: seen.append(("started", slot.restarts))  # noqa: E731
    first = restart_once(slot, RuntimeError("ActorDiedError: killed by signal 9"), say, start)
    assert first == Death("RuntimeError: ActorDiedError: killed by signal 9", True) and slot.restarts == RESTARTS == 1
    assert seen == [("said", first), ("started", 1)]
    second = restart_once(slot, RuntimeError("gone"), say, start)
    assert not second.restarted and slot.restarts == 2 and seen[-1] == ("said", second)  # not started again


def test_a_death_on_a_job_is_restarted_whatever_the_count() -> None:
    slot, started = Slot(restarts=5), []
    death = restart_once(slot, MemoryError(), lambda d: None, lambda: started.append(1), bounded=True)
    assert death.restarted and started == [1] and slot.restarts == 6

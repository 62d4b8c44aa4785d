"""One restart policy for the search's actors: the Evaluator pool's measuring actors (one device or an FSDP group,
``search.engine.evaluator_restarts``) and the PPO agents (``search.engine.agent_pool``).

An actor whose process died is counted on its slot, said (the run's events), ended (``ray_session.discard``: an
FSDP group whose rank died answers from a live process, which would otherwise outlive its restart) and started
again while it has died at most ``RESTARTS`` times; after that the run goes on without it. A death while
measuring a job is restarted whatever the count (``bounded``): the job's own count bounds those deaths, as a
configuration that killed ``KILLS_NOT_FITTING`` Evaluators is recorded as not fitting.

Ray's own restarts (``max_restarts``, ``max_task_retries``) stay off for these actors. Ray would run a restarted
actor's constructor and nothing else: an Evaluator's workload is built by a later call (``Evaluator.build``), its
warm-up and a resumed run's cache come by others, and a restarted agent must count the steps of the policy it
loaded and be fed the measurements again. And Ray retries a task on the same actor, where the pool hands the job
to whichever Evaluator is free and turns the second kill into a not-fitting record, so that a configuration
that does not fit is measured at most twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from search.engine import ray_session

RESTARTS = 1  # restarts of an actor that died other than on a job, before the run goes on without it


class Restartable(Protocol):
    """A slot of a pool: the actor's handle and how often it died (``EvaluatorSlot``, ``AgentSlot``)."""

    handle: Any
    restarts: int


@dataclass(frozen=True)
class Death:
    """What ``restart_once`` made of an actor's death."""

    cause: str  # ``Type: first line naming an error`` (``ray_session.death_cause``)
    restarted: bool  # started again; False: left out, the run goes on without it


def restart_once(slot: Restartable, error: BaseException, say: Callable[[Death], None], start: Callable[[], None],
                 bounded: bool = False, limit: int = 200) -> Death:
    """``slot``'s actor died of ``error``: counted, ``say(death)`` told (before the restart, which may fail in its
    turn), then the old actor ended and ``start()`` called while it died at most ``RESTARTS`` times, or whatever
    the count where ``bounded`` (a death on a job, which the job's own count bounds)."""
    slot.restarts += 1
    death = Death(ray_session.death_cause(error, limit=limit), bounded or slot.restarts <= RESTARTS)
    say(death)
    if death.restarted:
        ray_session.discard(slot.handle)
        start()
    return death

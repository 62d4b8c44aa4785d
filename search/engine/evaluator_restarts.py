"""EvaluatorRestarts: how an ``EvaluatorPool`` keeps its Evaluators measuring through deaths and deadlines.

- Queue: ``_dispatch`` hands each job to a free Evaluator and gives each result to ``on_result`` as it arrives;
  a call past its deadline ends in ``DeadlineError`` (``search.engine.deadlines``), one waited on long is said.
- Kills: an Evaluator whose process dies on a job is restarted and the job goes back on the queue; a job that
  killed ``KILLS_NOT_FITTING`` Evaluators is recorded as not fitting (under ``--fsdp``: a group, killed as one
  where any of its ranks dies, ``search.engine.fsdp.group``).
- Restarts: ``_died`` restarts an Evaluator by the policy the agents share (``search.engine.restarts``) and keeps
  the event (``events``, ``on_event``); one that died other than on a job is restarted once and left out after a
  second death.

``EvaluatorPool`` holds these methods; they use its slots, deadlines, ``get``, ``_start`` and ``_warm_up``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from env.data.errors import CkptSearchError
from env.data.measured import MeasuredPlan
from env.data.plan import action_summary
from search.engine import ray_session
from search.engine.deadlines import SAY_AFTER, Deadlines, ask_where
from search.engine.restarts import Death, restart_once
from search.records.config import SearchConfig


@dataclass
class EvaluatorSlot:
    name: str
    gpu: bool
    handle: Any = None
    info: dict[str, Any] | None = None
    restarts: int = 0
    alive: bool = True
    aside: Any = None  # a long call of its own (``EvaluatorPool.first_aside``): no job goes to it until it is done
    aside_what: str = ""  # that call, in words
    aside_died: Any = None  # that call, where the Evaluator's process died in it (``EvaluatorPool.aside_result``)
    gone: Exception | None = None  # found dead between jobs: restarted before the next (``EvaluatorPool._gather``)


KILLS_NOT_FITTING = 2  # Evaluators a configuration killed (their processes) before it is recorded as not fitting


def describe_job(job: Any) -> str:
    """A job in words for the run's events: a plan (action names and who proposed it) or a peer, at its micro-batch
    where that is not the workload's own (``search.engine.batch_book.Job``); a bare list of action names too."""
    item, micro_batch = getattr(job, "item", job), getattr(job, "micro_batch", 0)
    name = f"peer {item.name}" if hasattr(item, "name") else f"plan ({action_summary(item)})"
    return name + (f" at micro-batch {micro_batch}" if micro_batch else "")


class EvaluatorRestarts:
    ray: Any
    cfg: SearchConfig
    slots: list[EvaluatorSlot]
    deadlines: Deadlines
    events: list[str]
    on_event: Callable[[str], None] | None
    live: list[EvaluatorSlot]
    get: Callable[..., Any]
    measurement_seconds: Callable[..., float]
    _start: Callable[[EvaluatorSlot], None]
    _warm_up: Callable[[Sequence[EvaluatorSlot]], None]

    def _free_for_jobs(self) -> list[EvaluatorSlot]:
        """The live Evaluators but one whose call of its own (``first_aside``) is still running; one found dead
        between jobs (``_gather``) restarted first."""
        for s in [s for s in self.live if s.gone is not None]:
            gone, s.gone = s.gone, None
            self._died(s, gone)
        for s in self.live:
            if s.aside is not None and self.ray.wait([s.aside], timeout=0)[0]:
                self._aside_ended(s)
        return [s for s in self.live if s.aside is None] or self.live

    def _dispatch(self, jobs: Sequence[Any], call: Callable[[Any, Any, bool], Any],
                  on_result: Callable[[MeasuredPlan], MeasuredPlan],
                  deadline: Callable[[Any], float] | None = None) -> list[MeasuredPlan]:
        """Jobs to free Evaluators; an Evaluator whose process dies on a job (the kernel's out-of-memory killer)
        is restarted and the job goes back on the queue; a job that killed ``KILLS_NOT_FITTING`` Evaluators is
        recorded as not fitting instead (``call`` with ``not_fitting``)."""
        queue: deque[int] = deque(range(len(jobs)))
        running: dict[Any, tuple[EvaluatorSlot, int]] = {}
        out: dict[int, MeasuredPlan] = {}
        kills: dict[int, int] = {}
        started: dict[Any, float] = {}
        deadline = deadline or self.measurement_seconds
        while queue or running:
            self.deadlines.stop_if_asked()
            free = self._free_for_jobs()
            for slot in free:
                if queue and all(s is not slot for s, _ in running.values()):
                    k = queue.popleft()
                    ref = call(slot.handle, jobs[k], kills.get(k, 0) >= KILLS_NOT_FITTING)
                    running[ref], started[ref] = (slot, k), time.monotonic()
            if not running:
                raise CkptSearchError("every Evaluator died; see the events in the run's report and start it again "
                                      "with --resume")
            aside = [s.aside for s in self.live if s not in free]  # their calls' ends wake the loop too
            done, _ = self.ray.wait(list(running) + aside, num_returns=1, timeout=SAY_AFTER)
            if not done:
                self._overdue(running, started, jobs, deadline)
                continue
            if done[0] not in running:
                continue  # an Evaluator's call of its own ended: it takes jobs from here on
            slot, k = running.pop(done[0])
            try:
                out[k] = on_result(ray_session.get(done[0]))
            except ray_session.actor_gone() as e:
                kills[k] = kills.get(k, 0) + 1
                self._died(slot, e, on=f"the measurement of {describe_job(jobs[k])}", kills=kills[k])
                queue.appendleft(k)  # measured by whichever Evaluator is free next, or recorded as not fitting
        return [out[k] for k in range(len(jobs))]

    def _overdue(self, running: dict[Any, tuple[EvaluatorSlot, int]], started: dict[Any, float],
                 jobs: Sequence[Any], deadline: Callable[[Any], float]) -> None:
        """Of the calls running, one waited on for long said on stderr (once), one past its deadline ended in
        ``DeadlineError`` (``search.engine.deadlines``)."""
        for ref, (slot, k) in running.items():
            seconds, spent = deadline(jobs[k]), time.monotonic() - started[ref]
            stage = f"{slot.name}: the measurement of {describe_job(jobs[k])}"
            if spent > seconds:
                raise self.deadlines.passed(stage, seconds, (lambda h=slot.handle: ask_where(self.ray, h))
                                            if not self.cfg.fsdp else None)
            self.deadlines.say(stage, spent, seconds)

    def _aside_ended(self, slot: EvaluatorSlot) -> None:
        """A slot's call of its own (``first_aside``) ended: it takes jobs from now on; where its process died in
        the call, restarted first (``aside_result`` then answers None)."""
        ref, slot.aside = slot.aside, None
        try:
            self.ray.get(ref, timeout=0)
        except ray_session.actor_gone() as e:
            slot.aside_died = ref
            self._died(slot, e, on=slot.aside_what)
        except Exception:  # noqa: BLE001 - the call's own error: ``aside_result`` raises it
            pass

    def aside_result(self, ref: Any, seconds: float) -> Any:
        """The result of ``first_aside``'s call within ``seconds``, or None where the Evaluator's process died in
        it (restarted, the event recorded)."""
        slot = next((s for s in self.slots if s.aside_died is ref), None)
        if slot is not None:
            slot.aside_died = None
            return None
        try:
            return self.get(ref, seconds, f"{self.live[0].name}: {self.live[0].aside_what}", self.live[0])
        except ray_session.actor_gone() as e:
            slot = self.live[0]
            self._died(slot, e, on=slot.aside_what)
            return None

    def _gather(self, refs: list[Any]) -> list[Any]:
        """Each live Evaluator's answer to a short call (``drain``, ``seconds``), also while a stopped run drains
        them; one that died meanwhile answers nothing and is restarted before it gets a job (``_free_for_jobs``)."""
        out = []
        for slot, ref in zip(list(self.live), refs):
            try:
                out.append(self.get(ref, self.measurement_seconds(), f"{slot.name}'s answer", slot, stoppable=False))
            except ray_session.actor_gone() as e:
                slot.gone = e
        return out

    def _event(self, text: str) -> None:
        self.events.append(text)
        if self.on_event is not None:
            self.on_event(text)

    def _died(self, slot: EvaluatorSlot, error: Exception, on: str = "", kills: int = 0) -> None:
        """An Evaluator's process died: restarted by the search's one policy (``search.engine.restarts``), the
        event kept for the store and the report. One that died measuring ``on`` (its ``kills``-th death on it) is
        always restarted: the configuration is recorded as not fitting after its second, so these deaths are
        bounded; one that died otherwise is restarted once and left out after a second death."""
        def say(death: Death) -> None:
            if on:
                then = ("; the configuration is recorded as not fitting, as an out-of-memory kill"
                        if kills >= KILLS_NOT_FITTING else "; the configuration is measured again" if kills else "")
                self._event(f"{slot.name} died in {on} ({death.cause}); restarted{then}")
            elif death.restarted:
                self._event(f"{slot.name} died ({death.cause}); its plan went back on the queue and it was restarted")
            else:
                self._event(f"{slot.name} died again ({death.cause}); the run went on without it")
                slot.alive = False

        def start() -> None:
            self._start(slot)
            self._warm_up([slot])

        restart_once(slot, error, say, start, bounded=bool(on), limit=160)

"""How long the driver waits for each remote call, and what it says while it waits.

Every call that waits on an Evaluator has a deadline scaled to what it waits for, in training steps:

| what                                              | deadline                                          |
|---------------------------------------------------|---------------------------------------------------|
| an Evaluator's process start                      | ``PROCESS_START``                                 |
| building the workload (the factory, and the one   | ``BUILD_STEPS`` x ``--step-timeout``              |
| instrumented step that finds the decision units)  |                                                   |
| anything after it                                 | its steps x the step's deadline: ``STEP_FACTOR``  |
|                                                   | x the workload's first step as measured (at least |
|                                                   | ``STEP_FLOOR`` s, at most ``--step-timeout``),    |
|                                                   | x the micro-batch over the workload's own batch   |
| an agent's call (a round of PPO steps, taking     | ``--step-timeout`` + ``AGENT_STEP_SECONDS`` per   |
| measurements in, its timesteps after its start)   | PPO step, + a measurement's deadline per plan it  |
|                                                   | may measure (measured reward); its start adds     |
|                                                   | ``PROCESS_START``                                 |
| Ray's start joining a cluster (``--address``)     | ``RAY_JOIN``                                      |

A measurement is ``warm-up + 1 + repeats`` steps, the warm-up ``WARM_UP_STEPS``, a profile a few steps per unit
and action; a compiled one adds ``COMPILE_SECONDS``. After ``SAY_AFTER`` seconds the search says on stderr what
it waits on; past the deadline it asks the Evaluator where it is (``search.engine.stuck``) and the run ends with
one line naming the stage (``DeadlineError``: status ``failed: ...``). The agents (``search.engine.agent_pool``) and
Ray's start (``search.engine.ray_session``) are waited on the same way (``wait_until``), each line saying its own
fix.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from env.data.errors import ModelError

SAY_AFTER = 10.0  # seconds a call runs before the search says what it waits on, or a twentieth of its deadline
BUILD_STEPS = 2  # the factory, and the instrumented step that finds the units
STEP_FACTOR = 20.0  # once the first step is measured: a step may take this many times as long ...
STEP_FLOOR = 30.0  # ... and at least these seconds (a shared machine, a cold cache)
WARM_UP_STEPS = 25  # env.measure.measurement.warm_up's most steps, and one
COMPILE_SECONDS = 600.0  # a compiled measurement's compile, beside its steps
ASK_WHERE = 15.0  # seconds the Evaluator has to say where it is
PROCESS_START = 120.0  # seconds an Evaluator's process has to start (Ray's worker, Python, torch's import)
AGENT_STEP_SECONDS = 0.25  # seconds a PPO step of an agent may take (its share of the rollout and the update)
RAY_JOIN = 120.0  # seconds joining a Ray cluster (--address) may take: Ray retries a cluster that never answers


class DeadlineError(ModelError):
    """A remote call that passed its deadline: the stage it waited on and where the Evaluator was (the run
    fails as on the model's own error)."""


@dataclass
class Deadlines:
    """The deadlines of one run: ``step_timeout`` (``--step-timeout``), ``repeats`` (timed steps a measurement
    takes); ``first_step`` is the workload's first step in seconds once an Evaluator measured it."""

    step_timeout: float
    repeats: int
    first_step: float | None = None
    said: set[str] = field(default_factory=set)
    # called between waits: raises where the run was told to stop (a signal that library code swallowed)
    stop_if_asked: Callable[[], None] = field(default=lambda: None)

    def step(self, scale: float = 1.0) -> float:
        """The deadline of one training step at ``scale`` times the workload's own batch."""
        if self.first_step is None:
            return self.step_timeout * max(1.0, scale)
        return min(self.step_timeout, max(STEP_FLOOR, STEP_FACTOR * self.first_step)) * max(1.0, scale)

    def build(self) -> float:
        return BUILD_STEPS * self.step_timeout

    def measurement(self, scale: float = 1.0, compiled: bool = False) -> float:
        return (3 + self.repeats) * self.step(scale) + (COMPILE_SECONDS if compiled else 0.0)

    def profile(self, n_units: int, n_actions: int, scale: float = 1.0) -> float:
        return (4 + n_units * n_actions) * (2 + self.repeats) * self.step(scale)

    def agent(self, timesteps: int = 0, measurements: int = 0) -> float:
        """An agent's call that trains ``timesteps`` PPO steps and may measure ``measurements`` plans."""
        return self.step_timeout + timesteps * AGENT_STEP_SECONDS + measurements * self.measurement()

    def wait(self, ray: Any, refs: list[Any], seconds: float, stage: str,
             where: Callable[[], str] | None = None, num_returns: int | None = None,
             stoppable: bool = True, fixed: bool = False, fix: str = "") -> list[Any]:
        """``refs`` waited on (all, or the first ``num_returns``) for at most ``seconds``: the ready ones. After
        ``SAY_AFTER`` seconds, one line on stderr says what the search waits on; past ``seconds``,
        ``DeadlineError`` names ``stage`` and where the Evaluator is (``where``). ``stoppable``: a stop asked for
        (``stop_if_asked``) ends the wait; not while a stopped run drains its Evaluators. ``fixed``: a deadline
        that ``--step-timeout`` does not set. ``fix``: what the line tells the user to do (a step's fix)."""
        want = len(refs) if num_returns is None else num_returns
        ready: list[Any] = []

        def done(timeout: float) -> bool:
            ready[:] = ray.wait(refs, num_returns=want, timeout=timeout)[0]
            return len(ready) >= want

        wait_until(done, seconds, stage, self.said, self.stop_if_asked if stoppable else None, fixed,
                   lambda: self.passed(stage, seconds, where, fix))
        return ready

    def say(self, stage: str, spent: float, seconds: float, fixed: bool = False) -> None:
        """One line on stderr, once per stage, when a call waited on for ``spent`` of its ``seconds`` has run
        longer than ``say_after`` them (``fixed``: a deadline ``--step-timeout`` does not set)."""
        say(stage, spent, seconds, self.said, fixed)

    def passed(self, stage: str, seconds: float, where: Callable[[], str] | None, fix: str = "") -> DeadlineError:
        at = ""
        if where is not None:
            try:
                at = where()
            except Exception:  # noqa: BLE001 - the deadline's message is what matters; where is a courtesy
                at = ""
        fix = fix or ("a step that never ends (a wait, a deadlock, a stuck device) in the model or its factory, or "
                      "a slow one: fix it, or give it longer with --step-timeout SECONDS")
        return DeadlineError(f"{stage} did not return within {seconds:.0f} s{' ' + at if at else ''}; {fix} "
                             f"(now {self.step_timeout:g})")


def wait_until(done: Callable[[float], bool], seconds: float, stage: str, said: set[str],
               stop_if_asked: Callable[[], None] | None, fixed: bool, passed: Callable[[], Exception]) -> None:
    """Waits until ``done(timeout)``, which blocks for at most ``timeout`` seconds, says True, for at most
    ``seconds``: after ``say_after`` them one line on stderr says what is waited on (``stage``, once: ``said``),
    past them ``passed()`` is raised. ``stop_if_asked``: called between waits (a stop asked for ends the wait)."""
    start = time.monotonic()
    while True:
        if stop_if_asked is not None:
            stop_if_asked()
        spent = time.monotonic() - start
        left = seconds - spent
        if left <= 0:
            raise passed()
        step = left if stage in said else min(left, max(0.1, say_after(seconds) - spent))
        if done(step):
            return
        say(stage, time.monotonic() - start, seconds, said, fixed)


def say(stage: str, spent: float, seconds: float, said: set[str], fixed: bool = False) -> None:
    """``Deadlines.say``'s line, once per stage in ``said``."""
    if stage not in said and spent >= say_after(seconds):
        said.add(stage)
        print(f"waiting on {stage} ({spent:.0f} s so far; it is given {seconds:.0f} s"
              + ("" if fixed else ", --step-timeout sets it") + ")", file=sys.stderr, flush=True)


def say_after(seconds: float) -> float:
    """When the search says what it waits on, for a call given ``seconds``: ``SAY_AFTER`` or a twentieth, and
    at most half of them."""
    return min(max(SAY_AFTER, seconds / 20), seconds / 2)


def where_call(handle: Any) -> Any:
    """``Evaluator.where`` called in its concurrency group of its own: answered while a measurement runs, and
    as soon as the actor's process has started (the driver waits on that before it times the build)."""
    return handle.where.options(concurrency_group="watch").remote()


def ask_where(ray: Any, handle: Any) -> str:
    """Where a busy Evaluator is (``Evaluator.where``), or an empty string where it does not say in time."""
    ref = where_call(handle)
    ready, _ = ray.wait([ref], timeout=ASK_WHERE)
    return str(ray.get(ready[0])) if ready else ""

"""The PPO agents of a search on Ray: start, train a round, feed measurements, restart.

One ``AgentSlot`` per agent (its budget, seed, progress and status, mirrored in the store's
``progress`` table). The agents live in ``AgentProcess`` actors, one per core at most, started before the
profile exists (``start_processes``). An agent whose process dies is restarted once from its last saved
policy, in a process of its own, then
left out, by the policy the Evaluators share (``search.engine.restarts``); what happened goes to the
ledger's events, which the report lists. Every call to an
agent has a deadline (``search.engine.deadlines.Deadlines.agent``): after a while one line says
which agents it waits on, past it the run ends in one line naming them (``DeadlineError``).
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from collections import Counter
from typing import Any, Callable, Iterable

from env.data.measured import MeasuredPlan
from env.data.types import PlanSource, RewardMode, SourceKind
from search.engine import ray_session
from search.engine.deadlines import PROCESS_START, Deadlines
from search.engine.ledger import Ledger
from search.engine.restarts import Death, restart_once
from search.records import meta
from search.records.config import SearchConfig


@dataclass
class AgentSlot:
    name: PlanSource  # agent_<i>: the source of the plans it proposes
    budget_bytes: int  # the memory budget its plan is exported for (plans/budget_<N>MB.json)
    seed: int
    share: Any = None  # env.gym.checkpoint_env.BudgetShare: the slice of reachable budgets it learns plans for
    budget_range: tuple[int, int] | None = None  # that slice in bytes, as the agent reports it
    handle: Any = None
    timesteps: int = 0
    restarts: int = 0
    status: str = "running"  # running | finished | died
    episodes: int = 0
    best_reward: float = float("-inf")
    last_error: str = ""


MeasureFn = Callable[[list[int]], tuple[int, float]]
AGENT_FIX = ("an agent that never answers (a deadlock in its process, a machine too loaded for its PPO steps): "
             "train in smaller rounds (--chunk-timesteps), or give it longer with --step-timeout SECONDS, which sets it")


AGENT_NICENESS = 10  # added to an agent process's niceness, so that it yields a core to a measurement


class AgentProcess:
    """A process for agents, started before they can be built: it starts, lowers its priority
    (``AGENT_NICENESS``) and imports the agents' module (torch, SB3: about 3 s of a core with the process's own
    start), all before the profile the agents are built from exists; ``build(*args)`` then builds an agent as
    ``agent_class(*args)`` (the first argument is its name), and ``call(name, ...)`` runs one of its methods.

    A process hosts one agent per core's worth of them (``processes_for``): on two cores, four agents in two
    processes. Each agent keeps its own random state (torch's, NumPy's and Python's global generators), swapped in
    for its calls, so that it draws what it would alone in a process: hosting changes no agent's plans. Where the
    process shares a core with an Evaluator (importing while the profile is timed, training beside GPU
    measurements), the Evaluator's steps get the core."""

    def __init__(self, module: str, qualname: str, niceness: int = AGENT_NICENESS) -> None:
        os.nice(niceness)
        self._class = getattr(importlib.import_module(module), qualname)
        self._agents: dict[str, Any] = {}
        self._random: dict[str, tuple[Any, Any, Any]] = {}  # each agent's generators' states between its calls

    def build(self, name: str, *args: Any) -> None:
        self._agents[name] = self._class(name, *args)
        self._random[name] = _random_state()

    def call(self, name: str, method: str, *args: Any) -> Any:
        """Agent ``name``'s ``method(*args)`` (``timesteps``, ``train``, ``observe``) on its own random state."""
        _set_random_state(self._random[name])
        try:
            return getattr(self._agents[name], method)(*args)
        finally:
            self._random[name] = _random_state()


def _random_state() -> tuple[Any, Any, Any]:
    import random

    import numpy as np
    import torch

    return torch.random.get_rng_state(), np.random.get_state(), random.getstate()


def _set_random_state(state: tuple[Any, Any, Any]) -> None:
    import random

    import numpy as np
    import torch

    torch.random.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


def processes_for(ray: Any, cfg: SearchConfig) -> int:
    """Agent processes for ``cfg.agents``: one per core of the cluster, at most one per agent. More would time-share
    the same cores and each cost its start and imports again (on gpt/small, four agents starting in four processes
    took about 10 s of two cores)."""
    return max(1, min(cfg.agents, int(ray.cluster_resources().get("CPU", 1.0))))


def _remote_agent(ray: Any, cfg: SearchConfig, agent: type | None, processes: int) -> Any:
    """A new agent process (``AgentProcess``) for ``agent`` (``agents.ppo.PPOAgent`` by default), one of
    ``processes``: a whole CPU each when there are enough, else a share."""
    cpus = ray.cluster_resources().get("CPU", 1.0)
    module, name = (agent.__module__, agent.__qualname__) if agent else ("agents.ppo", "PPOAgent")
    return ray.remote(num_cpus=min(1.0, cpus / processes), max_restarts=0)(AgentProcess).remote(module, name)


def start_processes(cfg: SearchConfig, agent: type | None = None) -> list[Any]:
    """The agents' processes (``processes_for``), started now, before the profile they are built from exists: they
    import while the first Evaluator profiles on one core, instead of beside the rules' measurements.
    ``AgentPool(processes=...)`` builds the agents on them; one it does not need (a resumed run's finished agents)
    it ends."""
    import ray

    n = processes_for(ray, cfg)
    return [_remote_agent(ray, cfg, agent, n) for _ in range(n)]


class AgentPool:
    """K agents, one per memory budget, trained in rounds of ``chunk_timesteps``."""

    def __init__(self, cfg: SearchConfig, ledger: Ledger, run_dir: Path,
                 measure_for: Callable[[str], MeasureFn] | None = None, deadlines: Deadlines | None = None,
                 agent: type | None = None, processes: list[Any] | None = None) -> None:
        """``deadlines``: the run's (the Evaluator pool's, whose measurements a measured reward waits on);
        ``agent``: the agent class (``agents.ppo.PPOAgent``, or one of its subclasses); ``processes``: agent
        processes started before (``start_processes``, with the same ``agent``), each built into an agent."""
        import ray

        self.ray, self.cfg, self.ledger, self.run_dir = ray, cfg, ledger, run_dir
        self.measure_for = measure_for  # measured reward: agent name -> its function measuring a new plan
        self.deadlines = deadlines or Deadlines(cfg.step_timeout, cfg.repeats)
        self.agent = agent
        self.slots: list[AgentSlot] = []
        self._processes = list(processes or [])
        self._built: dict[str, Any] = {}  # agent name -> its ``build`` call, read before its first answer

    @property
    def running(self) -> list[AgentSlot]:
        return [s for s in self.slots if s.status == "running"]

    def spawn(self) -> None:
        """The agents' actors started, one per ``cfg.agents``, without waiting for them: they import
        and build their policies while the Evaluator measures the rules, the peers and the warm start
        (on gpt/small, 4 actors took 10 s of wall time to start when the search waited for them).
        An agent needs the profile, not its budget, to start: ``start`` gives the budgets later."""
        if self.slots:
            return
        (self.run_dir / "agents").mkdir(exist_ok=True)
        done = {p["agent"]: p for p in self.ledger.store.progress()}
        from agents.ppo import budget_slices

        shares = budget_slices(self.cfg.agents)  # one budget-conditioned agent per slice of the frontier
        for i in range(self.cfg.agents):
            slot = AgentSlot(PlanSource.agent(i), 0, self.cfg.seed + i, shares[i])
            prev = done.get(slot.name)
            if prev:
                slot.timesteps, slot.restarts, slot.episodes = prev["timesteps"], prev["restarts"], prev["episodes"]
                slot.status = "finished" if prev["timesteps"] >= self.cfg.timesteps else "running"
            self.slots.append(slot)
            if slot.status == "running":
                self._spawn(slot)
        hosting = {id(s.handle) for s in self.slots if s.handle is not None}
        for unused in self._processes:
            if id(unused) not in hosting:
                ray_session.discard(unused)
        self._processes = []

    def start(self, budgets: list[int]) -> None:
        """The agents ready to train, each with its memory budget (one per agent, in order): spawned
        here unless ``spawn`` ran before, then waited for."""
        self.spawn()
        if len(budgets) != len(self.slots):
            raise ValueError(f"{len(budgets)} budgets for {len(self.slots)} agents: give one budget per agent")
        self.ledger.store.write(meta.AGENTS, [{"name": s.name, "budget_bytes": b} for s, b in zip(self.slots, budgets)])
        for slot, b in zip(self.slots, budgets):  # the actors start side by side: each waits for its own only now
            slot.budget_bytes = b
            if slot.handle is not None:
                self._catch_up(slot)
            self._save_progress(slot)
        if self.cfg.reward == RewardMode.HYBRID:
            self.feed(self.ledger.points())

    def _spawn(self, slot: AgentSlot) -> None:
        """The slot's agent built on a process started before (in turn, as ``spawn`` takes the slots), or on a
        process of its own (a restart, or no processes given)."""
        if self._processes:
            slot.handle = self._processes[slot.name.index % len(self._processes)]
        else:  # one agent's share of the cores: the agents of a process that died fit in what it held
            slot.handle = _remote_agent(self.ray, self.cfg, self.agent, self.cfg.agents)
        self._built[slot.name] = slot.handle.build.remote(
            slot.name, self.ledger.setup.profile.model_dump(mode="json"), slot.share,
            slot.seed + 1000 * slot.restarts, self.cfg.reward, self.measure_for(slot.name) if self.measure_for else None,
            str(self.run_dir / "tb"), str(self.run_dir / "agents" / f"{slot.name}.zip"))

    def _catch_up(self, slot: AgentSlot) -> None:
        """A resumed agent counts the steps of the policy it loaded: a run killed after the policy was saved
        but before its progress was recorded would otherwise train them again."""
        ref = slot.handle.call.remote(slot.name, "timesteps")
        self._wait({ref: slot}, PROCESS_START + self.deadlines.agent(), "its start")
        ray_session.get(self._built.pop(slot.name))  # an agent that could not be built: its own error, not a later one
        loaded = self.ray.get(ref)
        if loaded > slot.timesteps:
            slot.timesteps = loaded
            if slot.timesteps >= self.cfg.timesteps:
                slot.status = "finished"

    def _save_progress(self, slot: AgentSlot) -> None:
        self.ledger.store.set_progress(
            slot.name, budget_bytes=slot.budget_bytes, timesteps=slot.timesteps, total_timesteps=self.cfg.timesteps,
            episodes=slot.episodes, best_reward=None if math.isinf(slot.best_reward) else slot.best_reward,
            budget_low_bytes=slot.budget_range[0] if slot.budget_range else None,
            status=slot.status, restarts=slot.restarts)

    def train_round(self, answer: bool = False) -> list[dict[str, Any]]:
        """Every live agent trains ``chunk_timesteps`` more steps; returns their reports. ``answer``:
        instead, every agent that finished its timesteps in this run trains none and only clones
        the teacher on the measurements fed since (``PPOAgent.train(0)``)."""
        if answer:
            futures = {s.handle.call.remote(s.name, "train", 0): s for s in self.slots
                       if s.status == "finished" and s.handle is not None}
        else:
            futures = {s.handle.call.remote(s.name, "train", min(self.cfg.chunk_timesteps, self.cfg.timesteps - s.timesteps)): s
                       for s in self.running}
        steps = 0 if answer else self.cfg.chunk_timesteps
        per = _sharing(futures.values())  # a process runs its agents' calls one after the other
        self._wait(futures, per * self.deadlines.agent(steps, self._may_measure(steps)), f"a round of {steps} PPO steps"
                   if steps else "the answer round (the teacher's plans cloned)")
        reports = []
        for fut, slot in futures.items():
            try:
                rep = ray_session.get(fut)  # the model's error in a measured reward: one line, as from the driver
            except ray_session.actor_gone() as e:
                self._died(slot, e)
                continue
            slot.timesteps, slot.episodes, slot.best_reward = rep["timesteps"], rep["episodes"], rep["best_reward"]
            if rep.get("budget_range"):
                slot.budget_range = tuple(int(b) for b in rep["budget_range"])
            if slot.timesteps + rep.get("rollout_steps", 1) > self.cfg.timesteps:  # no whole rollout left
                slot.status = "finished"
            self._save_progress(slot)
            reports.append(rep)
        return reports

    def _may_measure(self, steps: int) -> int:
        """Plans an agent may measure in ``steps`` PPO steps: one per episode where the reward is measured."""
        if self.cfg.reward != RewardMode.MEASURED:
            return 0
        return math.ceil(steps / max(1, self.ledger.codec.n_units)) + 1

    def _wait(self, futures: dict[Any, AgentSlot], seconds: float, what: str) -> None:
        """Every call of ``futures`` done (answered, failed or its actor dead) within ``seconds``; past them,
        ``DeadlineError`` names the agents that had not answered (``search.engine.deadlines``)."""
        refs = list(futures)
        names = ", ".join(futures[r].name for r in refs)

        def late() -> str:
            ready = set(self.ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            return f"({', '.join(futures[r].name for r in refs if r not in ready)} had not answered)"

        if refs:
            self.deadlines.wait(self.ray, refs, seconds, f"the agents' calls ({names}): {what}", late, fix=AGENT_FIX)

    def rounds_left(self) -> float:
        """Training rounds still to come, on average over the agents."""
        chunk = self.cfg.chunk_timesteps
        left = sum(max(0, math.ceil((self.cfg.timesteps - s.timesteps) / chunk)) for s in self.running)
        return left / max(1, len(self.slots))

    def _died(self, slot: AgentSlot, error: Exception) -> None:
        """An agent's process died: restarted from its last saved policy once by the search's one policy
        (``search.engine.restarts``), then left out; the event goes to the ledger."""
        def say(death: Death) -> None:
            slot.last_error = death.cause
            if death.restarted:
                self.ledger.note(f"{slot.name} died ({death.cause}) and was restarted from its last saved policy")
                slot.status = "running"
            else:
                self.ledger.note(f"{slot.name} died again ({death.cause}); the run went on without it")
                slot.status = "died"

        def start() -> None:
            self._spawn(slot)
            self._catch_up(slot)
            if self.cfg.reward == RewardMode.HYBRID:
                self.feed(self.ledger.points(), [slot])

        restart_once(slot, error, say, start)
        self._save_progress(slot)

    def feed(self, records: list[MeasuredPlan], slots: list[AgentSlot] | None = None) -> None:
        """Hybrid reward: measurements go to the agents, whose env corrects the cost model with them
        (to the finished ones too, for ``train_round(answer=True)``)."""
        codec = self.ledger.codec
        recs = [r for r in records if not r.oom]
        if not recs:
            return
        fed = [(list(codec.indices(r.actions)), r.peak_bytes, r.step_seconds) for r in recs]
        teach = [may_demonstrate(r, self.cfg.warm_start) for r in recs]
        futures = {s.handle.call.remote(s.name, "observe", fed, teach): s for s in slots or self.slots
                   if s.status in ("running", "finished") and s.handle is not None}
        self._wait(futures, _sharing(futures.values()) * self.deadlines.agent(), f"taking {len(fed)} measurements in")
        for fut, s in futures.items():  # every agent takes them in at once
            try:
                self.ray.get(fut)
            except self.ray.exceptions.RayActorError as e:
                self._died(s, e)


def _sharing(slots: Iterable[AgentSlot]) -> int:
    """The most of these agents one process hosts: its calls run one after the other, so a round waits that many
    agents' calls."""
    counts = Counter(id(s.handle) for s in slots)
    return max(counts.values(), default=1)


def may_demonstrate(record: MeasuredPlan, warm_start: bool) -> bool:
    """Whether the agents' teacher may demonstrate this measured plan where it beats the teacher's plans
    (``PPOAgent.observe``'s ``teach``). With warm start the agents start from every plan the search
    measured, the rules' too, since a rule's plan that beats the corrected cost model's frontier is
    otherwise never proposed (see docs/measurement.md#ranking-and-drift-why). Without warm start a
    rule's plan corrects the cost model and is never demonstrated, so that every plan an agent
    proposes stays its own find."""
    return warm_start or not _rule_only(record)


def _rule_only(record: MeasuredPlan) -> bool:
    """Whether only rules proposed the plan, no agent and no warm start."""
    return bool(record.sources) and all(PlanSource(src).kind is SourceKind.RULE for src in record.sources)

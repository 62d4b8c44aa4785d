"""The search on Ray: one Evaluator per device, K PPO agents, results into the run store.

The driver loop, in rounds:
1. every live agent trains ``chunk_timesteps`` more steps (on the cost model in model/hybrid
   mode; in measured mode each new plan is measured through the Evaluator);
2. the agents' plans are recorded with their predictions; in hybrid/model mode the plans that
   could join the frontier are measured (up to ``max_measurements`` in all) while the agents
   wait, so measurements never share the CPU with training;
3. hybrid: measurements go back to the agents, whose reward corrects the cost model with them;
4. the frontier (measured plans only) and its hypervolume are snapshotted into the store.
An agent actor that dies is restarted once from its last saved policy, then left out; the
report says so. Ctrl-C drains the Evaluator into the store and leaves it resumable.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence


from agents.baselines import baseline_rules
from agents.exact import exact_frontier
from env.correction import MeasuredCorrection
from env.cost_model import CostModel
from env.measure import median_seconds as _median
from env.errors import CkptSearchError
from env.plan import Action, Plan
from env.profile import ModelProfile
from search.config import SearchConfig
from search.evaluator import Result, ray_evaluator, resolve_device
from search.archive import ParetoArchive, spread_picks
from search.store import Evaluation, RunStore

RULES_MEASURED = ("none", "all", "every_2", "every_3", "sqrt_n", "segments_2", "all_selective")


@dataclass
class AgentSlot:
    name: str
    budget_bytes: int
    seed: int
    handle: Any = None
    timesteps: int = 0
    restarts: int = 0
    status: str = "running"
    episodes: int = 0
    best_reward: float = float("-inf")
    last_error: str = ""


@dataclass
class SearchState:
    archive: ParetoArchive = field(default_factory=ParetoArchive)
    n_new_measurements: int = 0
    recorded: set[int] = field(default_factory=set)  # Evaluator seq of each measurement in the store
    events: list[str] = field(default_factory=list)  # what the report must mention (deaths, OOMs)


class Search:
    def __init__(self, config: SearchConfig, run_dir: Path, store: RunStore,
                 on_round: Callable[["Search"], None] | None = None) -> None:
        import ray

        self.ray = ray
        self.cfg, self.run_dir, self.store, self.on_round = config, run_dir, store, on_round
        self.state = SearchState()
        device = resolve_device(config.device)
        n_gpus = 1 if device.startswith("cuda") else 0
        Evaluator = ray_evaluator(num_gpus=n_gpus)
        threads = None if n_gpus else (config.measure_threads or os.cpu_count() or 1)
        self.evaluator = Evaluator.remote(config.workload, config.seed, config.units, config.granularity,
                                          config.actions, config.repeats, "cuda" if n_gpus else device, threads)
        info = self._get(self.evaluator.info.remote())
        self.units: list[str] = info["units"]
        self.batch_shape: str = info["batch_shape"]
        self.agents: list[AgentSlot] = []
        self.profile: ModelProfile | None = None
        self.cm: CostModel | None = None

    def _get(self, ref: Any) -> Any:
        """ray.get that turns a project error raised inside an actor back into that error."""
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, CkptSearchError):
                raise e.cause from None
            raise
        except self.ray.exceptions.RayActorError as e:
            found = re.findall(r"(?:WorkloadError|UnitError|PlanError|MeasurementError|CkptSearchError): ([^\n]+)", str(e))
            if found:
                raise CkptSearchError(found[-1]) from None
            raise

    # -- setup --------------------------------------------------------------------------------
    def prepare(self) -> None:
        s = self.store
        prof_json = s.get_meta("profile")
        if prof_json is None:
            prof_json = self._get(self.evaluator.profile.remote())
            s.set_meta("profile", prof_json)
        self.profile = ModelProfile.model_validate(prof_json)
        self.units = list(self.profile.units)
        s.set_meta("units", self.units)
        s.set_meta("fingerprint", self.profile.fingerprint)
        self.cm = CostModel(self.profile)
        known = s.evaluations(measured_only=True)  # a resumed run: these are never measured again
        self.ray.get(self.evaluator.preload.remote([dataclasses.asdict(e) for e in known]))
        for e in known:
            self.state.archive.add(_from_store(e))
            self.state.archive.proposers[e.plan_digest].update(e.proposers)

    def names(self, idx: list[int] | tuple[int, ...]) -> list[str]:
        assert self.profile is not None
        return [self.profile.actions[i].value for i in idx]

    def indices(self, names: Sequence[str]) -> tuple[int, ...]:
        """The inverse of ``names``: action names -> profile action indices."""
        assert self.profile is not None
        return tuple(self.profile.actions.index(Action(a)) for a in names)

    def _record_prediction(self, idx: tuple[int, ...], source: str) -> str:
        """Record a plan's prediction; agents' (and warm-start) plans become measurement candidates."""
        assert self.cm is not None and self.profile is not None
        pred = self.cm.predict(list(idx))
        digest = self.digest(idx)
        self.state.archive.propose(idx, digest, source, pred.peak_bytes, pred.step_seconds,
                                   candidate=not source.startswith("rule:"))
        self.store.record(digest, self.names(idx), source, predicted_peak_bytes=pred.peak_bytes,
                          predicted_step_seconds=pred.step_seconds)
        return digest

    def measure(self, plans: list[tuple[tuple[int, ...], str]], again: bool = False) -> list[Result]:
        """Measure (plan indices, source) pairs on the Evaluator; record each result as it arrives."""
        out = []
        for idx, source in plans:
            self._record_prediction(idx, source)
            result: Result = self._get(self.evaluator.evaluate.remote(self.names(idx), source, again))
            self._store_result(result)
            out.append(result)
        return out

    def _store_result(self, r: Result) -> None:
        if r.new and r.seq in self.state.recorded:
            return  # drained after the driver had recorded it from the call itself
        if r.new:
            self.state.recorded.add(r.seq)
            self.state.n_new_measurements += 1
            self.store.record(r.digest, list(r.actions), r.source, peak_bytes=r.peak_bytes,
                              live_before_bytes=r.live_before_bytes, step_samples=r.step_samples, oom=r.oom,
                              device=r.device, torch_version=r.torch_version, batch_shape=r.batch_shape)
            if r.oom:
                self.state.events.append(f"plan {r.digest} ran out of memory: recorded as infeasible")
        self.state.archive.add(r)

    def drain(self, timeout_s: float = 60.0) -> None:
        """Record what the Evaluator measured for agents directly (measured mode), or on Ctrl-C."""
        ready, _ = self.ray.wait([self.evaluator.drain.remote()], timeout=timeout_s)
        if ready:
            for r in self.ray.get(ready[0]):
                self._record_prediction(self.indices(r.actions), r.source)
                self._store_result(r)

    def measure_baselines(self) -> dict[str, list[int]]:
        assert self.profile is not None
        rules = baseline_rules(len(self.units), self.profile.actions, seed=self.cfg.seed)
        chosen = {k: v for k, v in rules.items() if k in RULES_MEASURED}
        results = self.measure([(tuple(v), f"rule:{k}") for k, v in chosen.items()])
        self.store.set_meta("rules", {k: r.digest for k, r in zip(chosen, results)})
        self.store.set_meta("baseline_digest", results[list(chosen).index("none")].digest)
        for k, v in rules.items():
            if k not in chosen:
                self._record_prediction(tuple(v), f"rule:{k}")
        return chosen

    def exact(self) -> list[tuple[int, ...]]:
        """The cost model's optimal frontier. Its plans join the candidates only with warm start,
        so that without it every plan the agents measure is the agents' own find."""
        assert self.cm is not None and self.profile is not None
        points = [tuple(p.plan) for p in exact_frontier(self.cm)]
        self.store.set_meta("exact", [self.digest(p) for p in points])
        if self.cfg.warm_start:
            for p in points:
                self._record_prediction(p, "exact")
        return points

    def budgets(self, exact: list[tuple[int, ...]]) -> list[int]:
        assert self.cm is not None
        lo = min(self.cm.peak_bytes(list(p)) for p in exact)
        hi = self.cm.peak_bytes([self.cm.action_index(Action.KEEP)] * len(self.units))
        k = self.cfg.agents
        if k == 1:
            return [int((lo + hi) / 2)]
        return [int(lo + (hi - lo) * i / (k - 1)) for i in range(k)]

    # -- agents -------------------------------------------------------------------------------
    def _spawn(self, slot: AgentSlot) -> None:
        from agents.ppo import PPOAgent

        # a whole CPU each when there are enough; else a share, so that every agent starts
        # (they time-share the cores; measuring never overlaps training in model/hybrid mode)
        cpus = self.ray.cluster_resources().get("CPU", 1.0)
        remote = self.ray.remote(num_cpus=min(1.0, cpus / max(1, self.cfg.agents)), max_restarts=0)(PPOAgent)
        measure_fn = None
        if self.cfg.reward == "measured":
            measure_fn = _remote_measure(self.evaluator, self.profile.actions, slot.name)  # type: ignore[union-attr]
        slot.handle = remote.remote(slot.name, self.profile.model_dump(mode="json"), slot.budget_bytes,  # type: ignore[union-attr]
                                    slot.seed + 1000 * slot.restarts, self.cfg.reward, measure_fn,
                                    str(self.run_dir / "tb"), str(self.run_dir / "agents" / f"{slot.name}.zip"))

    def start_agents(self, budgets: list[int]) -> None:
        (self.run_dir / "agents").mkdir(exist_ok=True)
        done = {p["agent"]: p for p in self.store.progress()}
        self.store.set_meta("agents", [{"name": f"agent_{i}", "budget_bytes": b} for i, b in enumerate(budgets)])
        for i, b in enumerate(budgets):
            slot = AgentSlot(f"agent_{i}", b, self.cfg.seed + i)
            prev = done.get(slot.name)
            if prev:
                slot.timesteps, slot.restarts, slot.episodes = prev["timesteps"], prev["restarts"], prev["episodes"]
                slot.status = "finished" if prev["timesteps"] >= self.cfg.timesteps else "running"
            self.agents.append(slot)
            if slot.status == "running":
                self._spawn(slot)
            self._save_progress(slot)
        if self.cfg.reward == "hybrid":
            self.feed(self.measured_points())

    def _save_progress(self, slot: AgentSlot) -> None:
        self.store.set_progress(slot.name, budget_bytes=slot.budget_bytes, timesteps=slot.timesteps,
                                total_timesteps=self.cfg.timesteps, episodes=slot.episodes,
                                best_reward=None if math.isinf(slot.best_reward) else slot.best_reward,
                                status=slot.status, restarts=slot.restarts)

    def train_round(self) -> list[dict[str, Any]]:
        live = [s for s in self.agents if s.status == "running"]
        futures = {s.handle.train.remote(min(self.cfg.chunk_timesteps, self.cfg.timesteps - s.timesteps)): s
                   for s in live}
        reports = []
        for fut, slot in futures.items():
            try:
                rep = self.ray.get(fut)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.WorkerCrashedError) as e:
                self._agent_died(slot, e)
                continue
            slot.timesteps, slot.episodes, slot.best_reward = rep["timesteps"], rep["episodes"], rep["best_reward"]
            if slot.timesteps >= self.cfg.timesteps:
                slot.status = "finished"
            self._save_progress(slot)
            reports.append(rep)
        return reports

    def _agent_died(self, slot: AgentSlot, error: Exception) -> None:
        slot.restarts += 1
        cause = next((line.strip() for line in str(error).splitlines() if "Error" in line and line.strip()), "")
        slot.last_error = f"{type(error).__name__}: {cause[:200]}"
        if slot.restarts <= 1:
            self.state.events.append(f"{slot.name} died ({slot.last_error}) and was restarted from its last saved policy")
            slot.status = "running"
            self._spawn(slot)
            if self.cfg.reward == "hybrid":
                self.feed(self.measured_points(), [slot])
        else:
            self.state.events.append(f"{slot.name} died again ({slot.last_error}); the run went on without it")
            slot.status = "died"
        self._save_progress(slot)

    def kill_agent(self, name: str) -> None:
        """Kill an agent's process (fault-injection for tests and drills)."""
        slot = next(s for s in self.agents if s.name == name)
        self.ray.kill(slot.handle, no_restart=True)

    # -- measurement choice -------------------------------------------------------------------
    def digest(self, idx: tuple[int, ...]) -> str:
        return Plan.from_list(self.units, self.names(idx), self.profile.fingerprint).digest  # type: ignore[union-attr]

    def measured_points(self, sources: tuple[str, ...] | None = None) -> list[Result]:
        return self.state.archive.points(sources)

    def frontier(self, sources: tuple[str, ...] | None = None) -> list[Result]:
        return self.state.archive.frontier(sources)

    def hv(self, rows: list[Result]) -> float:
        return self.state.archive.hypervolume(rows, self.baseline())

    def baseline(self) -> Result | None:
        digest = self.store.get_meta("baseline_digest")
        return self.state.archive.measured.get(digest) if digest else None

    def snapshot(self) -> None:
        front = self.frontier()
        self.store.snapshot(len(front), self.hv(front))

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        self.prepare()
        self.measure_baselines()
        exact = self.exact()
        if cfg.warm_start:
            room = max(0, cfg.max_measurements - len(self.state.archive.measured))
            self.measure([(p, "exact") for p in spread_picks(exact, min(room, max(2, room // 2)))])
        self.start_agents(self.budgets(exact))
        self.snapshot()
        while any(s.status == "running" for s in self.agents):
            reports = self.train_round()
            for rep in reports:
                for p in rep["plans"]:
                    idx = tuple(p["actions"])
                    if rep["name"] not in self.state.archive.proposers.get(self.digest(idx), ()):
                        self._record_prediction(idx, rep["name"])
            if cfg.reward == "hybrid":
                self._measure_round()
            self.drain()  # measured mode: the agents' own measurements; else a no-op that empties the journal
            self.snapshot()
            if self.on_round:
                self.on_round(self)
        self._measure_round(final=True)
        self.remeasure_frontier()
        self.snapshot()

    def remeasure_frontier(self) -> None:
        """Measure the frontier's plans and the baseline once more: their records gain samples,
        so a point displaces another on medians of at least two measurements, not one."""
        digests = [r.digest for r in self.frontier()] + [self.store.get_meta("baseline_digest")]
        known = self.state.archive.measured
        todo = [d for d in dict.fromkeys(digests) if d in known]
        self.store.set_meta("remeasured", todo)
        for d in todo:
            result: Result = self._get(self.evaluator.evaluate.remote(list(known[d].actions), known[d].source, True))
            self._store_result(result)
            # the store's row holds every sample of the plan; keep the driver's view in step with it
            row = self.store.get(result.digest)
            assert row is not None
            self.state.archive.add(_from_store(row))

    def _measure_round(self, final: bool = False) -> None:
        rounds_left = sum(max(0, math.ceil((self.cfg.timesteps - s.timesteps) / self.cfg.chunk_timesteps))
                          for s in self.agents if s.status == "running") / max(1, len(self.agents))
        room = self.cfg.max_measurements - len(self.state.archive.measured)
        limit = room if final else max(1, math.ceil(room / (rounds_left + 1)))
        picked = self.state.archive.candidates(min(limit, room), self.digest, self.corrected().predict)
        results = self.measure([(p, self._proposer(p)) for p in picked])
        if self.cfg.reward == "hybrid":
            self.feed(results)

    def feed(self, results: list[Result], slots: list[AgentSlot] | None = None) -> None:
        """Hybrid reward: measurements go to the agents, whose env corrects the cost model with them."""
        assert self.profile is not None
        fed = [(list(self.indices(r.actions)), r.peak_bytes, _median(r.step_samples)) for r in results if not r.oom]
        if not fed:
            return
        for s in slots or self.agents:
            if s.status == "running":
                try:
                    self.ray.get(s.handle.observe.remote(fed))
                except self.ray.exceptions.RayActorError as e:
                    self._agent_died(s, e)

    def corrected(self) -> MeasuredCorrection:
        """The cost model corrected by every plan measured so far, as the agents' envs see it."""
        assert self.cm is not None
        c = MeasuredCorrection(self.cm)
        for r in self.measured_points():
            c.add(self.indices(r.actions), r.peak_bytes, _median(r.step_samples))
        return c

    def _proposer(self, idx: tuple[int, ...]) -> str:
        row = self.store.get(self.digest(idx))
        return row.source if row else "agent"


def _from_store(e: Evaluation) -> Result:
    """A measured store row as the driver's Result (not new: it is already recorded)."""
    return Result(tuple(e.actions), e.plan_digest, e.source, e.peak_bytes or 0, e.live_before_bytes or 0,
                  e.step_samples, e.oom, e.device or "", e.torch_version or "", e.batch_shape or "", False)


def _remote_measure(evaluator: Any, actions: list[Action], source: str) -> Callable[[list[int]], tuple[int, float]]:
    import ray

    def measure(idx: list[int]) -> tuple[int, float]:
        r: Result = ray.get(evaluator.evaluate.remote([actions[i].value for i in idx], source))
        return r.peak_bytes, _median(r.step_samples)

    return measure

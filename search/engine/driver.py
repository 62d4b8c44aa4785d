"""The search driver: profile, rules, exact frontier, agents, and rounds of measurement.

``prepare`` profiles the workload on the Evaluator (or reads the profile a resumed run stored)
and returns the typed ``SearchSetup`` before any loop exists. ``Driver.run`` then goes:
1. the baseline rules are measured, each as often as the frontier's plans end up, and the exact
   frontier solved on the cost model (its plans measured too with warm start);
2. in rounds, every live agent trains ``chunk_timesteps`` more steps (on the cost model in
   model/hybrid mode; in measured mode each new plan is measured through the Evaluator);
3. the agents' plans are recorded with their predictions; in hybrid mode the plans that
   could join the frontier are measured while the agents wait, so measurements never share
   the CPU with training, and go back to the agents, whose reward corrects the cost model;
4. the frontier (measured plans only) and its hypervolume are snapshotted into the store;
5. at the end the remaining measurement budget is spent, the agents answer the last
   measurements while some is left (``answer_rounds``), and the plans that decide the frontiers
   (theirs, the near misses, the rules near them) are measured side by side in deciding passes and
   ranked on those (``remeasure_frontier``).
Ctrl-C drains the Evaluator into the store and leaves it resumable.
"""

from __future__ import annotations

import math
import statistics
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from agents.baselines import baseline_rules
from agents.exact import exact_frontier
from env.cost.correction import TIME_NOISE
from env.cost.headroom import nothing_to_save
from env.data.codec import Indices
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan import Action
from env.data.types import RewardMode
from search.engine import ray_session
from search.engine.agent_pool import AgentPool
from search.engine.archive import spread_picks
from search.engine.evaluator_pool import EvaluatorPool, Job
from search.engine.ledger import Ledger, SearchSetup
from search.engine.progress import RoundStatus
from search.records.config import SearchConfig
from search.records.ranking import paired
from search.records.store import RunStore

EXACT_UNITS = 48  # more units: the exact solver's frontier merged to 0.5% steps
FRONTIER_MEASUREMENTS = 3  # the rules are measured until each has this many
DECIDING_MEASUREMENTS = 2  # the deciding passes measure each plan that decides a frontier this often, side by side
FINAL_PASSES = 4
ANSWER_ROUNDS = 2  # hybrid reward, after training: rounds in which the agents answer the last measurements
RULES_MEASURED = ("none", "all", "every_2", "every_3", "sqrt_n", "segments_2", "all_selective")


def exact_relative(n_units: int) -> float:
    """The exact solver's ``relative`` step for a search of ``n_units``: exact up to EXACT_UNITS;
    beyond, labels within 0.5% of each other merge (agents.exact), which kept 0.9997 of the exact
    hypervolume at 64 units in 1% of the time (bench/agents_scale.py)."""
    return 0.0 if n_units <= EXACT_UNITS else 0.005


def timing_noise(records: Sequence[MeasuredPlan]) -> float:
    """A run's timing noise: the median spread of its plans' step times over their medians, at
    least ``TIME_NOISE``."""
    spreads = [r.spread_seconds / r.step_seconds for r in records if len(r.step_seconds_samples) > 1]
    return max(TIME_NOISE, statistics.median(spreads)) if spreads else TIME_NOISE


def prepare(store: RunStore, pool: EvaluatorPool) -> SearchSetup:
    """The run's profile (measured now, or as a resumed run stored it) and what is made from it."""
    store.set_meta("evaluators", pool.describe())
    if store.get_meta("unit_choice") is None:
        store.set_meta("unit_choice", pool.slots[0].info["unit_choice"])
    prof_json = store.get_meta("profile")
    if prof_json is None:
        prof_json = ray_session.get(pool.first.profile.remote())
        store.set_meta("profile", prof_json)
    setup = SearchSetup.from_profile(ModelProfile.model_validate(prof_json))
    store.set_meta("headroom", nothing_to_save(setup.profile))  # None, or why no plan can save much
    store.set_meta("units", setup.profile.units)
    store.set_meta("fingerprint", setup.profile.fingerprint)
    return setup


class Driver:
    def __init__(self, cfg: SearchConfig, run_dir: Path, ledger: Ledger, pool: EvaluatorPool,
                 on_round: Callable[[RoundStatus], None] | None = None) -> None:
        self.cfg, self.run_dir, self.ledger, self.pool, self.on_round = cfg, run_dir, ledger, pool, on_round
        names = [a.value for a in ledger.codec.actions]
        measure_for = None
        if cfg.reward == RewardMode.MEASURED:  # each agent measures on one Evaluator, in turn
            measure_for = lambda agent: _remote_measure(  # noqa: E731
                pool.live[int(agent.rsplit("_", 1)[-1]) % len(pool.live)].handle, names, agent,
                ledger.setup.profile.baseline.step_seconds if ledger.setup.profile.baseline else None)
        self.agents = AgentPool(cfg, ledger, run_dir, measure_for)
        self.max_measurements = cfg.measurement_budget(ledger.codec.n_units)
        ledger.store.set_meta("max_measurements", self.max_measurements)
        self.overlap = cfg.overlap == "on" or (cfg.overlap == "auto" and pool.on_gpus)
        self._pending: tuple[threading.Thread, list[MeasuredPlan]] | None = None
        ledger.store.set_meta("measurement_mode", (
            f"overlapped: agents train while {len(pool.slots)} Evaluator(s) measure"
            + (" on GPUs" if pool.on_gpus else " (--overlap on)") if self.overlap else
            f"exclusive: agents wait while {len(pool.slots)} Evaluator(s) measure, as they would share CPU cores"))
        pool.preload(ledger.load_store())  # a resumed run: these are never measured again

    def _jobs(self, plans: Sequence[tuple[Indices, str]], again: bool) -> list[Job]:
        for idx, source in plans:
            self.ledger.propose(idx, source)
        return [(self.ledger.codec.names(idx), source, again) for idx, source in plans]

    def measure(self, plans: Sequence[tuple[Indices, str]], again: bool = False) -> list[MeasuredPlan]:
        """Measure (plan indices, source) pairs on the Evaluators; each is recorded as it arrives."""
        done = self.pool.measure(self._jobs(plans, again), on_result=self.ledger.record)
        self.drain()  # the reference measurements the Evaluators took before some of these plans
        self._pool_state()
        return done

    def _pool_state(self) -> None:
        """The Evaluators' deaths and restarts, into the events and the store, for the report."""
        self.ledger.events[:] = list(dict.fromkeys(self.ledger.events + self.pool.events))
        self.ledger.store.set_meta("evaluators", self.pool.describe())

    def measure_meanwhile(self, plans: Sequence[tuple[Indices, str]]) -> None:
        """Measure in a thread while the agents train (recorded as they arrive); ``collect`` joins it."""
        arrived: list[MeasuredPlan] = []

        def record(m: MeasuredPlan) -> MeasuredPlan:
            arrived.append(self.ledger.record(m))
            return arrived[-1]

        self._pending = (self.pool.measure_async(self._jobs(plans, False), on_result=record), arrived)

    def collect(self) -> list[MeasuredPlan]:
        """What the measurements started by ``measure_meanwhile`` gave (waits for them)."""
        if self._pending is None:
            return []
        thread, arrived = self._pending
        thread.join()
        self._pending = None
        self.drain()
        self._pool_state()
        return arrived

    def drain(self) -> None:
        """Record what the Evaluators measured apart from the driver's jobs: the reference plan
        (``reference_every``), the agents' own plans (measured mode), everything before Ctrl-C."""
        for m in self.pool.drain():
            self.ledger.record(m)  # proposes the plan first when it is new to the store

    def measure_baselines(self) -> None:
        codec = self.ledger.codec
        rules = baseline_rules(codec.n_units, list(codec.actions), seed=self.cfg.seed,
                               links=self.ledger.setup.profile.chain_links)
        chosen = {k: v for k, v in rules.items() if k in RULES_MEASURED}
        plans = [(tuple(v), f"rule:{k}") for k, v in chosen.items()]
        measured = self.measure(plans)
        store = self.ledger.store
        store.set_meta("rules", {k: m.digest for k, m in zip(chosen, measured)})
        self.measure_until_frontier_count(plans)
        self.ledger.set_baseline(measured[list(chosen).index("none")].digest)
        if len(self.pool.live) > 1:  # the baseline on every Evaluator: a systematically slower device shows
            each = self.pool.on_each(self.ledger.codec.names(chosen["none"]), "rule:none")
            store.set_meta("baseline_by_evaluator", {m.evaluators[0]: {"peak_bytes": m.peak_bytes, "step_seconds":
                                                     m.step_seconds, "clock": m.clock} for m in each})
            for m in each:
                self.ledger.record(m)
        for k, v in rules.items():
            if k not in chosen:
                self.ledger.propose(tuple(v), f"rule:{k}")

    def measure_until_frontier_count(self, plans: Sequence[tuple[Indices, str]]) -> None:
        """The rules measured again, pass by pass in their order, until each has
        ``FRONTIER_MEASUREMENTS`` measurements: the yardsticks
        the agents answer and the report judges them by. Measured once, a rule's time was off its
        quote by up to 10%, and the rules a slow measurement put behind the agents' frontier were the
        ones no agent plan was measured against: every rule a run's quote found beyond that frontier
        (gpt/small every_3, hf/resnet50 segments_2, hf/llama every_3, hf/gpt2 sqrt_n) had measured
        3-5% slower in its search than its quote. A resumed run measures only what is missing."""
        for _ in range(FRONTIER_MEASUREMENTS - 1):
            known = self.ledger.archive.measured
            todo = [(idx, src) for idx, src in plans if (m := known.get(self.ledger.codec.digest(idx))) is not None
                    and not m.oom and m.n_measurements < FRONTIER_MEASUREMENTS]
            if not todo:
                return
            self.measure(todo, again=True)

    def measure_peers(self) -> None:
        """What users pick instead (``env.measure.peers``), measured by the same Evaluators in this run."""
        kinds = {"none": (), "eager": ("hf_checkpointing", "checkpoint_sequential"),
                 "all": ("hf_checkpointing", "checkpoint_sequential", "compile_budget")}[self.cfg.peers]
        if not kinds:
            return
        done = set(self.ledger.store.get_meta("peers", {}))  # a resumed run measured these already
        offered = ray_session.get(self.pool.first.peers.remote(list(kinds), list(self.cfg.peer_budgets)))
        peers = [p for p in offered if p.name not in done]
        notes = {p.digest: p.note for p in peers}
        self.pool.measure_peers(peers, on_result=lambda m: self.ledger.record_peer(
            m.digest.removeprefix("peer:"), m, notes.get(m.digest, "")))
        self.drain()
        self._pool_state()

    def exact(self) -> list[Indices]:
        """The cost model's optimal frontier. Its plans join the candidates only with warm start,
        so that without it every plan the agents measure is the agents' own find."""
        relative = exact_relative(self.ledger.codec.n_units)
        points = [tuple(p.plan) for p in exact_frontier(self.ledger.setup.cost_model, relative=relative)]
        self.ledger.store.set_meta("exact_relative", relative)
        self.ledger.store.set_meta("exact", [self.ledger.codec.digest(p) for p in points])
        if self.cfg.warm_start:
            for p in points:
                self.ledger.propose(p, "exact")
        return points

    def budgets(self, exact: list[Indices]) -> list[int]:
        """One budget per agent, evenly from the lowest reachable peak to the baseline's."""
        cm = self.ledger.setup.cost_model
        lo = min(cm.peak_bytes(list(p)) for p in exact)
        hi = cm.peak_bytes(list(self.ledger.codec.uniform(Action.KEEP)))
        k = self.cfg.agents
        return [int((lo + hi) / 2)] if k == 1 else [int(lo + (hi - lo) * i / (k - 1)) for i in range(k)]

    def run(self) -> None:
        cfg, ledger = self.cfg, self.ledger
        self.measure_baselines()
        self.measure_peers()
        exact = self.exact()
        if cfg.warm_start:
            room = max(0, self.max_measurements - len(ledger.archive.measured))
            self.measure([(p, "exact") for p in spread_picks(exact, min(room, max(2, room // 2)))])
        self.agents.start(self.budgets(exact))
        ledger.snapshot()
        while self.agents.running:
            self._propose(self.agents.train_round())
            if cfg.reward == RewardMode.HYBRID:
                self._measure_round()
            if cfg.reward == RewardMode.MEASURED:
                self.drain()  # the agents' own measurements
            ledger.snapshot()
            if self.on_round:
                self.on_round(RoundStatus(cfg.workload, self.agents.slots, cfg.timesteps, ledger.store.snapshots()[-1]))
        self._measure_round(final=True)
        self.answer_rounds()
        self.remeasure_frontier()
        self.close_references()
        ledger.snapshot()

    def _propose(self, reports: list[dict[str, Any]]) -> int:
        """The agents' reported plans into the ledger; how many of them are not measured yet."""
        fresh = set()
        for rep in reports:
            for p in rep["plans"]:
                idx = tuple(p["actions"])
                if rep["name"] not in self.ledger.proposers(idx):
                    self.ledger.propose(idx, rep["name"])
                if self.ledger.codec.digest(idx) not in self.ledger.archive.measured:
                    fresh.add(idx)
        return len(fresh)

    def answer_rounds(self) -> None:
        """Hybrid reward, after the agents' timesteps, while measurements are left (at most
        ``ANSWER_ROUNDS``): the agents take in what the last round measured, clone the teacher on the
        corrected model once more without PPO steps (``AgentPool.train_round(answer=True)``), and the
        plans they propose that are not measured yet are measured as in a round. Else the last
        round's measurements never reach an agent, and a search whose agents' proposals were all
        measured leaves its budget unspent: a 6-unit gpt/small search measured 20 of its 33 plans, and
        on its final corrected model the plan KKRRRK at the memory of the rules every_2 and segments_2
        (45 MB) was predicted 0.8% faster than segments_2 measured, which no agent ever proposed; both
        rules stayed beyond the agents' frontier."""
        if self.cfg.reward != RewardMode.HYBRID:
            return
        rounds: list[dict[str, int]] = []  # store meta ``answer_rounds``: per round, plans new to the pool and measured
        for _ in range(ANSWER_ROUNDS):
            before = len(self.ledger.archive.measured)
            if before >= self.max_measurements:
                break
            proposed = self._propose(self.agents.train_round(answer=True))
            if proposed:
                self._measure_round(final=True)
                self.ledger.snapshot()
            rounds.append({"proposed": proposed, "measured": len(self.ledger.archive.measured) - before})
            self.ledger.store.set_meta("answer_rounds", rounds)
            if not proposed:
                break

    def remeasure_frontier(self) -> None:
        """The deciding passes at the end. The plans that decide the frontier and the agents' own
        frontier (``deciding``) are measured once each, in peak order, then again in reverse order,
        and from then on each plan those passes took or let in is measured until it has
        ``DECIDING_MEASUREMENTS`` of them (at most ``FINAL_PASSES`` passes); every plan measured
        in them is ranked on those measurements alone (``Ledger.decide_from_here``), so a plan one
        slow measurement put off the frontier in the first pass gets its second (gpt/small: the
        agents' RRRKKK, 1.158 of the baseline over three measurements in the search, 1.251 in the
        first pass, and left there; its quote had it 3.5% ahead of the agents' frontier). Selected on one
        noisy median, a frontier is its luckiest plans, and measured minutes apart, plans are ranked
        through a drift that pairing with references removes only when it moves every plan alike: on
        a 6-unit hf/gpt2 search a plan measured three times while the machine was slow ranked ahead
        of the agents' plans measured later, and the rules every_2 and segments_2, measured at the
        start, ranked ahead of both; its quote, every plan side by side, put the rules 6% beyond the
        agents' frontier. Side by side, the order the passes give is the order a quote gives. Store
        meta ``remeasured``: the passes' digests, in order; ``deciding_passes``: each pass's."""
        noise = timing_noise(self.ledger.points())
        self.ledger.decide_from_here()
        done: list[str] = []
        passes: list[list[str]] = []  # store meta ``deciding_passes``: the digests each pass measured
        for k in range(FINAL_PASSES):
            todo = [d for d in dict.fromkeys([*done, *self.deciding(noise)]) if done.count(d) < DECIDING_MEASUREMENTS]
            if not todo:
                break
            before = len(done)
            done = self._remeasure(todo[::-1] if k % 2 else todo, done)
            passes.append(done[before:])
            self.ledger.store.set_meta("deciding_passes", passes)

    def deciding(self, noise: float) -> list[str]:
        """The plans that decide the frontiers as ranked now: the frontier of all plans and the agents'
        own frontier, the plans that missed either by less than ``noise`` (``ParetoArchive.contenders``;
        the rules near the agents' frontier among them), and the baseline; by frontier, then peak."""
        ledger, both = self.ledger, (None, ("agent",))
        plans = [r.digest for src in both for r in ledger.frontier(src) + ledger.contenders(noise, src)]
        return list(dict.fromkeys([*plans, ledger.store.get_meta("baseline_digest")]))

    def close_references(self) -> None:
        """With references on, the baseline once more on every live Evaluator after the final passes, so
        that the plans those passes measured last have a reference after them as well as before
        (``search.records.ranking.Ranking`` takes each measurement against the references nearest to it, on both
        sides); else they were ranked against the references before them alone."""
        base = self.ledger.baseline()
        if not self.cfg.reference_every or self.cfg.compile or base is None:
            return
        for m in self.pool.on_each(base.actions, "rule:none"):
            self.ledger.record(m)

    def _remeasure(self, digests: Sequence[str], done: list[str]) -> list[str]:
        known = self.ledger.archive.measured
        todo = [d for d in dict.fromkeys(digests) if d in known]
        self.ledger.store.set_meta("remeasured", done + todo)
        self.measure([(self.ledger.codec.indices(known[d].actions), known[d].source) for d in todo], again=True)
        return done + todo

    def _measure_round(self, final: bool = False) -> None:
        arrived = self.collect()  # overlapped: last round's measurements, taken while the agents trained
        if arrived and self.cfg.reward == RewardMode.HYBRID:
            self.agents.feed(arrived)
        room = self.max_measurements - len(self.ledger.archive.measured)
        limit = room if final else max(1, math.ceil(room / (self.agents.rounds_left() + 1)))
        picked = [(p, self._proposer(p))
                  for p in self.ledger.candidates(min(limit, room), margin=timing_noise(self.ledger.points()))]
        if self.overlap and not final:
            self.measure_meanwhile(picked)
            return
        measured = self.measure(picked)
        if self.cfg.reward == RewardMode.HYBRID:
            self.agents.feed(measured)

    def _proposer(self, idx: Indices) -> str:
        proposers = self.ledger.proposers(idx)
        return proposers[0] if proposers else "agent"


def _remote_measure(evaluator: Any, action_names: list[str], source: str,
                    scale: float | None) -> Callable[[list[int]], tuple[int, float]]:
    """The function agent ``source`` calls to measure a plan (measured reward): through the Evaluator,
    its time paired with the Evaluator's reference in the profiled baseline's seconds (``scale``)."""
    import ray

    def measure(idx: list[int]) -> tuple[int, float]:
        m: MeasuredPlan = ray.get(evaluator.evaluate.remote([action_names[i] for i in idx], source))
        return m.peak_bytes, paired(m, scale).step_seconds

    return measure

"""The search driver: a run, phase by phase (``search.engine.phases``).

``prepare`` profiles the workload on the Evaluator (or reads the profile a resumed run stored)
and returns the typed ``SearchSetup`` before any loop exists. ``Driver.run`` then takes the
phases in order: the baseline rules, the peers, the exact frontier (and its warm start), the
agents' rounds (their actors start beside the rules), their answer rounds, the deciding passes
with the closing references, the confirming passes that the frontier is reported from, and with
``--compile-scope both`` the whole-model pass over that frontier, then the correctness gate over the plans
shown (``search.engine.phases.gate``). Ctrl-C
drains the Evaluators into the store (``Driver.drain``) and leaves it resumable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from env.data.types import RewardMode
from search.engine.agent_pool import AgentPool
from search.engine.evaluator_pool import EvaluatorPool
from search.engine.ledger import Ledger
from search.engine.measurer import Measurer, agents_measure
from search.engine.phase_clock import PhaseClock
from search.engine.context import RunContext
from search.engine.phases.deciding import confirming_passes, deciding_passes
from search.engine.phases.gate import gate_rules, gate_shown
from search.engine.phases.exact import budgets, exact_relative, measure_warm_start, solve_exact
from search.engine.phases.peers import measure_peers
from search.engine.phases.prepare import prepare
from search.engine.phases.rounds import answer_rounds, train_rounds
from search.engine.phases.rules import RULES_MEASURED, measure_rules
from search.engine.phases.throughput import probe_throughput, search_throughput
from search.engine.phases.whole_model import whole_model_pass
from search.engine.progress import RoundStatus
from search.records import meta
from search.records.config import SearchConfig

__all__ = ["Driver", "prepare", "RULES_MEASURED", "exact_relative"]


class Driver:
    """One search run over a prepared ledger and a pool of Evaluators: ``run`` it, ``drain`` it on Ctrl-C."""

    def __init__(self, cfg: SearchConfig, run_dir: Path, ledger: Ledger, pool: EvaluatorPool,
                 on_round: Callable[[RoundStatus], None] | None = None, clock: PhaseClock | None = None,
                 agent_processes: list[Any] | None = None) -> None:
        """``agent_processes``: the agents' processes, started before the profile
        (``search.engine.agent_pool.start_processes``)."""
        self.cfg, self.run_dir, self.ledger, self.pool, self.on_round = cfg, run_dir, ledger, pool, on_round
        overlap = cfg.overlap == "on" or (cfg.overlap == "auto" and pool.on_gpus)
        self.measurer = Measurer(ledger, pool, overlap)
        for event in pool.events:  # those of the Evaluators' start; the rest into the store as they happen
            ledger.note(event)
        pool.on_event = self._event
        measure_for = None
        if cfg.reward == RewardMode.MEASURED:  # each agent measures on one Evaluator, in turn
            baseline = ledger.setup.profile.baseline
            measure_for = agents_measure(pool, [a.value for a in ledger.codec.actions],
                                         baseline.step_seconds if baseline else None)
        self.agents = AgentPool(cfg, ledger, run_dir, measure_for, pool.deadlines, processes=agent_processes)
        self.max_measurements = cfg.measurement_budget(ledger.codec.n_units)
        ledger.store.write(meta.MAX_MEASUREMENTS, self.max_measurements)
        ledger.store.write(meta.MEASUREMENT_MODE, self.measurer.mode)
        pool.preload(ledger.load_store())  # a resumed run: these are never measured again
        self.clock = clock or PhaseClock(ledger.store)
        self.context = RunContext(cfg, ledger, self.measurer, self.agents, self.max_measurements, self.clock)

    def _event(self, text: str) -> None:
        """An Evaluator's death or restart, into the store as it happens, with the Evaluators' state."""
        self.ledger.note(text)
        self.ledger.store.write(meta.EVALUATORS, self.pool.describe())

    def run(self) -> None:
        ctx, phase = self.context, self.clock.phase
        throughput = None
        if self.cfg.throughput_mode:
            with phase("throughput probe"):  # a cap nothing fits fails here
                throughput = probe_throughput(ctx)
        self.agents.spawn()  # they start while the Evaluators measure; "agents' start" waits for them
        with phase("rules"):
            measure_rules(ctx)
        with phase("correctness gate"):
            gate_rules(ctx)  # a unit a rule's recompute breaks is kept by every plan proposed from here
        with phase("peers"):
            measure_peers(ctx)
        with phase("exact solver"):
            exact = solve_exact(ctx)
        with phase("warm start"):
            measure_warm_start(ctx, exact)
        with phase("agents' start"):
            self.agents.start(budgets(ctx, exact))
        train_rounds(ctx, self.on_round)  # its own phases: training, measuring
        with phase("answer rounds"):
            answer_rounds(ctx)
        with phase("deciding passes"):
            deciding_passes(ctx)  # the closing references among them
        confirming_passes(ctx)  # its own phases: confirming passes, verdict rounds
        if self.cfg.whole_model_pass:
            with phase("whole-model pass"):
                whole_model_pass(ctx, exact)
        with phase("correctness gate"):
            gate_shown(ctx)  # every plan shown checked on the workload; a plan that fails is never shown
        if throughput is not None:
            search_throughput(ctx, throughput)  # its own phases: fit, plans, peers, candidates, deciding, quote
        self.ledger.snapshot()
        self.ledger.store.write(meta.EVALUATOR_SECONDS, self.pool.seconds())

    def drain(self) -> None:
        """What the Evaluators measured and the store lacks, into it (Ctrl-C: nothing measured is lost;
        docs/measurement.md#how-a-measurement-reaches-the-store)."""
        self.measurer.drain()

"""RunContext: what every phase of a search works with."""

from __future__ import annotations

from dataclasses import dataclass

from search.engine.agent_pool import AgentPool
from search.engine.ledger import Ledger
from search.engine.measurer import Measurer
from search.engine.phase_clock import PhaseClock
from search.records.config import SearchConfig


@dataclass(frozen=True)
class RunContext:
    """The config, what is known (``ledger``), how plans get measured (``measurer``), the agents,
    and how many plans the run measures at most (rules and baseline included)."""

    cfg: SearchConfig
    ledger: Ledger
    measurer: Measurer
    agents: AgentPool
    max_measurements: int
    clock: PhaseClock  # where the wall time goes, by phase

    @property
    def n_measured(self) -> int:
        """Distinct plans measured so far."""
        return len(self.ledger.archive.measured)

"""The project's shared aliases and constants, in one place (as SB3's ``type_aliases``).

- ``MIB``: bytes in a MiB. Every memory figure the project shows or writes (``*_mb`` in result
  files, ``--budget-mb``, plan file names) is in MiB; "MB" in option names, as nvidia-smi says.
- ``Indices``: a plan as profile action indices, one per unit (what the cost model, the exact
  solver and the agents speak).
- ``RewardMode``: where the agents' reward reads a plan's peak and time from.
- ``PlanSource``: who proposed a plan (a rule, the exact solver, an agent, a peer), and
  ``SourceKind``, which of those.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import ClassVar

from env.data.errors import PlanError

MIB = 2**20

Indices = tuple[int, ...]


class RewardMode(str, Enum):
    """Where the agents' reward reads a plan's peak and time from."""

    MEASURED = "measured"  # every new plan measured
    MODEL = "model"  # the cost model only
    HYBRID = "hybrid"  # the cost model corrected by measurements (env.cost.correction); frontier points measured

    def __str__(self) -> str:
        return self.value


class SourceKind(str, Enum):
    """Which kind of proposer a ``PlanSource`` names."""

    RULE = "rule"  # a baseline rule (agents.baselines), by its name
    AGENT = "agent"  # a PPO agent of the search, by its index
    EXACT = "exact"  # the exact solver on the cost model
    PEER = "peer"  # what users pick instead (env.measure.peers), by its name; never on the plans' frontier

    def __str__(self) -> str:
        return self.value


_FORMS = re.compile(r"rule:(?P<rule>[^\s:]+)|agent_(?P<agent>\d+)|(?P<exact>exact)|peer:(?P<peer>\S+)")


class PlanSource(str):
    """Who proposed a plan, as it is stored: ``rule:<name>``, ``agent_<i>``, ``exact`` or
    ``peer:<name>``. It is the stored string itself (a ``str``), checked once when made, so it
    travels through records, the store and JSON unchanged; ``kind``, ``name`` and ``index`` read
    it. ``PlanSource(text)`` parses; a string of no known form is refused in one line."""

    EXACT: ClassVar[PlanSource]

    def __new__(cls, text: str) -> PlanSource:
        if isinstance(text, PlanSource):
            return text
        if not isinstance(text, str) or not _FORMS.fullmatch(text):
            raise PlanError(f"plan source {text!r} is none of rule:<name>, agent_<i>, exact, peer:<name>; "
                            "make sources with PlanSource.rule, .agent, .peer or PlanSource.EXACT")
        return super().__new__(cls, text)

    @classmethod
    def rule(cls, name: str) -> PlanSource:
        return cls(f"rule:{name}")

    @classmethod
    def agent(cls, index: int) -> PlanSource:
        return cls(f"agent_{int(index)}")

    @classmethod
    def peer(cls, name: str) -> PlanSource:
        return cls(f"peer:{name}")

    def _match(self) -> re.Match[str]:
        match = _FORMS.fullmatch(self)
        assert match is not None  # checked in __new__
        return match

    @property
    def kind(self) -> SourceKind:
        group = self._match().lastgroup
        return SourceKind(group)

    @property
    def name(self) -> str:
        """The rule's or the peer's name, the agent's name (``agent_<i>``), or ``exact``."""
        match = self._match()
        return match["rule"] or match["peer"] or str(self)

    @property
    def index(self) -> int:
        """The agent's index; a source of another kind has none (PlanError)."""
        match = self._match()
        if match["agent"] is None:
            raise PlanError(f"plan source '{self}' is not an agent's and has no index; ask .kind first")
        return int(match["agent"])


PlanSource.EXACT = PlanSource("exact")

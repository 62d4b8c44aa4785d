"""The project's shared aliases and constants, in one place (as SB3's ``type_aliases``).

- ``MIB``: bytes in a MiB. Every memory figure the project shows or writes (``*_mb`` in result
  files, ``--budget-mb``, plan file names) is in MiB; "MB" in option names, as nvidia-smi says.
- ``Indices``: a plan as profile action indices, one per unit (what the cost model, the exact
  solver and the agents speak).
- ``RewardMode``: where the agents' reward reads a plan's peak and time from.
- ``PlanSource``: who proposed a plan (a rule, the exact solver, an agent, a peer).
"""

from __future__ import annotations

from enum import Enum

MIB = 2**20

Indices = tuple[int, ...]


class RewardMode(str, Enum):
    """Where the agents' reward reads a plan's peak and time from."""

    MEASURED = "measured"  # every new plan measured
    MODEL = "model"  # the cost model only
    HYBRID = "hybrid"  # the cost model corrected by measurements (env.cost.correction); frontier points measured

    def __str__(self) -> str:
        return self.value



"""PlanCodec: one run's plans as action indices, action names, digests and ``Plan`` objects.

The agents, the cost model and the exact solver speak in action indices (into the profile's
actions); the store, the Evaluator and exported files in action names; everything that keys
a plan uses its digest. A codec is made once per run from the units, the actions and the
model fingerprint, and converts between the forms without building objects per call
(digests are cached). Torch-free.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from env.data.errors import PlanError
from env.data.plan import Action, Plan, parse_action, plan_digest

Indices = tuple[int, ...]


class PlanCodec:
    """``names(idx)``, ``indices(names)``, ``digest(idx)``, ``plan(idx)`` for one run's units and actions."""

    def __init__(self, units: Sequence[str], actions: Sequence[Action | str], fingerprint: str) -> None:
        self.units = tuple(units)
        self.actions = tuple(parse_action(a) for a in actions)
        self.fingerprint = fingerprint
        self._names = tuple(a.value for a in self.actions)
        self._index = {name: i for i, name in enumerate(self._names)}
        self._cached_digest = lru_cache(maxsize=None)(self._digest)

    @property
    def n_units(self) -> int:
        return len(self.units)

    def names(self, idx: Sequence[int]) -> tuple[str, ...]:
        return tuple(self._names[i] for i in idx)

    def indices(self, names: Sequence[str | Action]) -> Indices:
        try:
            return tuple(self._index[a.value if isinstance(a, Action) else a] for a in names)
        except KeyError as e:
            raise PlanError(f"action {e.args[0]!r} is not one this run searches ({', '.join(self._names)}); "
                            "measure plans of the run's own actions") from None

    def index(self, action: Action | str) -> int:
        return self.indices([action])[0]

    def digest(self, idx: Sequence[int]) -> str:
        """The plan's digest (``Plan.digest``), cached per plan."""
        return self._cached_digest(tuple(int(i) for i in idx))

    def _digest(self, idx: Indices) -> str:
        if len(idx) != len(self.units):
            raise PlanError(f"{len(idx)} actions for {len(self.units)} units; give one action per unit")
        return plan_digest(self.fingerprint, dict(zip(self.units, self.names(idx))))

    def plan(self, idx: Sequence[int]) -> Plan:
        return Plan.from_list(self.units, self.names(idx), self.fingerprint)

    def uniform(self, action: Action | str) -> Indices:
        return (self.index(action),) * len(self.units)

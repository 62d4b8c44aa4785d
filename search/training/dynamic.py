"""``DynamicPlan``: pick the checkpoint plan for the memory free now, and the batch shape.

Memory available to training changes (another job on the GPU, a longer sequence bucket).
Given one frontier per batch shape, ``select`` returns the fastest measured plan that fits;
``apply`` also installs it on a model, swapping the previous plan out only when the choice
changes (a new batch shape, or a budget that no longer fits)::

    dyn = DynamicPlan([load_frontier("runs/seq256"), load_frontier("runs/seq512")])
    free, _ = torch.cuda.mem_get_info()
    dyn.apply(model, free, batch_shape="idx:8x512,targets:8x512", activation_only=True)

``free_bytes`` is compared with a point's ``peak_bytes`` (everything the step holds: weights,
optimizer state, activations) or, with ``activation_only=True``, with its activation part:
the right choice when the model and optimizer are already resident and ``free_bytes`` is what
the device reports free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch.nn as nn

from env.data.plan import Plan
from env.runtime.apply import AppliedPlan, apply_actions
from search.records.frontier_file import FrontierError, FrontierFile, FrontierPoint


@dataclass(frozen=True)
class Choice:
    """The plan picked for a budget and batch shape, with the measured point it comes from."""

    plan: Plan
    point: FrontierPoint
    batch_shape: str


class DynamicPlan:
    """Chooses among the frontiers of one model, one frontier per batch shape."""

    def __init__(self, frontiers: FrontierFile | Sequence[FrontierFile]) -> None:
        items = [frontiers] if isinstance(frontiers, FrontierFile) else list(frontiers)
        if not items:
            raise FrontierError("DynamicPlan needs at least one frontier; load one with search.load_frontier(RUN_DIR)")
        self.frontiers: dict[str, FrontierFile] = {}
        for f in items:
            if f.batch_shape in self.frontiers:
                raise FrontierError(f"two frontiers for batch shape '{f.batch_shape}'; give one per batch shape")
            if f.fingerprint != items[0].fingerprint:
                raise FrontierError(f"frontiers of different models ('{items[0].workload}' fingerprint "
                                    f"{items[0].fingerprint}, '{f.workload}' {f.fingerprint}); give frontiers of one model")
            self.frontiers[f.batch_shape] = f
        self.current: Choice | None = None
        self._handle: AppliedPlan | None = None

    def frontier(self, batch_shape: str | None = None) -> FrontierFile:
        if batch_shape is None:
            if len(self.frontiers) == 1:
                return next(iter(self.frontiers.values()))
            raise FrontierError(f"{len(self.frontiers)} batch shapes are known ({', '.join(self.frontiers)}); "
                                "name one with batch_shape=")
        if batch_shape not in self.frontiers:
            raise FrontierError(f"no frontier for batch shape '{batch_shape}'; known: {', '.join(self.frontiers)}; "
                                "search that batch shape too (python -m search.run) and pass its frontier")
        return self.frontiers[batch_shape]

    def select(self, free_bytes: int, batch_shape: str | None = None, activation_only: bool = False) -> Choice:
        """The fastest plan whose memory fits ``free_bytes`` (a one-line error naming the smallest if none)."""
        frontier = self.frontier(batch_shape)
        point = frontier.fastest_within(free_bytes, activation_only=activation_only)
        return Choice(frontier.plan(point), point, frontier.batch_shape)

    def apply(self, model: nn.Module, free_bytes: int, batch_shape: str | None = None,
              activation_only: bool = False) -> Choice:
        """Select, and install the choice on ``model`` if it differs from the one installed."""
        choice = self.select(free_bytes, batch_shape, activation_only)
        if self._handle is not None and self.current is not None and choice.plan.digest == self.current.plan.digest:
            return choice
        self.remove()
        self._handle = apply_actions(model, choice.plan)
        self.current = choice
        return choice

    def remove(self) -> None:
        """Take the installed plan off the model (nothing if none is installed)."""
        if self._handle is not None:
            self._handle.remove()
        self._handle, self.current = None, None

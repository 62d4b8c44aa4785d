"""``ModelProfile``: per unit and action, the memory and time of that unit's part of a training
step (measured by ``env.measure.measurement.profiler``). The cost model, the exact solver, the agents and the
dashboard see a model only through it. Torch-free.

A step's timeline is cut by the unit marks (see ``env.measure.measurement.timeline``) into segments::

    pre | F_0 | F_1 | ... | F_{n-1} | post | B_{n-1} | ... | B_0 | tail

``F_i`` is unit i's forward (until the next unit starts; for the last unit, until its output's
gradient arrives, so the head and the loss are part of it), ``B_i`` its backward (from its
output's gradient until the previous unit's), ``pre``/``tail`` the rest (embeddings, optimizer
step). ``post`` is empty: the head's bytes depend on the last unit's action, so they are
measured as part of that unit under each action.
"""

from __future__ import annotations

from pydantic import BaseModel

from env.data.measured import MeasuredPlan
from env.data.plan import Action


class Segment(BaseModel):
    delta_bytes: int  # net bytes allocated (negative: freed) over the segment
    rise_bytes: int  # highest point above the segment's start, >= 0
    seconds: float  # median time, read from the profile's clock


class UnitCost(BaseModel):
    fwd: Segment
    bwd: Segment

    @property
    def kept_bytes(self) -> int:
        """Bytes this unit keeps for backward (forward's net allocation)."""
        return self.fwd.delta_bytes

    @property
    def backward_peak_bytes(self) -> int:
        """Bytes live above the start of its backward: recomputed activations and gradients."""
        return self.bwd.rise_bytes

    @property
    def grad_bytes(self) -> int:
        """What the unit leaves live after its backward (its weight gradients)."""
        return self.fwd.delta_bytes + self.bwd.delta_bytes

    @property
    def seconds(self) -> float:
        return self.fwd.seconds + self.bwd.seconds


class ModelProfile(BaseModel):
    """What the cost model, the exact solver and the agents see of a model."""

    workload: str
    batch_shape: str
    device: str
    fingerprint: str
    units: list[str]  # in execution order
    actions: list[Action]  # the actions profiled, in this order
    base_bytes: int  # live before the step
    pre: Segment
    post: Segment
    tail: Segment
    costs: dict[Action, list[UnitCost]]  # costs[action][unit index]
    baseline: MeasuredPlan | None = None  # all-keep, measured
    clock: str = "wall"  # what segment seconds were read from (env.measure.timeline.step_clock)

    def cost(self, unit: int, action: Action) -> UnitCost:
        return self.costs[action][unit]

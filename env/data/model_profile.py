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

**Chains** (``env.data.plan``: a ``recompute`` unit and the ``chain`` units after it, recomputed
as one region). ``chain_links[i]`` says whether unit i may continue the region of unit i-1 (its
input is that unit's output and nothing else uses it; found on a real step by
``env.runtime.chains``). A unit's costs under ``chain`` follow from its measured costs under
``recompute`` (``chain_costs``): in forward a region's unit runs as a recomputed one does, but
nothing keeps its input, which it frees once read; in backward the whole region is recomputed at
once, which the cost model (``env.cost.cost_model``) builds from the units' ``keep`` costs. So
a chain needs no profiled step of its own; the profile's check measures chained plans against
their predictions (``env.measure.profiler.check_profile``).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

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
    # chain_links[i]: unit i may continue the chain region of unit i - 1 (always False for unit 0);
    # empty: no unit chains (profiles made before chains)
    chain_links: list[bool] = Field(default_factory=list)
    # chunk_units[i]: unit i is a loss unit (final norm, head and loss), the only kind 'chunked' applies to;
    # empty: none is (profiles made before the loss unit)
    chunk_units: list[bool] = Field(default_factory=list)
    # block_spans: (start, stop) of each run of units that are all of one parent module's units, which 'block'
    # recomputes as that module (env.runtime.chains.block_spans); empty: no such run (or profiles made before blocks)
    block_spans: list[tuple[int, int]] = Field(default_factory=list)

    def links(self) -> list[bool]:
        """``chain_links`` with one entry per unit (all False when the profile has none)."""
        return list(self.chain_links) if self.chain_links else [False] * len(self.units)

    def allows(self, unit: int, action: Action) -> bool:
        """Whether unit ``unit`` may take ``action``: ``chunked`` only on a loss unit (``chunk_units``); where a
        ``chain`` may go is the cost model's business (it continues a region)."""
        return action != Action.CHUNKED or bool(self.chunk_units and self.chunk_units[unit])

    def cost(self, unit: int, action: Action) -> UnitCost:
        return self.costs[action][unit]


def chain_costs(recompute: list[UnitCost]) -> list[UnitCost]:
    """Each unit's costs under ``chain``, from its costs under ``recompute``.

    Forward: what recomputing it allocates, less its input, unit i-1's output (what unit i-1
    leaves allocated under recompute), which no one in a region keeps, freed once unit i has
    read it; its rise is that of recomputing it (the input is freed after). Backward: as under
    recompute, for the last unit of a region (the cost model takes the other units' backward from
    ``keep``). Seconds: as under recompute, forward and backward, since a region reruns each of
    its units once. Unit 0 cannot chain; its entry repeats ``recompute`` to keep one per unit.
    """
    out = [recompute[0]] if recompute else []
    for before, unit in zip(recompute, recompute[1:]):
        fwd = Segment(delta_bytes=unit.fwd.delta_bytes - before.fwd.delta_bytes, rise_bytes=unit.fwd.rise_bytes,
                      seconds=unit.fwd.seconds)
        out.append(UnitCost(fwd=fwd, bwd=unit.bwd))
    return out


def block_costs(recompute: list[UnitCost], spans: list[tuple[int, int]]) -> list[UnitCost]:
    """Each unit's costs under ``block``: a span's first unit as under ``recompute`` (it keeps the parent's input),
    the others as under ``chain`` (``chain_costs``: nothing kept; the cost model reruns the span at once in backward,
    as a chain region). A unit in no span repeats ``recompute``, to keep one entry per unit."""
    chained = chain_costs(recompute)
    out = list(recompute)
    for start, stop in spans:
        out[start + 1:stop] = chained[start + 1:stop]
    return out

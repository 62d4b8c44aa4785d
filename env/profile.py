"""ModelProfile: per unit and action, the memory and time of that unit's part of the step.

A step's timeline is cut by the unit marks (see ``env.timeline``) into segments::

    pre | F_0 | F_1 | ... | F_{n-1} | post | B_{n-1} | ... | B_0 | tail

``F_i`` is unit i's forward (until the next unit starts; for the last unit, until its output's
gradient arrives, so the head and the loss are part of it), ``B_i`` its backward (from its
output's gradient until the previous unit's), ``pre``/``tail`` the rest (embeddings, optimizer
step). ``post`` is empty: the head's bytes depend on the last unit's action (whether its output
stays live through the head), so they are measured as part of that unit under each action. Each segment has ``delta_bytes`` (net allocation: what it
leaves live), ``rise_bytes`` (its highest point above its start) and ``seconds``.

``profile()`` measures every unit under every action by running the step once per action with
all units set to it (plans are applied per unit, so the segments of a mixed plan are those
segments). Memory comes from the same profiler events as ``measure``, the allocations of the
workload's device (``env.trace``); times from timed steps with marks, medians over repeats.
Before it is returned, the profile's predicted peaks of the uniform plans are checked against
their measured peaks (``check_profile``). The result is plain data: the cost model and the exact
solver read only this.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import torch
from pydantic import BaseModel

from env.apply import apply_actions, plan_for
from env.errors import MeasurementError
from env.measure import Measurement, live_bytes, measure
from env.plan import Action
from env.timeline import MemoryTrace, UnitMarkers, profiled_step, step_clock, train_step
from env.trace import PeakCheck, Segments, check_peaks
from env.trace import step_segments as _segments
from env.workloads import Workload


class Segment(BaseModel):
    delta_bytes: int  # net bytes allocated (negative: freed) over the segment
    rise_bytes: int  # highest point above the segment's start, >= 0
    seconds: float  # median wall time


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


class ModelProfile(BaseModel):
    """Plain data: what the cost model, the exact solver and the agents see of a model."""

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
    baseline: Measurement | None = None  # all-keep, measured
    clock: str = "wall"  # what segment seconds were read from (env.timeline.step_clock)

    def cost(self, unit: int, action: Action) -> UnitCost:
        return self.costs[action][unit]


def _execution_order(workload: Workload, units: Sequence[str], optimizer: torch.optim.Optimizer) -> list[str]:
    with UnitMarkers(workload.model, units) as markers:
        train_step(workload, optimizer, markers)
    first: dict[int, int] = {}
    for name, t in markers.marks:
        if name.startswith("fwd_pre:"):
            first.setdefault(int(name.split(":")[1]), t)
    if len(first) != len(units):
        never = [u for i, u in enumerate(units) if i not in first]
        raise MeasurementError(f"unit '{never[0]}' did not run in a training step; choose units the forward uses")
    return [units[i] for i in sorted(first, key=first.get)]


def _memory(workload: Workload, optimizer: torch.optim.Optimizer, units: Sequence[str],
            action: Action) -> tuple[MemoryTrace, Segments, int]:
    """One profiled step with every unit under ``action``: its trace, segments and base bytes."""
    plan = plan_for(workload.model, units, [action] * len(units))
    with apply_actions(workload.model, plan, units):
        train_step(workload, optimizer)
        base_bytes = live_bytes(workload, optimizer)
        with UnitMarkers(workload.model, units) as markers:
            trace = profiled_step(workload, optimizer, markers)
    return trace, _segments(trace.marks, len(units)), base_bytes


def _timed(workload: Workload, optimizer: torch.optim.Optimizer, units: Sequence[str], action: Action,
           segs: Segments, times: dict[str, list[float]]) -> None:
    """One timed step with every unit under ``action``; appends each segment's seconds to ``times``."""
    plan = plan_for(workload.model, units, [action] * len(units))
    with apply_actions(workload.model, plan, units):
        with UnitMarkers(workload.model, units, sync_cuda=workload.device.type == "cuda",
                         clock=step_clock(workload.device)[1]) as timed:
            train_step(workload, optimizer, timed)
    ns = dict(timed.marks)
    for name, a, b in segs:
        times.setdefault(name, []).append((ns[b] - ns[a]) / 1e9)


def profile(workload: Workload, units: Sequence[str], actions: Sequence[Action] = (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE),
            repeats: int = 3, baseline: bool = True, check: bool = True) -> ModelProfile:
    """Measure every unit under every action (one profiled and ``repeats`` timed steps per action).

    The timed steps go in rounds over the actions (keep, recompute, selective, then again, each
    round starting one further on), so a change of machine load during profiling falls on every
    action alike instead of making one action look slow; each segment's time is its median.
    ``check``: refuse the profile (``MeasurementError``) unless its predicted peaks of the uniform
    plans match their measured peaks (``check_profile``).
    """
    from env.plan import fingerprint  # local: keeps the import graph one-directional at module load

    optimizer = workload.meta.get("_optimizer") or workload.optimizer_factory(workload.model.parameters())
    workload.meta["_optimizer"] = optimizer
    train_step(workload, optimizer)  # optimizer state exists from here on
    units = _execution_order(workload, units, optimizer)
    n = len(units)
    memory = {action: _memory(workload, optimizer, units, action) for action in actions}
    base_bytes = memory[actions[-1]][2]
    times: dict[Action, dict[str, list[float]]] = {action: {} for action in actions}
    for r in range(repeats):
        for action in list(actions[r % len(actions):]) + list(actions[:r % len(actions)]):
            _timed(workload, optimizer, units, action, memory[action][1], times[action])
    per_action: dict[Action, dict[str, Segment]] = {}
    for action, (trace, segs, _) in memory.items():
        per_action[action] = {
            name: Segment(delta_bytes=d, rise_bytes=r, seconds=statistics.median(times[action][name]))
            for (name, a, b) in segs for d, r in [trace.segment(trace.marks[a], trace.marks[b])]
        }
    keep = per_action[actions[0]]
    base_m = None
    if baseline:
        base_m = measure(workload, plan_for(workload.model, units, [Action.KEEP] * n), units, repeats=repeats)
    prof = ModelProfile(
        workload=workload.spec, batch_shape=workload.batch_shape, device=str(workload.device),
        fingerprint=fingerprint(workload.model, units), units=list(units), actions=list(actions),
        base_bytes=base_bytes, pre=keep["pre"], post=keep["post"], tail=keep["tail"],
        costs={a: [UnitCost(fwd=s[f"F:{i}"], bwd=s[f"B:{i}"]) for i in range(n)] for a, s in per_action.items()},
        baseline=base_m, clock=step_clock(workload.device)[0],
    )
    if check:
        check_profile(prof, workload, base_m)
    return prof


UNIFORM_CHECKED = (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE)


def check_profile(prof: ModelProfile, workload: Workload, keep: Measurement | None = None) -> list[PeakCheck]:
    """The profile's predicted peak of each uniform plan (every unit keep, recompute, selective)
    against that plan measured on the workload's device; refuses a profile off by more than
    ``env.trace.PEAK_TOLERANCE`` (``MeasurementError``). ``keep``: the all-keep plan, if measured."""
    from env.cost_model import CostModel  # local: env.cost_model imports this module

    cm, n = CostModel(prof), len(prof.units)
    checks = []
    for action in (a for a in UNIFORM_CHECKED if a in prof.actions):
        plan = plan_for(workload.model, prof.units, [action] * n)
        m = keep if action is Action.KEEP and keep is not None else measure(workload, plan, prof.units, repeats=1)
        if not m.oom:  # a plan that does not fit has no peak to compare
            predicted = cm.predict([cm.action_index(action)] * n).peak_bytes
            checks.append(PeakCheck(f"all {action.value}", predicted, m.peak_bytes))
    return check_peaks(checks, workload.spec, str(workload.device))

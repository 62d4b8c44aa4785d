"""Profile a workload: per unit and action, the memory and time of that unit's part of the step.

The result is a ``ModelProfile`` (plain data, ``env.records``, where the step's segments are
described); the cost model, the exact solver and the agents read only that. Each segment has
``delta_bytes`` (net allocation: what it leaves live), ``rise_bytes`` (its highest point above
its start) and ``seconds``.

``profile()`` measures every unit under every action by running the step once per action with
all units set to it (plans are applied per unit, so the segments of a mixed plan are those
segments). Memory comes from the same profiler events as ``measure``; times from timed
steps with marks, medians over repeats.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import torch

from env.apply import apply_actions, plan_for
from env.errors import MeasurementError
from env.measure import measure, state_bytes
from env.plan import Action, fingerprint
from env.records import ModelProfile, Segment, UnitCost
from env.timeline import MemoryTrace, UnitMarkers, profiled_step, step_clock, train_step
from env.workloads import Workload


def _segments(marks: dict[str, int], n: int) -> list[tuple[str, str, str]]:
    """(segment name, start mark, end mark) for the whole step, in time order."""
    segs = [("pre", "step_start", "fwd_pre:0")]
    segs += [(f"F:{i}", f"fwd_pre:{i}", f"fwd_pre:{i + 1}") for i in range(n - 1)]
    # The last unit's forward runs on to its output's gradient: whether that output stays live
    # through the head depends on the unit's action (a kept ReLU saves it; a checkpoint frees it
    # once the head has read it), so the head's bytes belong to the last unit's cost. ``post`` is
    # then an empty segment, kept so that every reader of the timeline stays the same.
    last = f"bwd_pre:{n - 1}"
    segs += [(f"F:{n - 1}", f"fwd_pre:{n - 1}", last), ("post", last, last)]
    segs += [(f"B:{i}", f"bwd_pre:{i}", f"bwd_pre:{i - 1}") for i in range(n - 1, 0, -1)]
    segs += [("B:0", "bwd_pre:0", "bwd_end"), ("tail", "bwd_end", "step_end")]
    missing = [m for _, a, b in segs for m in (a, b) if m not in marks]
    if missing:
        raise MeasurementError(
            f"mark '{missing[0]}' never fired: a unit's output needs no gradient or a unit did not run; "
            "choose units that run once per step on the gradient path"
        )
    order = [marks[a] for _, a, _ in segs] + [marks["step_end"]]
    if order != sorted(order):
        raise MeasurementError("units did not run in the expected order (forward 0..n-1, backward n-1..0); "
                               "give the units in execution order of a sequential model")
    return segs


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


Segments = list[tuple[str, str, str]]


def _memory(workload: Workload, optimizer: torch.optim.Optimizer, units: Sequence[str],
            action: Action) -> tuple[MemoryTrace, Segments, int]:
    """One profiled step with every unit under ``action``: its trace, segments and base bytes."""
    plan = plan_for(workload.model, units, [action] * len(units))
    with apply_actions(workload.model, plan, units):
        train_step(workload, optimizer)
        base_bytes = state_bytes(workload.model, optimizer, workload.inputs)
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
            repeats: int = 3, baseline: bool = True) -> ModelProfile:
    """Measure every unit under every action (one profiled and ``repeats`` timed steps per action).

    The timed steps go in rounds over the actions (keep, recompute, selective, then again, each
    round starting one further on), so a change of machine load during profiling falls on every
    action alike instead of making one action look slow; each segment's time is its median.
    """
    optimizer = workload.optimizer
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
    return ModelProfile(
        workload=workload.spec, batch_shape=workload.batch_shape, device=str(workload.device),
        fingerprint=fingerprint(workload.model, units), units=list(units), actions=list(actions),
        base_bytes=base_bytes, pre=keep["pre"], post=keep["post"], tail=keep["tail"],
        costs={a: [UnitCost(fwd=s[f"F:{i}"], bwd=s[f"B:{i}"]) for i in range(n)] for a, s in per_action.items()},
        baseline=base_m, clock=step_clock(workload.device)[0],
    )

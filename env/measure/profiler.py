"""Profile a workload: per unit and action, the memory and time of that unit's part of the step.

The result is a ``ModelProfile`` (plain data, ``env.data``, where the step's segments are
described); the cost model, the exact solver and the agents read only that. Each segment has
``delta_bytes`` (net allocation: what it leaves live), ``rise_bytes`` (its highest point above
its start) and ``seconds``.

``profile()`` measures every unit under every action by running the step once per action with
all units set to it (plans are applied per unit, so the segments of a mixed plan are those
segments). Memory comes from the same profiler events as ``measure``, the allocations of the
workload's device (``env.measure.trace``); times from timed steps with marks, medians over repeats.
``chain`` is not a plan of its own: the profile finds which neighbouring units chain
(``env.runtime.chains``, one instrumented forward and one or a few real steps) and derives a
unit's chain costs from its recompute costs (``env.data.model_profile``). Before it is returned,
the profile's predicted peaks of the uniform plans, and of two chained plans where units chain,
are checked against their measured peaks (``check_profile``).
"""

from __future__ import annotations

import statistics
from typing import Sequence

import torch

from env.cost.cost_model import CostModel
from env.data.errors import MeasurementError
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile, Segment, UnitCost, block_costs, chain_costs
from env.data.plan import Action, fingerprint
from env.data.rounds import rotated
from env.data.segments import (blocked_spans, chained_segments, checkpoint_sequential_actions, sequential_segments,
                               sqrt_segments)
from env.measure.measurement import live_bytes, measure, steady_numerics
from env.measure.timeline import MemoryTrace, UnitMarkers, profiled_step, step_clock, train_step
from env.measure.trace import PeakCheck, Segments, check_peaks
from env.measure.trace import step_segments as _segments
from env.runtime.apply import apply_actions, is_loss_unit, plan_for
from env.runtime.chains import block_spans, chain_links
from env.workloads.workload import Workload


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


def loss_units(workload: Workload, units: Sequence[str]) -> list[bool]:
    """Per unit: whether it is a loss unit (``env.runtime.apply.is_loss_unit``), the only kind ``chunked`` applies to."""
    return [is_loss_unit(workload.model.get_submodule(u)) for u in units]


def uniform_actions(action: Action, losses: Sequence[bool]) -> list[Action]:
    """Every unit under ``action``; for ``chunked``, the loss units chunked and the others kept."""
    if action is Action.CHUNKED:
        return [Action.CHUNKED if loss else Action.KEEP for loss in losses]
    return [action] * len(losses)


def _memory(workload: Workload, optimizer: torch.optim.Optimizer, units: Sequence[str],
            action: Action) -> tuple[MemoryTrace, Segments, int]:
    """One profiled step with every unit under ``action``: its trace, segments and base bytes."""
    plan = plan_for(workload.model, units, uniform_actions(action, loss_units(workload, units)))
    with apply_actions(workload.model, plan, units):
        train_step(workload, optimizer)
        base_bytes = live_bytes(workload, optimizer)
        with UnitMarkers(workload.model, units) as markers:
            trace = profiled_step(workload, optimizer, markers)
    return trace, _segments(trace.marks, len(units)), base_bytes


def _timed(workload: Workload, optimizer: torch.optim.Optimizer, units: Sequence[str], action: Action,
           segs: Segments, times: dict[str, list[float]]) -> None:
    """One timed step with every unit under ``action``, after an untimed one (as ``measure`` warms up);
    appends each segment's seconds to ``times`` (``chunked``: on the loss units, the others kept). Timed
    straight after another action's step, the
    allocator first grows back the memory that step did not need: on hf/gpt2 (thread-cpu clock) the
    forward of the last two of six blocks under keep took 0.24 and 0.48 s against 0.075 s for the
    others, the profile priced the all-keep step at 1.84 s where it measures 1.06 s, and
    recomputing the last block looked 0.55 s cheaper than keeping it."""
    plan = plan_for(workload.model, units, uniform_actions(action, loss_units(workload, units)))
    with apply_actions(workload.model, plan, units):
        train_step(workload, optimizer)
        with UnitMarkers(workload.model, units, sync_cuda=workload.device.type == "cuda",
                         clock=step_clock(workload.device)[1]) as timed:
            train_step(workload, optimizer, timed)
    ns = dict(timed.marks)
    for name, a, b in segs:
        times.setdefault(name, []).append((ns[b] - ns[a]) / 1e9)


DEFAULT_ACTIONS = (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE)  # add LIGHT (graded selective), CHAIN for chain regions, CHUNKED for a loss unit


def profile(workload: Workload, units: Sequence[str], actions: Sequence[Action] = DEFAULT_ACTIONS,
            repeats: int = 3, baseline: bool = True, check: bool = True) -> ModelProfile:
    """Measure every unit under every action (one profiled and ``repeats`` timed steps per action,
    each after an untimed one). ``chain`` (the search's default actions have it) is profiled
    where some units chain (``chain_links``) and left out where none do; ``block`` likewise where some runs of units
    are a parent's (``block_spans``).

    The timed steps go in rounds over the actions (keep, recompute, selective, then again, each
    round starting one further on), so a change of machine load during profiling falls on every
    action alike instead of making one action look slow; each segment's time is its median.
    ``check``: refuse the profile (``MeasurementError``) unless its predicted peaks of the uniform
    plans match their measured peaks (``check_profile``).
    """
    chains, blocks = Action.CHAIN in actions, Action.BLOCK in actions
    for region in (a for a in (Action.CHAIN, Action.BLOCK) if a in actions):
        if not {Action.KEEP, Action.RECOMPUTE} <= set(actions):
            raise MeasurementError(f"actions {', '.join(a.value for a in actions)}: '{region.value}' needs 'keep' and "
                                   "'recompute' (a region starts as a recompute and is recomputed as kept units); add them")
    actions = [a for a in actions if a not in (Action.CHAIN, Action.BLOCK)]
    optimizer = workload.optimizer
    steady_numerics(workload.device)
    train_step(workload, optimizer)  # optimizer state exists from here on
    units = _execution_order(workload, units, optimizer)
    n = len(units)
    losses = loss_units(workload, units)
    if not any(losses):  # 'chunked' needs a loss unit: without one it is left out, as 'chain' where none chains
        actions = [a for a in actions if a is not Action.CHUNKED]
    links = chain_links(workload, units) if chains else []
    spans = block_spans(workload, units) if blocks else []
    memory = {action: _memory(workload, optimizer, units, action) for action in actions}
    base_bytes = memory[actions[-1]][2]
    times: dict[Action, dict[str, list[float]]] = {action: {} for action in actions}
    for r in range(repeats):
        for action in rotated(actions, r):
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
    costs = {a: [UnitCost(fwd=s[f"F:{i}"], bwd=s[f"B:{i}"]) for i in range(n)] for a, s in per_action.items()}
    if any(links):
        costs[Action.CHAIN] = chain_costs(costs[Action.RECOMPUTE])
    if spans:
        costs[Action.BLOCK] = block_costs(costs[Action.RECOMPUTE], spans)
    prof = ModelProfile(
        workload=workload.spec, batch_shape=workload.batch_shape, device=str(workload.device),
        fingerprint=fingerprint(workload.model, units), units=list(units), actions=list(costs),
        base_bytes=base_bytes, pre=keep["pre"], post=keep["post"], tail=keep["tail"], costs=costs,
        baseline=base_m, clock=step_clock(workload.device)[0], chain_links=links if any(links) else [],
        chunk_units=losses if Action.CHUNKED in costs else [], block_spans=spans,
    )
    if check:
        check_profile(prof, workload, base_m)
    return prof


UNIFORM_CHECKED = (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.LIGHT)


def checked_plans(prof: ModelProfile) -> dict[str, list[Action]]:
    """The plans whose predicted peaks ``check_profile`` compares with measured ones: each uniform
    plan ("all chunked": every unit recomputed, the loss units chunked), and where units chain, every link chained ("all chained": one region where every unit
    chains) and ``checkpoint_sequential`` with round(sqrt(n)) segments as chain regions; where runs of units are a
    parent's, every such parent recomputed ("every block")."""
    n, links = len(prof.units), prof.links()
    plans = {f"all {a.value}": [a] * n for a in UNIFORM_CHECKED if a in prof.actions}
    if Action.CHUNKED in prof.actions and Action.RECOMPUTE in prof.actions:
        plans["all chunked"] = [Action.CHUNKED if loss else Action.RECOMPUTE for loss in prof.chunk_units]
    if Action.CHAIN in prof.actions and any(links):
        plans["all chained"] = chained_segments(n, [(0, n)], links)
        k = max(2, sqrt_segments(n)) if n >= 2 else 1
        plans[f"checkpoint_sequential {k} segments"] = checkpoint_sequential_actions(n, k, links)
        assert len(sequential_segments(n, k)) == k
    if Action.BLOCK in prof.actions and prof.block_spans:
        plans["every block"] = blocked_spans(n, prof.block_spans)
    return plans


def check_profile(prof: ModelProfile, workload: Workload, keep: MeasuredPlan | None = None) -> list[PeakCheck]:
    """The profile's predicted peak of each of ``checked_plans`` against that plan measured on the
    workload's device; refuses a profile off by more than ``env.measure.trace.PEAK_TOLERANCE``
    (``MeasurementError``). ``keep``: the all-keep plan, if measured."""
    cm = CostModel(prof)
    checks = []
    for name, actions in checked_plans(prof).items():
        plan = plan_for(workload.model, prof.units, actions)
        m = keep if name == "all keep" and keep is not None else measure(workload, plan, prof.units, repeats=1)
        if not m.oom:  # a plan that does not fit has no peak to compare
            checks.append(PeakCheck(name, cm.predict(plan).peak_bytes, m.peak_bytes))
    return check_peaks(checks, workload.spec, str(workload.device))

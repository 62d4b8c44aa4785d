"""The device-independent trace: allocations of one device, segments by marks, peaks, reconciliation.

Reads a recorded CPU step of gpt/tiny (tests/data/gpt_tiny_cpu_trace.json, written by
tests/data/record_trace.py) and a CUDA-shaped trace built from it: the same allocations stamped as
one GPU's, mixed with host allocations and another GPU's, on the marks' timeline.
"""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
from pathlib import Path

import pytest

from env.cost.cost_model import CostModel
from env.data.errors import MeasurementError
from env.data.plan import Action
from env.measure.profiler import check_profile, profile
from env.measure.trace import (
    MARK_PREFIX,
    MEMORY_EVENT,
    PeakCheck,
    ProfilerEvent,
    check_peaks,
    load_events,
    memory_trace,
    save_events,
    segment_bytes,
    step_segments,
)
from env.runtime.apply import plan_for
from env.units.find import find_units
from env.workloads.workload import load_workload
from tests.test_workloads import one_line_error

RECORDED = Path(__file__).parent / "data" / "gpt_tiny_cpu_trace.json"


def test_the_trace_module_needs_no_torch() -> None:
    code = "import sys, env.measure.trace; assert 'torch' not in sys.modules, 'env.measure.trace imported torch'"
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def recorded() -> tuple[list[ProfilerEvent], dict]:
    return load_events(RECORDED)


def walk(segments: dict[str, tuple[int, int]], order: list[str]) -> int:
    """The peak above the step's start from segments alone, as the cost model walks them."""
    level = peak = 0
    for name in order:
        delta, rise = segments[name]
        peak = max(peak, level + rise)
        level += delta
    return peak


def test_the_recorded_cpu_trace_gives_the_measured_peak(recorded) -> None:
    events, meta = recorded
    trace = memory_trace(events, "cpu")
    assert len(trace.events) == sum(e.name == MEMORY_EVENT for e in events) > 100
    assert meta["live_before_bytes"] + trace.peak_delta() == meta["measured_peak_bytes"]


def test_segments_tile_the_step_and_walk_to_its_peak(recorded) -> None:
    events, meta = recorded
    trace = memory_trace(events, "cpu")
    n = len(meta["units"])
    segs = step_segments(trace.marks, n)
    assert [name for name, _, _ in segs] == (["pre"] + [f"F:{i}" for i in range(n)] + ["post"]
                                             + [f"B:{i}" for i in range(n - 1, -1, -1)] + ["tail"])
    by_name = segment_bytes(trace, segs)
    start, end = trace.marks["step_start"], trace.marks["step_end"]
    inside = [b for t, b in trace.events if start <= t < end]
    after = [(t, b) for t, b in trace.events if not start <= t < end]
    assert all(t >= end and b < 0 for t, b in after)  # only frees after the last mark (the loss's scalar)
    assert sum(d for d, _ in by_name.values()) == sum(inside)  # the segments tile the step
    assert walk(by_name, [name for name, _, _ in segs]) == trace.peak_delta()
    kept = [by_name[f"F:{i}"][0] for i in range(n)]
    assert all(k > 0 for k in kept), kept  # each block keeps activations for backward


def _cuda_shaped(events: list[ProfilerEvent], seed: int = 0) -> list[ProfilerEvent]:
    """The recorded allocations as GPU 0's, plus host and GPU 1 allocations at random instants."""
    rng = random.Random(seed)
    t_end = max(e.start_ns for e in events)
    out = [dataclasses.replace(e, device_type="cuda", device_index=0) if e.name == MEMORY_EVENT else e
           for e in events]
    for _ in range(300):
        t = rng.randrange(t_end)
        size = rng.choice([512, 4096, 1 << 20, 64 << 20])
        out.append(ProfilerEvent(MEMORY_EVENT, "cpu", -1, t, size))  # pinned host buffers, host tensors
        out.append(ProfilerEvent(MEMORY_EVENT, "cuda", 1, t, 3 * size))  # another GPU
    rng.shuffle(out)  # the profiler gives events by thread, not in time order
    return out


def test_a_cuda_trace_keeps_only_the_workloads_device(recorded) -> None:
    events, meta = recorded
    cpu = memory_trace(events, "cpu")
    mixed = _cuda_shaped(events)
    gpu0 = memory_trace(mixed, "cuda", 0)
    assert gpu0.events == cpu.events and gpu0.marks == cpu.marks
    assert gpu0.peak_delta() == meta["measured_peak_bytes"] - meta["live_before_bytes"]
    host = memory_trace(mixed, "cpu")
    assert len(host.events) == 300 and host.marks == cpu.marks
    assert len(memory_trace(mixed, "cuda", 1).events) == 300
    assert len(memory_trace(mixed, "cuda").events) == len(cpu.events) + 300  # no index: every GPU
    n = len(meta["units"])
    assert segment_bytes(gpu0, step_segments(gpu0.marks, n)) == segment_bytes(cpu, step_segments(cpu.marks, n))


def test_events_round_trip_through_json(recorded, tmp_path: Path) -> None:
    events, _ = recorded
    path = tmp_path / "trace.json"
    save_events(path, events[:50], workload="w", units=["a"])
    again, again_meta = load_events(path)
    assert again == events[:50] and again_meta == {"workload": "w", "units": ["a"]}


def test_a_mark_twice_and_a_missing_or_misordered_mark_are_named() -> None:
    mark = [ProfilerEvent(MARK_PREFIX + "fwd_pre:0", "cpu", 0, t) for t in (1, 2)]
    with pytest.raises(MeasurementError) as e:
        memory_trace(mark, "cpu")
    one_line_error(e, "'fwd_pre:0' fired twice", "each run once per step")
    marks = {"step_start": 0, "fwd_pre:0": 1, "bwd_pre:0": 2, "step_end": 4}
    with pytest.raises(MeasurementError) as e:
        step_segments(marks, 1)
    one_line_error(e, "mark 'bwd_end' never fired")
    with pytest.raises(MeasurementError) as e:
        step_segments({**marks, "bwd_end": 3, "fwd_pre:0": 5}, 1)
    one_line_error(e, "did not run in the expected order")


def test_check_peaks_passes_within_the_tolerance_and_names_the_worst_plan() -> None:
    ok = [PeakCheck("all keep", 1_040_000, 1_000_000), PeakCheck("all recompute", 960_000, 1_000_000)]
    assert check_peaks(ok, "gpt/tiny", "cuda:0") == ok
    bad = ok + [PeakCheck("all selective", 1_300_000, 1_000_000), PeakCheck("x", 1_100_000, 1_000_000)]
    with pytest.raises(MeasurementError) as e:
        check_peaks(bad, "gpt/tiny", "cuda:0")
    one_line_error(e, "profile of gpt/tiny on cuda:0", "'all selective'", "1.24 MiB", "0.95 MiB", "+30.0%",
                   "more than 5%", "check=False")
    assert check_peaks(bad, tolerance=0.35) == bad
    with pytest.raises(MeasurementError, match="tolerance=5 must be a fraction"):
        check_peaks(ok, tolerance=5)


def test_a_profile_with_one_units_bytes_scaled_is_refused() -> None:
    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    prof = profile(w, units, [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.CHAIN], repeats=1)  # checked
    cm = CostModel(prof)
    n = len(units)
    checks = check_profile(prof, w, prof.baseline)
    assert [c.plan for c in checks] == ["all keep", "all recompute", "all selective", "all chained",
                                        "checkpoint_sequential 2 segments"]
    assert all(c.error == 0 for c in checks)  # on CPU the profile is exact on the uniform and the chained plans
    keep = prof.costs[Action.KEEP]
    scaled = keep[1].model_copy(update={"fwd": keep[1].fwd.model_copy(
        update={"delta_bytes": 3 * keep[1].fwd.delta_bytes, "rise_bytes": 3 * keep[1].fwd.rise_bytes})})
    doctored = prof.model_copy(update={"costs": {**prof.costs, Action.KEEP: [*keep[:1], scaled, *keep[2:]]}})
    predicted = CostModel(doctored).predict([cm.action_index(Action.KEEP)] * n).peak_bytes
    assert predicted > 1.05 * prof.baseline.peak_bytes  # the doctoring is big enough to be seen
    with pytest.raises(MeasurementError) as e:
        check_profile(doctored, w, prof.baseline)
    one_line_error(e, "profile of gpt/tiny on cpu predicts", "for plan 'all keep'", "MiB was measured")
    assert prof.baseline.digest == plan_for(w.model, prof.units, [Action.KEEP] * n).digest

"""The allocation trace of one training step, device-independent (no torch import).

The profiler (``env.measure.timeline.profiled_step``) yields events; ``ProfilerEvent`` is the plain record
of one, converted once at that edge. Two kinds matter here:

- ``[memory]`` events: one per call into an allocator, ``+bytes`` allocated or ``-bytes`` freed,
  with the device they were allocated on. CUDA's caching allocator reports them when it is
  called, on the host, so they are stamped on the same timeline as everything else.
- marks: zero-length ``record_function`` ranges named ``ckpt_mark::<name>`` that
  ``env.measure.timeline.UnitMarkers`` puts at each unit's forward start, forward end and backward start.

``memory_trace`` keeps the allocations of one device (the workload's: on a GPU the host's own
allocations are not what fills the device) and the marks; ``step_segments`` cuts the step by the
marks into the segments the profile is made of; ``MemoryTrace.peak_delta`` is the highest point of
the running sum, which is the step's peak above what was live before it. ``check_peaks`` is the
reconciliation: a profile whose predicted peaks of the uniform plans are off the measured ones by
more than ``PEAK_TOLERANCE`` is refused, before a search trusts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from env.data.errors import MeasurementError

MARK_PREFIX = "ckpt_mark::"
MEMORY_EVENT = "[memory]"  # the profiler's name of an allocation event
PEAK_TOLERANCE = 0.05  # largest |predicted - measured| / measured peak a profile may show on a uniform plan
MiB = 2 ** 20


@dataclass(frozen=True)
class ProfilerEvent:
    """One profiler event as plain data: an allocation (``MEMORY_EVENT``) or a mark."""

    name: str
    device_type: str  # "cpu", "cuda", ... as in torch.device.type
    device_index: int  # the GPU's index; -1 for the host
    start_ns: int  # host timeline, shared by allocations and marks
    nbytes: int = 0  # allocations: + allocated, - freed

    def row(self) -> list[Any]:
        return [self.name, self.device_type, self.device_index, self.start_ns, self.nbytes]

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "ProfilerEvent":
        name, device_type, device_index, start_ns, nbytes = row
        return cls(str(name), str(device_type), int(device_index), int(start_ns), int(nbytes))


def save_events(path: Path, events: Iterable[ProfilerEvent], **meta: Any) -> None:
    """Write events (one row each) and any ``meta`` to a JSON file: a recorded trace for tests."""
    body = {**meta, "columns": ["name", "device_type", "device_index", "start_ns", "nbytes"],
            "events": [e.row() for e in events]}
    Path(path).write_text(json.dumps(body, separators=(",", ":")) + "\n")


def load_events(path: Path) -> tuple[list[ProfilerEvent], dict[str, Any]]:
    """The events and the meta fields of a file written by ``save_events``."""
    body = json.loads(Path(path).read_text())
    events = [ProfilerEvent.from_row(r) for r in body.pop("events")]
    body.pop("columns", None)
    return events, body


@dataclass
class MemoryTrace:
    """Allocation events of one profiled step on one device: (ns, +/- bytes), and the marks' ns."""

    events: list[tuple[int, int]]
    marks: dict[str, int]

    def peak_delta(self) -> int:
        """Highest running sum of allocations over the step (bytes above the start)."""
        level = peak = 0
        for _, nbytes in self.events:
            level += nbytes
            peak = max(peak, level)
        return peak

    def segment(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """(delta, rise) of the allocations in [start, end): net bytes, and the highest point above start."""
        level = rise = 0
        for t, nbytes in self.events:
            if start_ns <= t < end_ns:
                level += nbytes
                rise = max(rise, level)
        return level, rise


def memory_trace(events: Iterable[ProfilerEvent], device_type: str, device_index: int | None = None) -> MemoryTrace:
    """The allocations on one device (``device_index`` None or -1: any index of that type) and every mark.

    Events at the same instant (within the clock's resolution) are ordered frees first: one
    deterministic order, so that a trace gives the same peak every time it is read.
    """
    allocations: list[tuple[int, int]] = []
    marks: dict[str, int] = {}
    any_index = device_index is None or device_index < 0
    for e in events:
        if e.name == MEMORY_EVENT:
            if e.device_type == device_type and (any_index or e.device_index == device_index):
                allocations.append((e.start_ns, e.nbytes))
        elif e.name.startswith(MARK_PREFIX):
            key = e.name[len(MARK_PREFIX):]
            if key in marks:
                raise MeasurementError(
                    f"unit mark '{key}' fired twice in one step: a unit ran twice (shared or reused module); "
                    "choose units that each run once per step"
                )
            marks[key] = e.start_ns
    allocations.sort()
    return MemoryTrace(allocations, marks)


Segments = list[tuple[str, str, str]]


def step_segments(marks: dict[str, int], n: int) -> Segments:
    """(segment name, start mark, end mark) for the whole step of ``n`` units, in time order.

    ``pre | F:0 | ... | F:n-1 | post | B:n-1 | ... | B:0 | tail``; see ``env.measure.profiler``.
    """
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


def segment_bytes(trace: MemoryTrace, segs: Segments) -> dict[str, tuple[int, int]]:
    """Segment name -> (delta_bytes, rise_bytes) of the trace between its marks."""
    return {name: trace.segment(trace.marks[a], trace.marks[b]) for name, a, b in segs}


# ---------------------------------------------------------------------------------------------
# Reconciliation: the profile's predicted peaks against measured ones

@dataclass(frozen=True)
class PeakCheck:
    """One plan's peak as the profile predicts it and as measured on the same device."""

    plan: str  # e.g. "all recompute"
    predicted_bytes: int
    measured_bytes: int

    @property
    def error(self) -> float:
        """Signed relative error of the prediction, (predicted - measured) / measured."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def check_peaks(checks: Sequence[PeakCheck], workload: str = "the workload", device: str = "this device",
                tolerance: float = PEAK_TOLERANCE) -> list[PeakCheck]:
    """Return ``checks`` when every prediction is within ``tolerance``; else refuse, naming the worst.

    A profile off on the uniform plans is off on every plan built from them: its per-unit bytes
    did not come from what fills the device, or the step is not the sequence of units it assumes.
    """
    if not 0 < tolerance < 1:
        raise MeasurementError(f"tolerance={tolerance} must be a fraction between 0 and 1 (e.g. {PEAK_TOLERANCE})")
    bad = [c for c in checks if c.measured_bytes <= 0 or abs(c.error) > tolerance]
    if not bad:
        return list(checks)
    worst = max(bad, key=lambda c: abs(c.error) if c.measured_bytes > 0 else float("inf"))
    if worst.measured_bytes <= 0:
        raise MeasurementError(f"plan '{worst.plan}' of {workload} on {device} measured a peak of "
                               f"{worst.measured_bytes} bytes; measure it again on a device that runs the step")
    raise MeasurementError(
        f"profile of {workload} on {device} predicts {worst.predicted_bytes / MiB:.2f} MiB peak for plan "
        f"'{worst.plan}' but {worst.measured_bytes / MiB:.2f} MiB was measured ({100 * worst.error:+.1f}%, more than "
        f"{100 * tolerance:.0f}%); profile again with nothing else allocating on the device, choose units that each "
        "run once per step in order (env.units.find.find_units), or pass check=False to profile() to use it anyway"
    )

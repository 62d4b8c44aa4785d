"""A throughput search's memory caps and its ladder of micro-batches, found by measurement.

Caps: ``--memory-cap`` in MiB; on CUDA without it, the device's memory less a reserve
(``CUDA_RESERVE_SHARE`` of it, at least ``CUDA_RESERVE_MIN_BYTES``): a measured peak is what the
caching allocator handed out (``max_memory_allocated``), and beside it the CUDA context, the
allocator's rounding and fragmentation and other libraries' workspaces take device memory that no
peak shows. On CPU a cap must be given (``SearchConfig`` refuses the mode without one).

Ladder (``find_ladder``): the lowest-memory plan (the exact solver's at the workload's own batch) is
measured at 1, 2, 4, ... samples until its measured peak no longer fits the largest cap; where a line
through the last two measured peaks leaves the cap before the next power of two, the size right above
that point is measured instead (on gpt/small, 47 samples, its peak only, instead of 64, whose measurement
took 17 s). Between the last size that fits and the first that does not, the largest that fits is found
by a line through the two measured peaks and confirmed by measuring it. A cap that even micro-batch 1 of
that plan does not fit is refused in one line naming the lowest measured peak (``ThroughputError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from env.data.errors import CkptSearchError
from env.data.measured import MeasuredPlan
from env.data.types import MIB, Indices
from search.records.throughput import counted_peak

CUDA_RESERVE_SHARE = 0.10
CUDA_RESERVE_MIN_BYTES = 1 << 30
MAX_MICRO_BATCH = 4096  # the doubling stops here when no cap stops it first
CONFIRM_TRIES = 3  # measurements that look for the largest micro-batch between two powers of two


class ThroughputError(CkptSearchError):
    """A throughput search that cannot answer: a cap nothing fits, no cap on a CPU."""


def resolve_caps(memory_cap_mb: Sequence[float], device_memory_bytes: int | None) -> list[int]:
    """The caps in bytes, lowest first: as given, or on CUDA the device's memory less the reserve."""
    if memory_cap_mb:
        return sorted({int(c * MIB) for c in memory_cap_mb})
    if device_memory_bytes is None:
        raise ThroughputError("a throughput search on a CPU needs --memory-cap MB (the memory one training step may "
                              "use, e.g. --memory-cap 60 120); only on CUDA does it default to the device's memory")
    reserve = max(CUDA_RESERVE_MIN_BYTES, int(CUDA_RESERVE_SHARE * device_memory_bytes))
    return [device_memory_bytes - reserve]


@dataclass(frozen=True)
class ThroughputSetup:
    """What a throughput search fixed before it searched: caps, ladder and the workload's batch facts."""

    caps: list[int]  # bytes, lowest first
    ladder: list[int]  # micro-batches
    base: int  # the workload's own micro-batch
    how: str  # how its micro-batch changes (env.workloads.batching)
    tokens_per_sample: int | None
    gradient_bytes: int
    global_batch: int | None
    lowest: Indices  # the plan whose peak grows least per sample (it sets the ladder's top)
    fixed: bool = False  # the ladder was given (--micro-batches): no other micro-batch is searched

    @classmethod
    def of(cls, facts: dict[str, Any], caps: list[int], ladder: list[int], global_batch: int | None,
           lowest: Indices, fixed: bool = False) -> "ThroughputSetup":
        return cls(caps, ladder, int(facts["base"]), str(facts["how"]), facts["tokens_per_sample"],
                   int(facts["gradient_bytes"]), global_batch or None, tuple(lowest), fixed)

    def sizes(self) -> Sequence[int]:
        """The micro-batches a configuration may be quoted at: the ladder when given, else any up to the limit."""
        return sorted(self.ladder) if self.fixed else range(1, min(self.global_batch or MAX_MICRO_BATCH,
                                                                  MAX_MICRO_BATCH) + 1)

    def counted(self, peak_bytes: int, micro_batch: int) -> int:
        """The peak a cap is checked against (``search.records.throughput.counted_peak``)."""
        return counted_peak(peak_bytes, micro_batch, self.global_batch, self.gradient_bytes)


def no_plan_fits(cap: int, lowest_peak: int, micro_batch: int, what: str) -> ThroughputError:
    return ThroughputError(
        f"memory cap {cap / MIB:.1f} MiB: no plan fits; the lowest measured peak is {lowest_peak / MIB:.1f} MiB "
        f"({what} at micro-batch {micro_batch}); give a cap of at least "
        f"{math.ceil(lowest_peak / MIB * 10) / 10:.1f} MiB")


def find_ladder(measure_lowest: Callable[[int], MeasuredPlan], caps: Sequence[int], counted: Callable[[int, int], int],
                limit: int, what: str) -> list[int]:
    """The micro-batches to search: powers of two up to where the lowest-memory plan (``measure_lowest(b)``,
    peaks as ``counted``) stops fitting the largest cap, and the largest size that fits (module docstring)."""
    first = measure_lowest(1)
    low_peak = first.peak_bytes if first.oom else counted(first.peak_bytes, 1)
    if first.oom or low_peak > min(caps):
        raise no_plan_fits(min(caps), low_peak, 1, what + (" (out of memory)" if first.oom else ""))
    fits, peaks, failed = [1], {1: low_peak}, None
    while fits[-1] < limit:
        b = min(2 * fits[-1], limit, max(_just_beyond(peaks, max(caps)), fits[-1] + 1))
        m = measure_lowest(b)
        if m.oom or counted(m.peak_bytes, b) > max(caps):
            failed = (b, None if m.oom else counted(m.peak_bytes, b))
            break
        fits.append(b)
        peaks[b] = counted(m.peak_bytes, b)
    top = fits[-1]
    if failed is not None and failed[0] > top + 1:
        fits += _largest_between(measure_lowest, top, peaks, failed, max(caps), counted)
    return sorted(set(fits))


def _just_beyond(peaks: dict[int, int], cap: int) -> int | float:
    """The micro-batch right above the largest that a line through the last two measured peaks puts under
    ``cap`` (infinite with fewer than two, or peaks that do not grow)."""
    if len(peaks) < 2:
        return math.inf
    (b1, p1), (b2, p2) = sorted(peaks.items())[-2:]
    slope = (p2 - p1) / (b2 - b1)
    return b2 + math.floor((cap - p2) / slope) + 1 if slope > 0 else math.inf


def _largest_between(measure_lowest: Callable[[int], MeasuredPlan], top: int, peaks: dict[int, int],
                     failed: tuple[int, int | None], cap: int, counted: Callable[[int, int], int]) -> list[int]:
    """The largest micro-batch in (top, failed) the lowest plan fits, by a line through two measured peaks."""
    b_fail, p_fail = failed
    below = sorted(peaks)
    if p_fail is not None:
        slope = (p_fail - peaks[top]) / (b_fail - top)
    elif len(below) >= 2:  # out of memory: no peak there, the slope of the last two that fit
        slope = (peaks[top] - peaks[below[-2]]) / (top - below[-2])
    else:
        return []
    if slope <= 0:
        return []
    guess = min(b_fail - 1, top + math.floor((cap - peaks[top]) / slope))
    for _ in range(CONFIRM_TRIES):
        if guess <= top:
            return []
        m = measure_lowest(guess)
        if not m.oom and counted(m.peak_bytes, guess) <= cap:
            return [guess]
        over = (counted(m.peak_bytes, guess) - cap) if not m.oom else slope
        guess -= max(1, math.ceil(over / slope))
    return []

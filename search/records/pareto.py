"""Pareto utilities for (peak memory, step time), both minimised, on normalised axes.

The convention used everywhere (dashboard, benches, archive): memory and time are divided
by the all-``keep`` baseline's peak bytes and step seconds, so the baseline sits at (1, 1),
and the hypervolume reference point is ``REFERENCE = (1.1, 2.0)``: 10% more memory than the
baseline and twice its step time. Points beyond it add nothing to the hypervolume.
Non-dominance and hypervolume come from moocore.
"""

from __future__ import annotations

from typing import Sequence

import moocore
import numpy as np
from numpy.typing import ArrayLike

REFERENCE: tuple[float, float] = (1.1, 2.0)  # (peak / baseline peak, seconds / baseline seconds)


def normalise(points: ArrayLike, baseline_peak_bytes: float, baseline_seconds: float) -> np.ndarray:
    """(n, 2) of (peak_bytes, step_seconds) -> (n, 2) of ratios to the baseline."""
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    if baseline_peak_bytes <= 0 or baseline_seconds <= 0:
        raise ValueError(f"baseline ({baseline_peak_bytes}, {baseline_seconds}) must be positive; "
                         "pass the all-keep plan's peak bytes and step seconds")
    return pts / np.array([baseline_peak_bytes, baseline_seconds])


def reference_point(baseline_peak_bytes: float, baseline_seconds: float) -> tuple[float, float]:
    """``REFERENCE`` in raw units (bytes, seconds) for a baseline."""
    return REFERENCE[0] * baseline_peak_bytes, REFERENCE[1] * baseline_seconds


def nondominated(points: ArrayLike) -> np.ndarray:
    """Boolean mask of the points no other point weakly dominates (equal points: first kept)."""
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    if len(pts) == 0:
        return np.zeros(0, dtype=bool)
    return moocore.is_nondominated(pts, maximise=False, keep_weakly=False)


def hypervolume(points: ArrayLike, ref: ArrayLike = REFERENCE) -> float:
    """Area dominated by the points and bounded by ``ref`` (same units as the points)."""
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    if len(pts) == 0:
        return 0.0
    return float(moocore.hypervolume(pts, ref=np.asarray(ref, dtype=float)))


def fastest_within(peaks: Sequence[float], seconds: Sequence[float], budget: float) -> int | None:
    """Index of the fastest plan whose peak fits ``budget`` (fewer bytes breaks ties); None if none fits."""
    fits = [i for i, p in enumerate(peaks) if p <= budget]
    return min(fits, key=lambda i: (seconds[i], peaks[i])) if fits else None


MEMORY_TOLERANCE = 0.01  # of the baseline's activation bytes: a peak lower by less is no reason to be slower


def readable(peaks: Sequence[float], seconds: Sequence[float], memory_tolerance: float, noise: float) -> list[bool]:
    """Which points of a frontier a user is shown: a point is left out where another, at most
    ``memory_tolerance`` bytes higher, is faster by more than the run's timing ``noise`` (a share). Its
    lower peak is below what a user could use, its slowness is real (docs/measurement.md, "A frontier a user
    can read"). Decided from the highest peak down against the points kept, so every point left out has a
    kept one beside it."""
    order = sorted(range(len(peaks)), key=lambda i: (-peaks[i], seconds[i]))
    keep = [True] * len(peaks)
    kept: list[int] = []
    for i in order:
        keep[i] = not any(peaks[j] <= peaks[i] + memory_tolerance and seconds[j] < seconds[i] * (1 - noise)
                          for j in kept)
        if keep[i]:
            kept.append(i)
    return keep

"""Segments of a stack of units, as ``torch.utils.checkpoint.checkpoint_sequential`` cuts them, and
chain regions and blocks over them (``env.data.plan``). Torch-free: the rules (``agents.baselines``) and the
profile's check (``env.measure.profiler``) build their plans from these.
"""

from __future__ import annotations

import math
from typing import Sequence

from env.data.plan import Action


def sequential_segments(n_units: int, k: int) -> list[tuple[int, int]]:
    """(start, stop) of the k segments ``checkpoint_sequential(functions, k)`` cuts: ``n // k`` units
    each, the last one taking the remainder."""
    if not 1 <= k <= n_units:
        raise ValueError(f"k={k} segments of {n_units} units: give 1 <= k <= n_units")
    size = n_units // k
    starts = [j * size for j in range(k)]
    return [(s, starts[j + 1] if j + 1 < k else n_units) for j, s in enumerate(starts)]


def sqrt_segments(n_units: int) -> int:
    """Chen et al. 2016's segment count for n units: round(sqrt(n)), at least 1."""
    return max(1, min(n_units, round(math.sqrt(n_units))))


def region_actions(start: int, stop: int, links: Sequence[bool]) -> list[Action]:
    """Actions of units start..stop-1 recomputed as one region: ``recompute`` then ``chain``; a unit
    that cannot continue the region of the one before it (``links[i]`` False) starts a new one."""
    return [Action.CHAIN if i > start and links[i] else Action.RECOMPUTE for i in range(start, stop)]


def chained_segments(n_units: int, segments: Sequence[tuple[int, int]], links: Sequence[bool]) -> list[Action]:
    """Every unit ``keep`` but those of ``segments``, each recomputed as a region (``region_actions``)."""
    actions = [Action.KEEP] * n_units
    for start, stop in segments:
        actions[start:stop] = region_actions(start, stop, links)
    return actions


def blocked_spans(n_units: int, spans: Sequence[tuple[int, int]]) -> list[Action]:
    """Every unit ``keep`` but those of ``spans`` (each all the units of one parent), ``block``: each parent
    recomputed whole."""
    actions = [Action.KEEP] * n_units
    for start, stop in spans:
        actions[start:stop] = [Action.BLOCK] * (stop - start)
    return actions


def checkpoint_sequential_actions(n_units: int, k: int, links: Sequence[bool]) -> list[Action]:
    """``checkpoint_sequential(functions, k)`` as a plan: every segment but the last a region, the last kept."""
    return chained_segments(n_units, sequential_segments(n_units, k)[:-1], links)

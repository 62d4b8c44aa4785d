"""Rule-based checkpoint plans shown beside every frontier, as action-index lists.

Indices are positions in the ``actions`` list given (for a profile: ``profile.actions``).
Units are in execution order. "Checkpoint" below means the ``recompute`` action.

| Name            | Plan                                                                        |
|-----------------|-----------------------------------------------------------------------------|
| ``none``        | every unit ``keep``                                                         |
| ``all``         | every unit ``recompute``                                                    |
| ``every_n``     | Hugging Face ``every_n_layers``: unit i recomputes if ``i % n == 0``        |
|                 | (n = 2 .. n_units)                                                          |
| ``sqrt_n``      | Chen et al. 2016: ``round(sqrt(n))`` segments cut as below; the last unit  |
|                 | of each segment keeps its activations (the stored boundary), the others    |
|                 | recompute                                                                   |
| ``segments_k``  | ``torch.utils.checkpoint.checkpoint_sequential(functions, k)``: segments of |
|                 | ``n // k`` units from the start; the first k - 1 recompute, the rest (the   |
|                 | last segment, with any remainder) keeps (k = 2 .. n_units)                  |
| ``all_selective`` | every unit ``selective``                                                  |
| ``random_j``    | each unit's action uniform over ``actions``, seeded (j = 0 .. n_random-1)   |

Rules needing an action that is not in ``actions`` are left out.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from env.data.plan import Action


def every_n(n_units: int, n: int, keep: int, recompute: int) -> list[int]:
    return [recompute if i % n == 0 else keep for i in range(n_units)]


def sequential_segments(n_units: int, k: int) -> list[tuple[int, int]]:
    """(start, stop) of the k segments ``checkpoint_sequential`` cuts: n // k units each, the
    last one taking the remainder."""
    size = n_units // k
    starts = [j * size for j in range(k)]
    return [(s, starts[j + 1] if j + 1 < k else n_units) for j, s in enumerate(starts)]


def checkpoint_sequential_plan(n_units: int, k: int, keep: int, recompute: int) -> list[int]:
    plan = [keep] * n_units
    for start, stop in sequential_segments(n_units, k)[:-1]:
        plan[start:stop] = [recompute] * (stop - start)
    return plan


def sqrt_n_plan(n_units: int, keep: int, recompute: int) -> list[int]:
    k = max(1, min(n_units, round(math.sqrt(n_units))))
    plan = [recompute] * n_units
    for _, stop in sequential_segments(n_units, k):
        plan[stop - 1] = keep
    return plan


def baseline_rules(n_units: int, actions: Sequence[Action], seed: int = 0,
                   n_random: int = 3) -> dict[str, list[int]]:
    """Rule name -> plan (indices into ``actions``), in a stable order."""
    if n_units < 1:
        raise ValueError(f"n_units={n_units}: a plan needs at least one unit")
    idx = {a: i for i, a in enumerate(actions)}
    rules: dict[str, list[int]] = {}
    keep, rec = idx.get(Action.KEEP), idx.get(Action.RECOMPUTE)
    if keep is not None:
        rules["none"] = [keep] * n_units
    if rec is not None:
        rules["all"] = [rec] * n_units
    if keep is not None and rec is not None:
        for n in range(2, n_units + 1):
            rules[f"every_{n}"] = every_n(n_units, n, keep, rec)
        rules["sqrt_n"] = sqrt_n_plan(n_units, keep, rec)
        for k in range(2, n_units + 1):
            rules[f"segments_{k}"] = checkpoint_sequential_plan(n_units, k, keep, rec)
    if Action.SELECTIVE in idx:
        rules["all_selective"] = [idx[Action.SELECTIVE]] * n_units
    rng = np.random.default_rng(seed)
    for j in range(n_random):
        rules[f"random_{j}"] = rng.integers(0, len(actions), size=n_units).tolist()
    return rules

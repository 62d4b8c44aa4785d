"""Rule-based checkpoint plans shown beside every frontier, as action-index lists.

Indices are positions in the ``actions`` list given (for a profile: ``profile.actions``).
Units are in execution order. "Checkpoint" below means the ``recompute`` action; a "region" is
a ``recompute`` unit and the ``chain`` units after it, recomputed as one checkpoint that keeps
only its input (``env.data.plan``), cut where two units do not chain (``links``).

| Name            | Plan                                                                        |
|-----------------|-----------------------------------------------------------------------------|
| ``none``        | every unit ``keep``                                                         |
| ``all``         | every unit ``recompute``                                                    |
| ``every_n``     | Hugging Face ``every_n_layers``: unit i recomputes if ``i % n == 0``        |
|                 | (n = 2 .. n_units)                                                          |
| ``sqrt_n``      | Chen et al. 2016: ``round(sqrt(n))`` segments cut as below, each one        |
|                 | region (only segment inputs are kept). Without chains: each segment's last |
|                 | unit keeps its activations (the stored boundary), the others recompute     |
| ``segments_k``  | ``torch.utils.checkpoint.checkpoint_sequential(functions, k)``: segments of |
|                 | ``n // k`` units from the start; the first k - 1 each one region, the rest  |
|                 | (the last segment, with any remainder) runs without checkpointing, as      |
|                 | torch's does (k = 2 .. n_units). Without chains: their units recompute     |
| ``blocks_n``    | torchtitan's layer policy where units are a parent's (``spans``): every     |
|                 | n-th span from the first all ``block``, its parent recomputed whole         |
|                 | (n = 1 .. number of spans)                                                  |
| ``all_selective`` | every unit ``selective``                                                  |
| ``random_j``    | each unit's action uniform over ``actions``, seeded (j = 0 .. n_random-1);  |
|                 | a ``chain`` drawn where it cannot continue a region, and a ``block``, are   |
|                 | drawn again among the other actions                                         |

"Without chains": ``actions`` lacks ``chain``, or no unit chains (``links`` all false or
None). Rules needing an action that is not in ``actions`` are left out.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from env.data.plan import Action
from env.data.segments import (blocked_spans, chained_segments, checkpoint_sequential_actions, sequential_segments,
                               sqrt_segments)

__all__ = ["baseline_rules", "checkpoint_sequential_plan", "every_n", "sequential_segments", "sqrt_n_plan"]


def every_n(n_units: int, n: int, keep: int, recompute: int) -> list[int]:
    return [recompute if i % n == 0 else keep for i in range(n_units)]


def checkpoint_sequential_plan(n_units: int, k: int, keep: int, recompute: int) -> list[int]:
    """``checkpoint_sequential``'s segments recomputed unit by unit (the plan without chains)."""
    plan = [keep] * n_units
    for start, stop in sequential_segments(n_units, k)[:-1]:
        plan[start:stop] = [recompute] * (stop - start)
    return plan


def sqrt_n_plan(n_units: int, keep: int, recompute: int) -> list[int]:
    """Chen et al.'s sqrt(n) segments without chains: each segment's last unit kept, the others recomputed."""
    plan = [recompute] * n_units
    for _, stop in sequential_segments(n_units, sqrt_segments(n_units)):
        plan[stop - 1] = keep
    return plan


def _random_plan(rng: np.random.Generator, n_units: int, actions: Sequence[Action], links: Sequence[bool],
                 loss_units: Sequence[bool]) -> list[int]:
    """Uniform actions per unit; a chain that cannot continue a region, 'chunked' off a loss unit, or a block
    (which takes a whole span), drawn again among the others."""
    chain = actions.index(Action.CHAIN) if Action.CHAIN in actions else None
    chunked = actions.index(Action.CHUNKED) if Action.CHUNKED in actions else None
    block = actions.index(Action.BLOCK) if Action.BLOCK in actions else None
    rec = actions.index(Action.RECOMPUTE) if Action.RECOMPUTE in actions else None
    others = [k for k in range(len(actions)) if k not in (chain, chunked, block)]
    plan: list[int] = []
    for i, k in enumerate(rng.integers(0, len(actions), size=n_units).tolist()):
        if ((k == chain and not (i > 0 and links[i] and plan[-1] in (chain, rec))) or (k == chunked and not loss_units[i])
                or k == block):
            k = others[int(rng.integers(0, len(others)))]
        plan.append(k)
    return plan


def baseline_rules(n_units: int, actions: Sequence[Action], seed: int = 0, n_random: int = 3,
                   links: Sequence[bool] | None = None, loss_units: Sequence[bool] | None = None,
                   spans: Sequence[Sequence[int]] = ()) -> dict[str, list[int]]:
    """Rule name -> plan (indices into ``actions``), in a stable order. ``links[i]``: unit i can
    continue the region of unit i - 1 (``ModelProfile.chain_links``); None: no unit chains.
    ``loss_units[i]``: unit i is a loss unit (``ModelProfile.chunk_units``), which ``all_chunked`` (every
    unit recomputed, the loss chunked) chunks; None: none is. ``spans``: (start, stop) of the runs of units that are
    a parent's (``ModelProfile.block_spans``), which ``blocks_n`` recompute as their parents."""
    if n_units < 1:
        raise ValueError(f"n_units={n_units}: a plan needs at least one unit")
    links = list(links) if links else [False] * n_units
    if len(links) != n_units:
        raise ValueError(f"{len(links)} chain links for {n_units} units; give one per unit (links[0] is False)")
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
        if Action.CHAIN in idx and any(links):
            rules["sqrt_n"] = [idx[a] for a in chained_segments(
                n_units, sequential_segments(n_units, sqrt_segments(n_units)), links)]
            for k in range(2, n_units + 1):
                rules[f"segments_{k}"] = [idx[a] for a in checkpoint_sequential_actions(n_units, k, links)]
        else:
            rules["sqrt_n"] = sqrt_n_plan(n_units, keep, rec)
            for k in range(2, n_units + 1):
                rules[f"segments_{k}"] = checkpoint_sequential_plan(n_units, k, keep, rec)
    loss_units = list(loss_units) if loss_units else [False] * n_units
    if rec is not None and Action.CHUNKED in idx and any(loss_units):
        rules["all_chunked"] = [idx[Action.CHUNKED] if loss else rec for loss in loss_units]
    if keep is not None and Action.BLOCK in idx and spans:
        for n in range(1, len(spans) + 1):
            rules[f"blocks_{n}"] = [idx[a] for a in blocked_spans(n_units, [tuple(s) for s in spans[::n]])]
    if Action.SELECTIVE in idx:
        rules["all_selective"] = [idx[Action.SELECTIVE]] * n_units
    rng = np.random.default_rng(seed)
    for j in range(n_random):
        rules[f"random_{j}"] = _random_plan(rng, n_units, list(actions), links, loss_units)
    return rules

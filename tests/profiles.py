"""Synthetic ModelProfiles for tests of the cost model, the exact solver, the env and the agents."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from env.data.model_profile import ModelProfile, Segment, UnitCost, block_costs, chain_costs
from env.data.plan import ACTIONS, Action


def _segment(rng: np.random.Generator, scale: int) -> Segment:
    delta = int(rng.integers(-scale, scale))
    return Segment(delta_bytes=delta, rise_bytes=max(0, delta) + int(rng.integers(0, scale)),
                   seconds=float(rng.uniform(0.001, 0.1)))


def synthetic_profile(n_units: int, n_actions: int, seed: int, scale: int = 1000, chains: bool = False,
                      actions: Sequence[Action] | None = None) -> ModelProfile:
    """A ModelProfile with random segments: not physical, but any walk the cost model can take.

    ``actions``: the profile's actions (chain aside), in place of the first ``n_actions`` of ``Action``.
    ``chains``: the profile has ``chain`` too (after its ``n_actions`` >= 2 actions), with random
    costs, and each unit but the first may chain onto the one before it with probability 0.7."""
    rng = np.random.default_rng(seed)
    actions = list(actions) if actions is not None else list(ACTIONS[:n_actions])
    costs = {a: [UnitCost(fwd=_segment(rng, scale), bwd=_segment(rng, scale)) for _ in range(n_units)]
             for a in actions}
    prof = ModelProfile(workload="synthetic", batch_shape="-", device="none", fingerprint=f"synthetic-{seed}",
                        units=[f"u{i}" for i in range(n_units)], actions=actions,
                        base_bytes=int(rng.integers(0, 10 * scale)), pre=_segment(rng, scale),
                        post=_segment(rng, scale), tail=_segment(rng, scale), costs=costs)
    if not chains:
        return prof
    if n_actions < 2:
        raise ValueError("a profile with chains needs keep and recompute: n_actions >= 2")
    costs[Action.CHAIN] = [UnitCost(fwd=_segment(rng, scale), bwd=_segment(rng, scale)) for _ in range(n_units)]
    links = [False] + [bool(x) for x in rng.random(n_units - 1) < 0.7]
    return prof.model_copy(update={"actions": actions + [Action.CHAIN], "costs": costs, "chain_links": links})


def with_chains(profile: ModelProfile) -> ModelProfile:
    """``profile`` with ``chain`` too, priced from its recompute (``env.data.model_profile.chain_costs``),
    every unit chaining onto the one before it (a stack of blocks, e.g. ``bench.synthetic.layered_profile``)."""
    costs = {**profile.costs, Action.CHAIN: chain_costs(profile.costs[Action.RECOMPUTE])}
    return profile.model_copy(update={"actions": list(profile.actions) + [Action.CHAIN], "costs": costs,
                                      "chain_links": [False] + [True] * (len(profile.units) - 1)})


def with_blocks(profile: ModelProfile, seed: int) -> ModelProfile:
    """``profile`` (which has keep and recompute) with ``block`` too: its units cut into random runs, each run of two
    or more a span (``block_spans``) with probability 0.7, priced from the recompute (``block_costs``)."""
    rng = np.random.default_rng(seed)
    n, spans, start = len(profile.units), [], 0
    while start < n:
        stop = min(n, start + int(rng.integers(1, 4)))
        if stop - start >= 2 and rng.random() < 0.7:
            spans.append((start, stop))
        start = stop
    costs = {**profile.costs, Action.BLOCK: block_costs(profile.costs[Action.RECOMPUTE], spans)}
    return profile.model_copy(update={"actions": list(profile.actions) + [Action.BLOCK], "costs": costs,
                                      "block_spans": spans})

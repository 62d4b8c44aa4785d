"""Synthetic ModelProfiles for tests of the cost model, the exact solver and the env."""

from __future__ import annotations

import numpy as np

from env.plan import ACTIONS
from env.profile import ModelProfile, Segment, UnitCost


def _segment(rng: np.random.Generator, scale: int) -> Segment:
    delta = int(rng.integers(-scale, scale))
    return Segment(delta_bytes=delta, rise_bytes=max(0, delta) + int(rng.integers(0, scale)),
                   seconds=float(rng.uniform(0.001, 0.1)))


def synthetic_profile(n_units: int, n_actions: int, seed: int, scale: int = 1000) -> ModelProfile:
    """A ModelProfile with random segments: not physical, but any walk the cost model can take."""
    rng = np.random.default_rng(seed)
    actions = ACTIONS[:n_actions]
    costs = {a: [UnitCost(fwd=_segment(rng, scale), bwd=_segment(rng, scale)) for _ in range(n_units)]
             for a in actions}
    return ModelProfile(workload="synthetic", batch_shape="-", device="none", fingerprint=f"synthetic-{seed}",
                        units=[f"u{i}" for i in range(n_units)], actions=actions,
                        base_bytes=int(rng.integers(0, 10 * scale)), pre=_segment(rng, scale),
                        post=_segment(rng, scale), tail=_segment(rng, scale), costs=costs)

"""Synthetic ModelProfiles for tests of the cost model, the exact solver, the env and the agents."""

from __future__ import annotations

import numpy as np

from env.data.model_profile import ModelProfile, Segment, UnitCost
from env.data.plan import ACTIONS


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


# unit kinds of a layered model: (share of units, kept bytes / hidden-state bytes, forward seconds per
# kept MiB, fraction of the kept bytes selective saves, share of the forward selective reruns)
_KINDS = {
    "attention": (0.3, 18.0, 0.0040, 0.55, 0.35),
    "mlp": (0.3, 10.0, 0.0020, 0.60, 0.20),
    "norm": (0.25, 1.0, 0.0004, 1.00, 0.50),  # keeps only its output: recomputing saves nothing
    "conv": (0.15, 14.0, 0.0010, 0.50, 0.15),  # big activations, cheap to recompute
}

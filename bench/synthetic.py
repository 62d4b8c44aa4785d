"""A synthetic profile of a layered model, for benchmarks of the agents and the exact solver at any size.

``layered_profile(n, seed)`` gives ``n`` units of random kinds (attention, mlp, norm, conv) and
sizes, with keep / recompute / selective costs as a real profile has them; the exact frontier then
has thousands of points past ~48 units, where a real stack of identical blocks has far fewer.
"""

from __future__ import annotations

import numpy as np

from env.data.model_profile import ModelProfile, Segment, UnitCost
from env.data.plan import ACTIONS

# unit kinds of a layered model: (share of units, kept bytes / hidden-state bytes, forward seconds per
# kept MiB, fraction of the kept bytes selective saves, share of the forward selective reruns)
_KINDS = {
    "attention": (0.3, 18.0, 0.0040, 0.55, 0.35),
    "mlp": (0.3, 10.0, 0.0020, 0.60, 0.20),
    "norm": (0.25, 1.0, 0.0004, 1.00, 0.50),  # keeps only its output: recomputing saves nothing
    "conv": (0.15, 14.0, 0.0010, 0.50, 0.15),  # big activations, cheap to recompute
}


def layered_profile(n_units: int, seed: int, hidden_bytes: int = 262_144) -> ModelProfile:
    """A physical ModelProfile of a layered model: keep / recompute / selective per unit as a real
    profile has them (e.g. ``gpt/small?n_layer=12`` at sub-block units), each unit of a random kind
    (attention, mlp, norm, conv) and size (log-uniform in 0.3x..3x), so that kept bytes and
    recompute costs vary from unit to unit. The exact frontier then has thousands of points past
    ~48 units (a real stack of identical blocks has far fewer).

    Per unit with kept bytes K, input bytes I (the hidden state), gradients G, forward f, backward b:

    | action    | forward delta / rise | backward delta / rise            | seconds                 |
    |-----------|----------------------|----------------------------------|-------------------------|
    | keep      | K / K + t            | G - K / G + t'                   | f + b                   |
    | recompute | I / K + t            | G - I / G + K + t'               | f + b + r f (r ~ 0.95)  |
    | selective | I + sK / K + t       | G - I - sK / G + (1 - s)K + t'   | 1.02 f + b + c f        |
    """
    rng = np.random.default_rng(seed)
    kinds = list(_KINDS)
    shares = np.array([_KINDS[k][0] for k in kinds])
    keep, rec, sel = [], [], []
    for _ in range(n_units):
        _, kept_per_h, f_per_mib, save_share, rerun_share = _KINDS[kinds[rng.choice(len(kinds), p=shares)]]
        size = float(np.exp(rng.uniform(np.log(0.3), np.log(3.0))))
        k_bytes, i_bytes = max(hidden_bytes, int(kept_per_h * hidden_bytes * size)), hidden_bytes
        g_bytes = int(0.5 * k_bytes * rng.uniform(0.5, 1.5))
        t_f, t_b = int(k_bytes * rng.uniform(0.05, 0.25)), int(k_bytes * rng.uniform(0.1, 0.4))
        f = f_per_mib * k_bytes / 2**20 * rng.uniform(0.8, 1.2)
        b = f * rng.uniform(1.0, 2.0)
        s_kept = int(save_share * (k_bytes - i_bytes))
        keep.append(UnitCost(fwd=Segment(delta_bytes=k_bytes, rise_bytes=k_bytes + t_f, seconds=f),
                             bwd=Segment(delta_bytes=g_bytes - k_bytes, rise_bytes=g_bytes + t_b, seconds=b)))
        rec.append(UnitCost(fwd=Segment(delta_bytes=i_bytes, rise_bytes=k_bytes + t_f, seconds=f),
                            bwd=Segment(delta_bytes=g_bytes - i_bytes, rise_bytes=g_bytes + k_bytes + t_b,
                                        seconds=b + f * rng.uniform(0.8, 1.1))))
        sel.append(UnitCost(fwd=Segment(delta_bytes=i_bytes + s_kept, rise_bytes=k_bytes + t_f, seconds=1.02 * f),
                            bwd=Segment(delta_bytes=g_bytes - i_bytes - s_kept, rise_bytes=g_bytes + k_bytes - s_kept + t_b,
                                        seconds=b + f * rerun_share * rng.uniform(0.7, 1.3))))
    kept = sum(c.fwd.delta_bytes for c in keep)
    grads = sum(c.fwd.delta_bytes + c.bwd.delta_bytes for c in keep)
    step_seconds = sum(c.fwd.seconds + c.bwd.seconds for c in keep)
    return ModelProfile(workload="layered", batch_shape="-", device="none", fingerprint=f"layered-{n_units}-{seed}",
                        units=[f"u{i}" for i in range(n_units)], actions=list(ACTIONS[:3]),
                        base_bytes=int(0.4 * kept), pre=Segment(delta_bytes=hidden_bytes, rise_bytes=2 * hidden_bytes,
                                                                seconds=0.02 * step_seconds),
                        post=Segment(delta_bytes=0, rise_bytes=0, seconds=0.0),
                        tail=Segment(delta_bytes=-grads, rise_bytes=hidden_bytes, seconds=0.1 * step_seconds),
                        costs={ACTIONS[0]: keep, ACTIONS[1]: rec, ACTIONS[2]: sel})

"""Say when no checkpoint plan can lower the peak: what holds it, and what to try instead.

``nothing_to_save(profile)`` reads a ModelProfile (duck-typed: ``units``, ``actions``,
``costs``, ``base_bytes`` and the segments the cost model walks) and returns one line when the
lowest peak any plan over the units reaches on the cost model (the exact solver's first
frontier point) is within ``threshold`` of the all-``keep`` peak; ``None`` when a search is
worth running. The line names what holds the peak (bytes live before the step: weights,
optimizer state, the batch; against activations, and the unit that keeps the most) and what
would help instead.

Torch-free at import: the cost model and the solver are imported when called (today
``env.cost.cost_model`` still reaches torch through ``env.measure.profiler``).
"""

from __future__ import annotations

from env.cost.cost_model import CostModel
from env.cost.peak_walk import PeakWalk
from env.data.model_profile import ModelProfile
from env.data.types import MIB

THRESHOLD = 0.05  # a search that can save less than this share of the peak is not worth running


def _mib(nbytes: float) -> str:
    return f"{nbytes / MIB:.1f} MiB"


def lowest_and_keep_peak(profile: ModelProfile) -> tuple[int, int]:
    """(lowest predicted peak over all plans, predicted all-keep peak), in bytes."""
    if "keep" not in profile.actions:
        raise ValueError(f"the profile has no 'keep' action (actions: {', '.join(map(str, profile.actions))}); "
                         "profile with keep to have the no-checkpoint baseline")
    cm = CostModel(profile)
    keep = cm.peak_bytes([profile.actions.index("keep")] * cm.n_units)
    walk = PeakWalk(cm, list(range(len(profile.actions))))
    lowest = walk.lowest(0, walk.initial())
    assert lowest is not None, "all-keep is always a completion"
    return lowest, keep


def nothing_to_save(profile: ModelProfile, threshold: float = THRESHOLD) -> str | None:
    """One line when no plan lowers the predicted peak by more than ``threshold``; else None."""
    lowest, keep = lowest_and_keep_peak(profile)
    saving = 1 - lowest / keep if keep > 0 else 0.0
    if saving > threshold:
        return None
    n = len(profile.units)
    before = profile.base_bytes
    activations = max(keep - before, 0)
    keep_action = profile.actions[profile.actions.index("keep")]  # an Action, or "keep" read from JSON
    kept = [c.fwd.delta_bytes for c in profile.costs[keep_action]]
    top = max(range(n), key=lambda i: kept[i]) if n else None
    in_units = sum(max(k, 0) for k in kept)
    head = (f"nothing to save: no plan over the {n} units lowers the predicted peak by more than {threshold:.0%} "
            f"(at best {saving:.1%}: {_mib(keep)} -> {_mib(lowest)}); ")
    what = (f"{before / keep:.0%} of the peak is live before the step (weights, optimizer state, batch: "
            f"{_mib(before)}) and the step adds {_mib(activations)} (gradients, activations, temporaries)")
    if top is not None:
        what += (f", of which the units keep {_mib(in_units)} for backward ('{profile.units[top]}' the most: "
                 f"{_mib(kept[top])})")
    if before >= activations:
        fix = ("checkpointing cannot lower what is live before the step, nor will a smaller batch: shard weights, "
               "gradients and optimizer state (FSDP/ZeRO), use a lighter optimizer (SGD, Adafactor, 8-bit Adam) "
               "or lower precision")
    elif in_units < activations / 2:
        fix = ("most of it is outside the units: choose more or finer units (--units auto, or name them), "
               "or a smaller batch")
    else:
        fix = ("the unit that keeps the most sets the peak when it is recomputed: choose finer units "
               "(--units auto, or name its children), offload activations on a GPU, or a smaller batch")
    return head + what + "; " + fix

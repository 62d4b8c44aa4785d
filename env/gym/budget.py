"""The env's memory budget: one number, a range drawn per episode, or a share of what is reachable."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence

import numpy as np

from env.data.model_profile import ModelProfile
from env.data.plan import Action

REWARD_MODES = ("model", "measured")


@dataclass(frozen=True)
class BudgetShare:
    """Budgets as shares of the reachable range: 0 is the lowest reachable peak, 1 the all-keep
    baseline's (in measured bytes once plans are measured: both scale with the mean measured/
    predicted peak ratio). ``BudgetShare(0.5, 1.0)``: the upper half of the frontier."""

    low: float = 0.0
    high: float = 1.0


Budget = int | tuple[int, int] | BudgetShare | None  # one budget, a (low, high) range in bytes, a share, or all


def reward_mode_name(mode: str | Enum) -> str:
    """``model`` or ``measured`` from a str or a str-valued Enum member; a clear error otherwise."""
    name = mode.value if isinstance(mode, Enum) else mode
    if name not in REWARD_MODES:
        raise ValueError(f"reward_mode {name!r} is not one of {', '.join(REWARD_MODES)}; pick one (the search's "
                         "hybrid reward is 'model' plus measurements given to add_measurements)")
    return str(name)


def parse_budget(budget_bytes: Budget) -> tuple[int, int] | BudgetShare:
    """A ``(low, high)`` range in bytes, or a ``BudgetShare`` (None: the whole reachable range)."""
    if budget_bytes is None or isinstance(budget_bytes, BudgetShare):
        share = budget_bytes or BudgetShare()
        if not 0.0 <= share.low <= share.high <= 1.0:
            raise ValueError(f"budget_bytes={budget_bytes} must have 0 <= low <= high <= 1 (0: the lowest "
                             "reachable peak, 1: the baseline's)")
        return share
    low, high = (budget_bytes, budget_bytes) if np.isscalar(budget_bytes) else tuple(budget_bytes)  # type: ignore[arg-type]
    if int(low) <= 0 or int(high) < int(low):
        raise ValueError(f"budget_bytes={budget_bytes} must be a positive number of bytes, a (low, high) "
                         "range with 0 < low <= high, a BudgetShare, or None for the whole reachable range")
    return int(low), int(high)


def check_env_args(profile: ModelProfile, reward_mode: str, has_evaluator: bool,
                   actions: Sequence[Action] | None) -> None:
    """Refuse arguments the env cannot run with, each in one line naming the fix."""
    if reward_mode != "model" and not has_evaluator:
        raise ValueError(f"reward_mode '{reward_mode}' needs an evaluator (plan indices -> (peak_bytes, "
                         "step_seconds)); pass evaluator= or use reward_mode='model'")
    if Action.KEEP not in profile.actions:
        raise ValueError("the profile has no 'keep' action, which the baseline needs; profile with keep")
    if actions is not None:
        missing = [a for a in actions if a not in profile.actions]
        if missing or not actions or len(set(actions)) != len(actions):
            raise ValueError(f"actions {[str(a) for a in actions]} must be distinct and among the "
                             f"profiled {', '.join(a.value for a in profile.actions)}; choose from those")
        if Action.CHAIN in actions and Action.RECOMPUTE not in actions:
            raise ValueError(f"actions {[str(a) for a in actions]} have 'chain' without 'recompute', which starts "
                             "every region; enable recompute too, or leave chain out")

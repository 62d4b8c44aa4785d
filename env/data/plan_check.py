"""The correctness gate's verdict on one plan: plain data (no torch), for the store, frontier.json and report.md.

A plan is checked once on the workload itself before it leaves a search or ``auto_checkpoint``: one training
step with the plan against one without, from the same weights, inputs and RNG state (``env.measure.gate``).
``error`` is ``env.runtime.chains.step_error`` of the two: the largest difference of the loss or of a
parameter's gradient, relative to that quantity's largest magnitude in the unplanned step. A plan passes where
``error <= tolerance``; the tolerance is stated per precision (``GATE_TOLERANCE``).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from env.data.errors import CkptSearchError

GATE_TOLERANCE: dict[str, float] = {
    # fp32 steps: a recomputed unit reruns the same kernels on the same data, so only the order in which
    # gradients are summed differs (about 1e-6 relative); 1e-3 is env.measure.peers.GRADIENT_TOLERANCE too.
    "32": 1e-3,
    # mixed and bf16 steps: a recompute reruns the same low-precision kernels, but the chunked loss and
    # selective's saved outputs sum in another order, each rounding at the autocast dtype's epsilon (bf16
    # 2**-8, fp16 2**-11) over a few hundred terms; measured up to 2e-2 (bf16-mixed) and 3e-2 (bf16-true) on
    # gpt/tiny (tests/test_loss_unit.py). A plan that replays another dropout mask errs by 0.5 and more.
    "bf16-mixed": 5e-2,
    "16-mixed": 1e-2,
    "bf16-true": 5e-2,
}
PRECISIONS: tuple[str, ...] = tuple(GATE_TOLERANCE)


def gate_tolerance(precision: str | None) -> float:
    """The gate's tolerance for a workload's precision (None: ``32``); a clear error for one it has none for."""
    key = "32" if precision in (None, 32) else str(precision)
    if key not in GATE_TOLERANCE:
        raise CkptSearchError(f"precision {precision!r} has no gradient tolerance for the correctness gate; "
                              f"choose one of {', '.join(PRECISIONS)} (or None for 32)")
    return GATE_TOLERANCE[key]


class PlanCheck(BaseModel):
    """One plan checked against the unplanned step: passed or not, the largest error, and where it failed the
    units whose recompute changed the result (``culprits``) with the likely ``causes`` seen on it."""

    model_config = ConfigDict(frozen=True)

    digest: str
    passed: bool
    error: float  # step_error of the planned step against the unplanned one; inf: a gradient appeared or vanished
    tolerance: float
    culprits: list[str] = []  # the units whose action alone, every other unit kept, changes the step
    causes: list[str] = []  # what one forward of the first culprit shows: random numbers outside torch, ...

    @property
    def culprit(self) -> str | None:
        """The first unit whose recompute alone changes the step; None where it passed, or no unit does alone."""
        return self.culprits[0] if self.culprits else None

    def line(self) -> str:
        """One line: the verdict, the error against the tolerance, and where a failure lies."""
        err = "inf" if math.isinf(self.error) else f"{self.error:.2g}"
        if self.passed:
            return f"checked: loss and gradients as without the plan (largest error {err} <= {self.tolerance:g})"
        named = ", ".join(f"'{u}'" for u in self.culprits)
        where = f"recomputing unit {named} changes them" if self.culprits else "no one unit alone changes them"
        causes = f" ({'; '.join(self.causes)})" if self.causes else ""
        return f"refused: the plan changes the loss or gradients (error {err} > {self.tolerance:g}); {where}{causes}"

"""The model-optimal (plan, micro-batch) under a memory cap: the exact solver at every micro-batch.

At a micro-batch ``b`` a plan trains ``b / step_seconds`` samples per second, so under a cap the
best plan at ``b`` is the fastest plan that fits, which the exact frontier at ``b`` holds
(``agents.exact``, on the cost model of the profile fitted at ``b``: ``env.cost.batch_fit``). The
best (plan, micro-batch) is the best of those over the micro-batches: ``model_optimal``. It is the
yardstick of the throughput search and its first candidates; ``ranked`` orders any plans at any
micro-batches by what the cost model predicts, for the search to measure from the top.

A cap is checked against ``counted(peak, b)``: the predicted peak as the search counts it (scaled
by what measurements at ``b`` showed, the gradients added when accumulating). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from agents.exact import FrontierPoint, exact_frontier
from env.cost.cost_model import CostModel
from env.data.types import Indices

Counted = Callable[[int, int], int]  # (predicted peak bytes, micro-batch) -> the bytes a cap is checked against
CostModelAt = Callable[[int], CostModel]


@dataclass(frozen=True)
class BatchChoice:
    """A plan at a micro-batch, as the cost model predicts it."""

    plan: Indices
    micro_batch: int
    peak_bytes: int  # as counted against a cap
    step_seconds: float

    @property
    def samples_per_second(self) -> float:
        return self.micro_batch / self.step_seconds if self.step_seconds > 0 else 0.0


def exact_frontiers(cost_model_at: CostModelAt, batches: Iterable[int], relative: float = 0.0
                    ) -> dict[int, list[FrontierPoint]]:
    """The exact frontier at each micro-batch (``relative``: the solver's merge step, ``agents.exact``)."""
    return {b: exact_frontier(cost_model_at(b), relative=relative) for b in batches}


def model_optimal(frontiers: dict[int, list[FrontierPoint]], cap_bytes: int, counted: Counted) -> BatchChoice | None:
    """The (plan, micro-batch) of the most samples per second whose counted peak fits ``cap_bytes``; None if none."""
    best: BatchChoice | None = None
    for b, front in frontiers.items():
        fits = [p for p in front if counted(p.peak_bytes, b) <= cap_bytes]
        if not fits:
            continue
        fastest = min(fits, key=lambda p: p.step_seconds)
        choice = BatchChoice(tuple(fastest.plan), b, counted(fastest.peak_bytes, b), fastest.step_seconds)
        if best is None or choice.samples_per_second > best.samples_per_second:
            best = choice
    return best


def ranked(plans: Iterable[Sequence[int]], cost_model_at: CostModelAt, batches: Sequence[int], cap_bytes: int,
           counted: Counted) -> list[BatchChoice]:
    """Every (plan, micro-batch) of these predicted to fit ``cap_bytes``, most samples per second first."""
    out = []
    unique = list(dict.fromkeys(tuple(int(a) for a in p) for p in plans))
    for b in batches:
        cm = cost_model_at(b)
        for p in unique:
            peak = counted(cm.peak_bytes(p), b)
            if peak <= cap_bytes:
                out.append(BatchChoice(p, b, peak, cm.step_seconds(p)))
    return sorted(out, key=lambda c: (-c.samples_per_second, c.peak_bytes, c.plan))

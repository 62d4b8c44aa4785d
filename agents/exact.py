"""Exact memory/time Pareto frontier of a profile's plans on the cost model.

A label-setting dynamic program over the units in execution order. A label is a partial
plan for units ``0..k-1`` with its summed seconds and its peak state ``(P, L, M)`` (peak so
far, forward level, level plus the backward part; see ``env.peak_walk``): enough to
finish the cost model's walk for any completion, including the backward pass that visits
the units in reverse. The plan's peak is ``max(P, L + cL, M + cM)`` for the completion's
``(cL, cM)``, which is non-decreasing in ``P``, ``L`` and ``M``, and time is additive, so a
label that is no better than another in all four of ``(seconds, P, L, M)`` can be dropped
without losing a frontier point. ``P`` is first raised to the lowest peak any completion
gives (``max(P, L + min cL, M + min cM)``), which changes no plan's peak and lets more
labels dominate. The last units' labels give exact (peak, time) pairs; their non-dominated
set is the frontier. This is rotor's idea (Beaumont et al. 2019: a dynamic program over a
chain carrying memory state) for a profile of per-unit decisions rather than a budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from env.peak_walk import advance, initial_state, suffix_functionals, unit_terms
from env.cost_model import CostModel


@dataclass(frozen=True)
class FrontierPoint:
    plan: tuple[int, ...]  # profile action index per unit
    peak_bytes: int
    step_seconds: float


class _Labels:
    """Non-dominated labels of one stage: seconds, P, L, M arrays plus each label's plan."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, int, int]] = []
        self.plans: list[tuple[int, ...]] = []

    def add_all(self, cands: list[tuple[float, int, int, int, tuple[int, ...]]]) -> None:
        """Keep the candidates no other candidate weakly dominates (first of equals kept)."""
        cands.sort(key=lambda c: c[:4])
        kept = np.empty((len(cands), 3), dtype=np.int64)  # P, L, M of the labels kept so far
        k = 0
        for t, p, level, m, plan in cands:
            if k and np.any((kept[:k, 0] <= p) & (kept[:k, 1] <= level) & (kept[:k, 2] <= m)):
                continue  # a kept label is no slower (sorted) and no worse in P, L, M
            kept[k] = (p, level, m)
            k += 1
            self.rows.append((t, p, level, m))
            self.plans.append(plan)


def exact_frontier(cost_model: CostModel, actions: Sequence[int] | None = None) -> list[FrontierPoint]:
    """Every non-dominated (peak_bytes, step_seconds) over all plans, sorted by memory.

    ``actions``: profile action indices allowed at every unit (default all). Points with equal
    peak and time are reported once (one of their plans).
    """
    prof = cost_model.profile
    acts = list(actions) if actions is not None else list(range(len(prof.actions)))
    terms = unit_terms(cost_model, acts)
    suffix = suffix_functionals(prof, terms)
    secs = cost_model.seconds.tolist()
    labels = _Labels()
    labels.add_all([(0.0, *initial_state(prof), ())])
    for i in range(cost_model.n_units):
        min_cl, min_cm = min(c[0] for c in suffix[i + 1]), min(c[1] for c in suffix[i + 1])
        cands = []
        for (t, p, level, m), plan in zip(labels.rows, labels.plans):
            for k, a in enumerate(acts):
                p2, l2, m2 = advance((p, level, m), terms[i][k])
                cands.append((t + secs[i][a], max(p2, l2 + min_cl, m2 + min_cm), l2, m2, plan + (a,)))
        labels = _Labels()
        labels.add_all(cands)
    (post_rise, post_delta), = suffix[-1]
    ends = [(max(p, level + post_rise, m + post_delta), cost_model.fixed_seconds + t, plan)
            for (t, p, level, m), plan in zip(labels.rows, labels.plans)]
    return pareto_points(ends)


def pareto_points(points: list[tuple[int, float, tuple[int, ...]]]) -> list[FrontierPoint]:
    """(peak, seconds, plan) triples -> the non-dominated ones, sorted by peak, equals once."""
    out: list[FrontierPoint] = []
    for peak, seconds, plan in sorted(points, key=lambda x: (x[0], x[1])):
        if not out or seconds < out[-1].step_seconds:
            out.append(FrontierPoint(tuple(plan), int(peak), float(seconds)))
    return out

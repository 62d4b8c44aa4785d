"""Exact memory/time Pareto frontier of a profile's plans on the cost model.

A label-setting dynamic program over the units in execution order. A label is a partial
plan for units ``0..k-1`` with its summed seconds and its peak state ``(P, L, M)`` (peak so
far, forward level, level plus the backward part; see ``env.cost.peak_walk``): enough to
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

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from env.cost.cost_model import CostModel
from env.cost.peak_walk import advance, initial_state, suffix_functionals, unit_terms
from env.data.plan import Action


@dataclass(frozen=True)
class FrontierPoint:
    plan: tuple[int, ...]  # profile action index per unit
    peak_bytes: int
    step_seconds: float


class _Labels:
    """Non-dominated labels of one stage: seconds, P, L, M arrays plus each label's plan."""

    def __init__(self, resolution_bytes: int = 1, relative: float = 0.0,
                 reference: tuple[int, int, int] = (0, 0, 0)) -> None:
        self.rows: list[tuple[float, int, int, int]] = []
        self.plans: list[tuple[int, ...]] = []
        self.resolution = max(1, int(resolution_bytes))
        self.log_step = math.log1p(relative) if relative > 0 else 0.0
        self.reference = reference

    def _key(self, x: int, ref: int) -> int:
        """x in steps: of ``resolution`` bytes, or (``relative``) of a share of how far x lies below
        ``ref`` (the all-keep plan's state), never finer than ``resolution``. Non-decreasing in x."""
        r = self.resolution
        if not self.log_step:
            return -(-x // r)
        below = ref - x
        if below < r:
            return -(-(x - ref + r) // r) - 1
        return -1 - int(math.log(below / r) / self.log_step)

    def add_all(self, cands: list[tuple[float, int, int, int, tuple[int, ...]]]) -> None:
        """Keep the candidates no other candidate weakly dominates (first of equals kept); P, L, M
        compared in the steps of ``_key`` (1 byte: exactly)."""
        cands.sort(key=lambda c: c[:4])
        kept = np.empty((len(cands), 3), dtype=np.int64)  # P, L, M of the labels kept so far
        k = 0
        rp, rl, rm = self.reference
        for t, p, level, m, plan in cands:
            key = (self._key(p, rp), self._key(level, rl), self._key(m, rm))
            if k and np.any((kept[:k, 0] <= key[0]) & (kept[:k, 1] <= key[1]) & (kept[:k, 2] <= key[2])):
                continue  # a kept label is no slower (sorted) and no worse in P, L, M
            kept[k] = key
            k += 1
            self.rows.append((t, p, level, m))
            self.plans.append(plan)


def exact_frontier(cost_model: CostModel, actions: Sequence[int] | None = None,
                   resolution_bytes: int = 1, relative: float = 0.0) -> list[FrontierPoint]:
    """Every non-dominated (peak_bytes, step_seconds) over all plans, sorted by memory.

    ``actions``: profile action indices allowed at every unit (default all). Points with equal
    peak and time are reported once (one of their plans). ``resolution_bytes`` > 1 compares the
    labels' peak states in steps of that many bytes: an approximate frontier (each unit may
    trade up to that many bytes of a dropped label's state for time) whose label count stays
    bounded where units of many different sizes make the exact one grow combinatorially.
    ``relative`` > 0 makes the step that share of how far a state lies below the all-keep plan's
    (at least ``resolution_bytes``): fine near the baseline, where frontier plans differ by a
    unit or two, coarse where they save much.
    """
    prof = cost_model.profile
    acts = list(actions) if actions is not None else list(range(len(prof.actions)))
    terms = unit_terms(cost_model, acts)
    suffix = suffix_functionals(prof, terms)
    secs = cost_model.seconds.tolist()
    keep = cost_model.action_index(Action.KEEP) if Action.KEEP in prof.actions else acts[0]
    keep_terms = unit_terms(cost_model, [keep])
    ref = initial_state(prof)  # the all-keep plan's state, for relative steps
    labels = _Labels(resolution_bytes)
    labels.add_all([(0.0, *initial_state(prof), ())])
    for i in range(cost_model.n_units):
        min_cl, min_cm = min(c[0] for c in suffix[i + 1]), min(c[1] for c in suffix[i + 1])
        p_ref, l_ref, m_ref = ref = advance(ref, keep_terms[i][0])
        cands = []
        for (t, p, level, m), plan in zip(labels.rows, labels.plans):
            for k, a in enumerate(acts):
                p2, l2, m2 = advance((p, level, m), terms[i][k])
                cands.append((t + secs[i][a], max(p2, l2 + min_cl, m2 + min_cm), l2, m2, plan + (a,)))
        labels = _Labels(resolution_bytes, relative, (max(p_ref, l_ref + min_cl, m_ref + min_cm), l_ref, m_ref))
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

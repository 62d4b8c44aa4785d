"""Exact memory/time Pareto frontier of a profile's plans on the cost model.

A label-setting dynamic program over the units in execution order. A label is a partial
plan for units ``0..k-1`` with its summed seconds and its peak state (``env.cost.peak_walk``):
closed ``(P, L, M)`` (peak so far, forward level, level plus the backward part), or open
``(P, L, T, Q, G)`` while a chain region is open. That is enough to finish the cost model's walk
for any completion, including the backward pass that visits the units in reverse. The plan's
peak is a max of the state's entries plus the completion's coefficients, non-decreasing in each
entry, and time is additive, so a label that is no better than another of its kind in seconds
and every entry can be dropped without losing a frontier point. ``P`` is first raised to a
lower bound of the peak every completion gives (each entry plus its smallest coefficient), which
changes no plan's peak and lets more labels dominate. A ``recompute`` makes two labels (a region
of one, closed; a region opened), a ``chain`` continues only open labels and makes two (closed
at it, still open); a ``block`` on a span's first unit takes a closed label over the whole span, to the stage
after it; only closed labels finish. The last units' labels give exact (peak, time)
pairs; their non-dominated set is the frontier. This is rotor's idea (Beaumont et al. 2019: a
dynamic program over a chain carrying memory state) for a profile of per-unit decisions and
chain regions rather than a budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from env.cost.cost_model import CostModel
from env.cost.peak_walk import PeakWalk, advance, initial_state, open_region, unit_terms


@dataclass(frozen=True)
class FrontierPoint:
    plan: tuple[int, ...]  # profile action index per unit
    peak_bytes: int
    step_seconds: float


class _Labels:
    """Non-dominated labels of one stage and kind: seconds and state rows plus each label's plan."""

    def __init__(self, resolution_bytes: int = 1, relative: float = 0.0, reference: tuple[int, ...] = ()) -> None:
        self.rows: list[tuple] = []  # (seconds, *state)
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

    def add_all(self, cands: list[tuple]) -> None:
        """Keep the candidates ``(seconds, *state, plan)`` no other candidate weakly dominates (first of
        equals kept); states compared in the steps of ``_key`` (1 byte: exactly)."""
        if not cands:
            return
        cands.sort(key=lambda c: c[:-1])
        width = len(cands[0]) - 2
        kept = np.empty((width, len(cands)), dtype=np.int64)  # the states of the labels kept so far, by column
        k = 0
        refs = self.reference or (0,) * width
        for c in cands:
            key = [self._key(x, r) for x, r in zip(c[1:-1], refs)]
            if k:
                below = kept[0, :k] <= key[0]
                for j in range(1, width):
                    below &= kept[j, :k] <= key[j]
                if below.any():
                    continue  # a kept label is no slower (sorted) and no worse in any state entry
            kept[:, k] = key
            k += 1
            self.rows.append(c[:-1])
            self.plans.append(c[-1])


def exact_frontier(cost_model: CostModel, actions: Sequence[int] | None = None,
                   resolution_bytes: int = 1, relative: float = 0.0) -> list[FrontierPoint]:
    """Every non-dominated (peak_bytes, step_seconds) over all plans, sorted by memory.

    ``actions``: profile action indices allowed at every unit (default all; ``chain`` only where
    the profile's links allow it, after a ``recompute`` or a ``chain``). Points with equal peak and
    time are reported once (one of their plans). ``resolution_bytes`` > 1 compares the labels' peak
    states in steps of that many bytes: an approximate frontier (each unit may trade up to that many
    bytes of a dropped label's state for time) whose label count stays bounded where units of many
    different sizes make the exact one grow combinatorially. ``relative`` > 0 makes the step that
    share of how far a state lies below the all-keep plan's (at least ``resolution_bytes``): fine
    near the baseline, where frontier plans differ by a unit or two, coarse where they save much.
    """
    prof = cost_model.profile
    acts = list(actions) if actions is not None else list(range(len(prof.actions)))
    walk = PeakWalk(cost_model, acts)
    secs = cost_model.seconds.tolist()
    keep = cost_model.keep if cost_model.keep is not None else acts[0]
    keep_terms = unit_terms(cost_model, [keep])
    ref = initial_state(prof)  # the all-keep plan's state, for relative steps
    closed = _Labels(resolution_bytes)
    closed.add_all([(0.0, *initial_state(prof), ())])
    opened = _Labels(resolution_bytes)
    lows_c, lows_o = _lowest_coefficients(walk.closed_fs), _lowest_coefficients(walk.open_fs)
    spans: dict[int, list[tuple]] = {}  # closed labels that a block span starting earlier brings to a stage
    for i in range(cost_model.n_units):
        ref = advance(ref, keep_terms[i][0])
        (lc_l, lc_m), low_o = lows_c[i + 1], lows_o[i + 1]
        terms, sec = walk.terms[i], secs[i]
        c_cands: list[tuple] = []
        o_cands: list[tuple] = []
        opens = walk.k_rec is not None and walk.may_chain[i + 1]
        for (t, p, level, m), plan in zip(closed.rows, closed.plans):
            if i in walk.span_end:
                stop, a = walk.span_end[i], acts[walk.k_block]  # type: ignore[index]
                p2, l2, m2 = walk.macro(i, (p, level, m))
                t2 = t
                for j in range(i, stop):  # unit by unit, as CostModel.step_seconds sums: the same float
                    t2 += secs[j][a]
                spans.setdefault(stop, []).append((t2, p2, l2, m2, plan + (a,) * (stop - i)))
            for k, a in enumerate(acts):
                if k in (walk.k_chain, walk.k_block) or not walk.allowed[i][k]:
                    continue
                p2, l2, m2 = advance((p, level, m), terms[k])
                c_cands.append((t + sec[a], max(p2, l2 + lc_l, m2 + lc_m), l2, m2, plan + (a,)))
                if k == walk.k_rec and opens:
                    o = open_region((p, level, m), terms[k], walk.keep_terms[i])
                    o_cands.append((t + sec[a], _raised(o, low_o), *o[1:], plan + (a,)))
        if walk.may_chain[i]:
            k, a = walk.k_chain, acts[walk.k_chain]  # type: ignore[index]
            for (t, *state), plan in zip(opened.rows, opened.plans):
                c, o, _ = walk.step(i, k, (None, tuple(state), 0))  # type: ignore[arg-type]
                if c is not None:
                    c_cands.append((t + sec[a], max(c[0], c[1] + lc_l, c[2] + lc_m), c[1], c[2], plan + (a,)))
                if o is not None:
                    o_cands.append((t + sec[a], _raised(o, low_o), *o[1:], plan + (a,)))
        c_cands += [(t, max(p, level + lc_l, m + lc_m), level, m, plan) for t, p, level, m, plan in spans.pop(i + 1, [])]
        p_ref = max(ref[0], ref[1] + lc_l, ref[2] + lc_m)
        closed = _Labels(resolution_bytes, relative, (p_ref, *ref[1:]))
        closed.add_all(c_cands)
        opened = _Labels(resolution_bytes, relative, (p_ref, ref[1], ref[1], ref[1], ref[2]))
        opened.add_all(o_cands)
    (post_rise, post_delta), = walk.closed_fs[-1]
    ends = [(max(p, level + post_rise, m + post_delta), cost_model.fixed_seconds + t, plan)
            for (t, p, level, m), plan in zip(closed.rows, closed.plans)]
    return pareto_points(ends)


def _lowest_coefficients(functionals: list[list[tuple[int, ...]]]) -> list[tuple[int, ...]]:
    """Per stage, each coordinate's smallest coefficient over the suffix's functionals (() if none)."""
    return [tuple(min(col) for col in zip(*fs)) if fs else () for fs in functionals]


def _raised(state: tuple[int, ...], lowest: tuple[int, ...]) -> int:
    """P raised to a lower bound of the peak of every completion: each other entry plus its smallest
    coefficient over the suffix's functionals (``lowest``); changes no completion's peak."""
    return max(state[0], *(x + c for x, c in zip(state[1:], lowest))) if lowest else state[0]


def pareto_points(points: list[tuple[int, float, tuple[int, ...]]]) -> list[FrontierPoint]:
    """(peak, seconds, plan) triples -> the non-dominated ones, sorted by peak, equals once."""
    out: list[FrontierPoint] = []
    for peak, seconds, plan in sorted(points, key=lambda x: (x[0], x[1])):
        if not out or seconds < out[-1].step_seconds:
            out.append(FrontierPoint(tuple(plan), int(peak), float(seconds)))
    return out

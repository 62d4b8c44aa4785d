"""The cost model's peak walk carried one unit at a time, for the env's masks and the exact solver.

``CostModel.peak_bytes`` walks a whole plan. Carried unit by unit, the walk needs only three
numbers, the closed state (P, L, M): the peak so far, the forward level, and the level plus the
backward part still to come; a unit's action moves it with ``advance``. The backward pass visits
the units in reverse, so a forward walk cannot finish it unit by unit; ``M = L + R`` carries it
instead, where ``R`` is the backward part of the units seen so far measured from the start of
their backward (``R = tail.rise`` before any unit)::

    P' = max(P, L + f_rise)      L' = L + f_delta      M' = max(M + f_delta + b_delta, L + f_delta + b_rise)
    peak = max(P, L + post.rise, M + post.delta)                  (after the last unit)

**Chains.** While a region (``recompute`` then ``chain`` units, ``env.cost.cost_model``) is open
the walk carries the open state (P, L, T, Q, G): with S the kept bytes of the region's units so
far (as kept units; they are recomputed together) and M0 the closed M before the region,
``T = L + S``, ``Q = L +`` the highest point of the recompute so far, and ``G`` the largest of
``L + S +`` the kept units' backward rise and ``M0 +`` the region's net bytes so far. A unit
(``u``: its forward under its action; ``k``: its keep terms) moves it::

    open at unit j (recompute):  L' = L + fu   T = L' + fk   Q = L' + fkr   G = max(T + bkr, M + fu + fk + bkd)
    continue (chain, not last):  L' = L + fu   T' = T + fu + fk   Q' = max(Q + fu, T + fu + fkr)
                                 G' = max(T' + bkr, G + fu + fk + bkd)
    close (chain, last; b: its backward under chain, as recomputed):
                                 L' = L + fu   M' = max(Q + fu, T + fu + br, G + fu + bd)

so a recompute unit leads to two states (a region of one, closed, and a region opened), a chain
unit to two (the region closed at it, or still open), and the next action keeps the one that
applies: a chain continues only an open state, any other action only a closed one.

**Blocks.** ``block`` on the first unit of a span (``ModelProfile.block_spans``: all the units of one parent)
recomputes the span as one region (open, continue, close, as a chain region), so the walk moves the closed state
over the whole span at that unit (``macro``) and the state notes where the span ends; its other units must be
``block`` too, and move nothing. A span acts on a closed state as ``(max(P, L + a), L + b, max(L + c, M + d))``.

Every update is a max of sums, so the units ``k .. n-1`` act on a state as one functional: the
peak is ``max(P, L + cL, M + cM)`` from a closed state and ``max(P, L + cL, T + cT, Q + cQ, G +
cG)`` from an open one, over a set of coefficient vectors (one per completion; the dominated
ones dropped). ``PeakWalk`` keeps these sets per unit, so the lowest peak any completion of a
prefix can reach is exact: what the env's masks and the exact solver's pruning use. Plain ints:
this runs on every env step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from env.cost.cost_model import CostModel
from env.data.model_profile import ModelProfile

UnitTerms = tuple[int, int, int, int]  # (f_delta, f_rise, b_delta, b_rise) of one unit under one action
Closed = tuple[int, int, int]  # (P, L, M)
Open = tuple[int, int, int, int, int]  # (P, L, T, Q, G)
# what a plan prefix may continue from: closed, open (or None), and the unit where the block span it is in ends
# (0: none; inside one, the closed state is the state after the span)
States = tuple[Closed | None, Open | None, int]


def initial_state(profile: ModelProfile) -> Closed:
    """(P, L, M) before the first unit: peak so far, forward level, level plus backward part."""
    level = profile.base_bytes + profile.pre.delta_bytes
    return profile.base_bytes + profile.pre.rise_bytes, level, level + profile.tail.rise_bytes


def advance(state: Closed, terms: UnitTerms) -> Closed:
    """The closed state after one more unit whose action has these (f_delta, f_rise, b_delta, b_rise)."""
    p, level, m = state
    fd, fr, bd, br = terms
    return max(p, level + fr), level + fd, max(m + fd + bd, level + fd + br)


def open_region(state: Closed, unit: UnitTerms, keep: UnitTerms) -> Open:
    """The open state after a recompute unit (``unit``: its recompute terms) that starts a region."""
    p, level, m = state
    fu, fr = unit[0], unit[1]
    fk, fkr, bkd, bkr = keep
    l2 = level + fu
    t = l2 + fk
    return max(p, level + fr), l2, t, l2 + fkr, max(t + bkr, m + fu + fk + bkd)


def continue_region(state: Open, unit: UnitTerms, keep: UnitTerms) -> Open:
    """The open state after a chain unit (``unit``: its chain terms) that is not the region's last."""
    p, level, t, q, g = state
    fu, fr = unit[0], unit[1]
    fk, fkr, bkd, bkr = keep
    t2 = t + fu + fk
    return max(p, level + fr), level + fu, t2, max(q + fu, t + fu + fkr), max(t2 + bkr, g + fu + fk + bkd)


def close_region(state: Open, unit: UnitTerms) -> Closed:
    """The closed state after a chain unit (``unit``: its chain terms) that ends the region."""
    p, level, t, q, g = state
    fu, fr, bd, br = unit
    return max(p, level + fr), level + fu, max(q + fu, t + fu + br, g + fu + bd)


def unit_terms(cm: CostModel, actions: Sequence[int]) -> list[list[UnitTerms]]:
    """terms[i][k]: unit i under profile action ``actions[k]``, as python ints."""
    fd, fr, bd, br = (x.tolist() for x in (cm.f_delta, cm.f_rise, cm.b_delta, cm.b_rise))
    return [[(fd[i][a], fr[i][a], bd[i][a], br[i][a]) for a in actions] for i in range(cm.n_units)]


def _pareto_2d(points: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Points no other point is <= in both coordinates (duplicates once), sorted by the first."""
    out: list[tuple[int, int]] = []
    for x, y in sorted(points):
        if not out or y < out[-1][1]:
            out.append((x, y))
    return out


def pareto_min(points: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Points no other point is <= in every coordinate (duplicates once)."""
    if not points:
        return []
    if len(next(iter(points))) == 2:
        return _pareto_2d(points)  # type: ignore[arg-type]
    rows = sorted(points, key=lambda c: (sum(c), c))  # a dominating point sorts before what it dominates
    kept = np.empty((len(rows), len(rows[0])), dtype=np.int64)
    k = 0
    for row in rows:
        if k and np.any(np.all(kept[:k] <= row, axis=1)):
            continue
        kept[k] = row
        k += 1
    return [tuple(int(x) for x in r) for r in kept[:k]]


def suffix_functionals(profile: ModelProfile, terms: list[list[UnitTerms]]) -> list[list[tuple[int, int]]]:
    """S[k]: non-dominated (cL, cM) over all action choices for units k..n-1 (no chains); S[n] is post alone.

    From a state (P, L, M) before unit k, the plan's peak is max(P, L + cL, M + cM) for the
    suffix's (cL, cM), so min over S[k] of that is the lowest peak reachable (exact).
    """
    n = len(terms)
    last = [(profile.post.rise_bytes, profile.post.delta_bytes)]
    out: list[list[tuple[int, int]]] = [[] for _ in range(n)] + [last]
    for k in range(n - 1, -1, -1):
        cands = {(max(fr, fd + cl, fd + br + cm), fd + bd + cm)
                 for fd, fr, bd, br in terms[k] for cl, cm in out[k + 1]}
        out[k] = _pareto_2d(cands)
    return out


def lowest_peak(state: tuple[int, ...], functionals: list[tuple[int, ...]]) -> int:
    """Lowest peak any completion reaches from a closed ``state`` (``functionals``: the suffix's S[k])."""
    p, level, m = state
    best = None
    for cl, cm in functionals:  # a plain loop: this runs on every env step
        peak = max(p, level + cl, m + cm)
        if best is None or peak < best:
            best = peak
    assert best is not None, "a suffix always has at least one functional"
    return best


def lowest_open_peak(state: Open, functionals: list[tuple[int, ...]]) -> int | None:
    """Lowest peak any completion reaches from an open ``state``; None if the suffix has no way to close it."""
    p, level, t, q, g = state
    best = None
    for cl, ct, cq, cg in functionals:
        peak = max(p, level + cl, t + ct, q + cq, g + cg)
        if best is None or peak < best:
            best = peak
    return best


class PeakWalk:
    """The walk over the profile's units with the allowed ``actions`` (profile indices), chains and blocks included.

    ``step(i, k, states)`` takes the states before unit i and its action (an index into
    ``actions``) to the states after it (``(None, None, 0)``: the action cannot follow); ``lowest(i,
    states)`` is the lowest peak any completion reaches from the states before unit i (None: no
    completion). ``closed_fs[i]`` / ``open_fs[i]``: the suffix functionals from a closed / open
    state before unit i.
    """

    def __init__(self, cm: CostModel, actions: Sequence[int]) -> None:
        self.profile, self.actions, self.n = cm.profile, list(actions), cm.n_units
        self.terms = unit_terms(cm, self.actions)
        self.keep_terms = [t[0] for t in unit_terms(cm, [cm.keep])] if cm.keep is not None else []
        chains = cm.chain is not None and cm.chain in self.actions
        if chains and cm.rec not in self.actions:
            raise ValueError("actions have 'chain' without 'recompute', which starts every region; allow both")
        self.k_chain = self.actions.index(cm.chain) if chains else None
        self.k_rec = self.actions.index(cm.rec) if cm.rec in self.actions else None
        # may_chain[i]: a chain is possible at unit i (the region of unit i - 1 can continue to it)
        self.may_chain = [chains and cm.links[i] for i in range(self.n)] + [False]
        self.allowed = [[cm.allowed[i][a] for a in self.actions] for i in range(self.n)]  # 'chunked': loss units only
        self.k_block = self.actions.index(cm.block) if cm.block is not None and cm.block in self.actions else None
        # span_end[s]: where the block span starting at unit s ends; span_terms[s]: its coefficients (a, b, c, d)
        self.span_end = {start: stop for start, stop in cm.spans} if self.k_block is not None else {}
        self.span_terms = {start: self._span_coefficients(start, stop) for start, stop in self.span_end.items()}
        self.closed_fs, self.open_fs = self._functionals()

    def initial(self) -> States:
        return initial_state(self.profile), None, 0

    def step(self, i: int, k: int, states: States) -> States:
        """The states after unit ``i`` takes action ``k`` (``(None, None, 0)``: it cannot follow)."""
        closed, opened, until = states
        if until > i:  # inside a block span: only 'block' continues it, and moves nothing
            return (closed, None, until if until > i + 1 else 0) if k == self.k_block else (None, None, 0)
        if not self.allowed[i][k]:
            return None, None, 0
        if k == self.k_block:
            if closed is None or i not in self.span_end:
                return None, None, 0
            return self.macro(i, closed), None, self.span_end[i]
        if k == self.k_chain:
            if opened is None or not self.may_chain[i]:
                return None, None, 0
            unit = self.terms[i][k]
            return close_region(opened, unit), (
                continue_region(opened, unit, self.keep_terms[i]) if self.may_chain[i + 1] else None), 0
        if closed is None:
            return None, None, 0
        after = advance(closed, self.terms[i][k])
        if k == self.k_rec and self.may_chain[i + 1]:
            return after, open_region(closed, self.terms[i][k], self.keep_terms[i]), 0
        return after, None, 0

    def macro(self, start: int, state: Closed) -> Closed:
        """The closed state after the block span starting at unit ``start``, from the closed state before it."""
        a, b, c, d = self.span_terms[start]
        p, level, m = state
        return max(p, level + a), level + b, max(level + c, m + d)

    def _span_coefficients(self, start: int, stop: int) -> tuple[int, int, int, int]:
        """(a, b, c, d) of the span ``start .. stop - 1`` under 'block': its region's walk from two states, one
        whose M and one whose L is far below the rest, read off."""
        k, far = self.k_block, -(1 << 80)

        def walk(state: Closed) -> Closed:
            opened = open_region(state, self.terms[start][k], self.keep_terms[start])  # type: ignore[index]
            for j in range(start + 1, stop - 1):
                opened = continue_region(opened, self.terms[j][k], self.keep_terms[j])  # type: ignore[index]
            return close_region(opened, self.terms[stop - 1][k])  # type: ignore[index]

        a, b, c = walk((far, 0, far))
        d = walk((far, far, 0))[2]
        return a, b, c, d

    def lowest(self, i: int, states: States) -> int | None:
        closed, opened, until = states
        if until > i:
            return lowest_peak(closed, self.closed_fs[until]) if closed is not None else None
        low = lowest_peak(closed, self.closed_fs[i]) if closed is not None else None
        if opened is not None:
            other = lowest_open_peak(opened, self.open_fs[i])
            if other is not None and (low is None or other < low):
                low = other
        return low

    def _functionals(self) -> tuple[list[list[tuple[int, ...]]], list[list[tuple[int, ...]]]]:
        n, post = self.n, self.profile.post
        closed: list[list[tuple[int, ...]]] = [[] for _ in range(n)] + [[(post.rise_bytes, post.delta_bytes)]]
        opened: list[list[tuple[int, ...]]] = [[] for _ in range(n + 1)]
        for i in range(n - 1, -1, -1):
            c_next, o_next = closed[i + 1], opened[i + 1]
            cands: set[tuple[int, ...]] = set()
            if i in self.span_terms:
                a, b, c, d = self.span_terms[i]
                cands.update((max(a, b + cl, c + cm), d + cm) for cl, cm in closed[self.span_end[i]])
            for k, (fd, fr, bd, br) in enumerate(self.terms[i]):
                if k in (self.k_chain, self.k_block) or not self.allowed[i][k]:
                    continue
                cands.update((max(fr, fd + cl, fd + br + cm), fd + bd + cm) for cl, cm in c_next)
                if k == self.k_rec and o_next:
                    fk, fkr, bkd, bkr = self.keep_terms[i]
                    cands.update((max(fr, fd + cl, fd + fk + ct, fd + fkr + cq, fd + fk + bkr + cg), fd + fk + bkd + cg)
                                 for cl, ct, cq, cg in o_next)
            closed[i] = pareto_min(cands)
            if self.may_chain[i]:
                fu, fr, bd, br = self.terms[i][self.k_chain]  # type: ignore[index]
                fk, fkr, bkd, bkr = self.keep_terms[i]
                ocands: set[tuple[int, ...]] = {(max(fr, fu + cl), fu + br + cm, fu + cm, fu + bd + cm)
                                                for cl, cm in c_next}
                ocands.update((max(fr, fu + cl), max(fu + fk + ct, fu + fkr + cq, fu + fk + bkr + cg), fu + cq,
                               fu + fk + bkd + cg) for cl, ct, cq, cg in o_next)
                opened[i] = pareto_min(ocands)
        return closed, opened

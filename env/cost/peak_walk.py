"""The cost model's peak walk carried one unit at a time, for the env's masks and the exact solver.

``CostModel.peak_bytes`` walks a whole plan. Carried unit by unit, the walk needs only three
numbers, the state (P, L, M): the peak so far, the forward level, and the level plus the
backward part still to come; a unit's action moves it with ``advance``. The units still to
come act on the state as one small function, so the lowest peak any completion of a prefix can
reach is exact (``suffix_functionals`` + ``lowest_peak``). Plain ints: this runs on every env step.
"""

from __future__ import annotations

from typing import Sequence

from env.cost.cost_model import CostModel
from env.data.model_profile import ModelProfile

UnitTerms = tuple[int, int, int, int]  # (f_delta, f_rise, b_delta, b_rise) of one unit under one action


def initial_state(profile: ModelProfile) -> tuple[int, int, int]:
    """(P, L, M) before the first unit: peak so far, forward level, level plus backward part."""
    level = profile.base_bytes + profile.pre.delta_bytes
    return profile.base_bytes + profile.pre.rise_bytes, level, level + profile.tail.rise_bytes


def advance(state: tuple[int, int, int], terms: UnitTerms) -> tuple[int, int, int]:
    """The state after one more unit whose action has these (f_delta, f_rise, b_delta, b_rise)."""
    p, level, m = state
    fd, fr, bd, br = terms
    return max(p, level + fr), level + fd, max(m + fd + bd, level + fd + br)


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


def suffix_functionals(profile: ModelProfile, terms: list[list[UnitTerms]]) -> list[list[tuple[int, int]]]:
    """S[k]: non-dominated (cL, cM) over all action choices for units k..n-1; S[n] is post alone.

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


def lowest_peak(state: tuple[int, int, int], functionals: list[tuple[int, int]]) -> int:
    """Lowest peak any completion reaches from ``state`` (``functionals``: the suffix's S[k])."""
    p, level, m = state
    best = None
    for cl, cm in functionals:  # a plain loop: this runs on every env step
        peak = max(p, level + cl, m + cm)
        if best is None or peak < best:
            best = peak
    assert best is not None, "a suffix always has at least one functional"
    return best


# ---------------------------------------------------------------------------------------------

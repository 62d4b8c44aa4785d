"""What a user is shown: the frontier of a run, from the plans its passes confirmed.

Below the phases: the report, the phases that check or extend the frontier shown
(``search.engine.phases.gate``, ``search.engine.phases.whole_model``) and the price page's batch
scaling read it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from env.data.measured import MeasuredPlan
from search.engine.archive import frontier_of
from search.engine.ledger import Ledger
from search.records import meta
from search.records.config import measured_scope
from search.records.pareto import MEMORY_TOLERANCE, nondominated, readable
from search.records.ranking import timing_noise


def confirmable(points: Sequence[MeasuredPlan], confirmed: set[str], noise: float, baseline: str) -> list[MeasuredPlan]:
    """The frontier that the confirming passes confirm and a user is shown, by peak. A plan not in ``confirmed``
    is left out where a confirmed plan at no more memory is at most ``noise`` (a share) slower; then, walking
    the frontier of the rest from the lowest peak up, where the plan kept before it, at less memory, is at most
    ``noise`` slower: a user could not tell the two apart, and the one at less memory serves. Confirmed plans
    and the ``baseline`` (digest; its measurements are the references) are kept."""
    held = confirmed | {baseline}
    sure = [r for r in points if r.digest in held]
    kept: list[MeasuredPlan] = []
    for r in frontier_of([r for r in points if r.digest in held or not any(
            c.peak_bytes <= r.peak_bytes and c.step_seconds <= r.step_seconds * (1 + noise) for c in sure)]):
        if r.digest in held or not kept or r.step_seconds * (1 + noise) < kept[-1].step_seconds:
            kept.append(r)
    return kept


@dataclass(frozen=True)
class Shown:
    """The frontier a user is shown (``front``), from the store's (``strict``): the confirming passes' plans in
    place of the near misses they left unconfirmed (``candidates``; ``confirmable``),
    then without a plan that one beside it, at most ``tolerance`` bytes higher, beats by more than the run's
    timing ``noise`` (``search.records.pareto.readable``). With ``--compile-scope both`` the candidates are
    the plans measured whole-model too (``search.engine.phases.whole_model``), the dominated ones of either
    way left out first; ``scopes[i]`` says how ``front[i]`` was compiled (None: eager steps)."""

    baseline: MeasuredPlan
    strict: list[MeasuredPlan]
    candidates: list[MeasuredPlan]
    front: list[MeasuredPlan]
    tolerance: float
    noise: float
    scopes: list[str | None]

    @classmethod
    def of(cls, ledger: Ledger) -> "Shown":
        base = ledger.baseline()
        if base is None:
            raise ValueError("the baseline (all keep) is not measured yet; the report needs it")
        strict, points = ledger.frontier(), ledger.points()  # the store keeps every measurement
        tolerance = MEMORY_TOLERANCE * base.activation_bytes
        noise = timing_noise(points)
        confirmed, chosen_by = ledger.store.read(meta.CONFIRMED), ledger.store.read(meta.CONFIRMING_NOISE)
        candidates = (confirmable(points, set(confirmed), noise if chosen_by is None else chosen_by, base.digest)
                      if confirmed else strict)
        scopes: list[str | None] = [measured_scope(ledger.store.read(meta.CONFIG))] * len(candidates)
        whole = [r for r in ledger.whole_model() if not r.oom]
        if whole:  # both ways of compiling compete: the dominated points of either go first
            both = candidates + whole
            both_scopes = scopes + ["model"] * len(whole)
            best = nondominated([(r.peak_bytes, r.step_seconds) for r in both])
            candidates = [r for r, b in zip(both, best) if b]
            scopes = [sc for sc, b in zip(both_scopes, best) if b]
        keep = readable([r.peak_bytes for r in candidates], [r.step_seconds for r in candidates], tolerance, noise)
        return cls(base, strict, candidates, [r for r, k in zip(candidates, keep) if k], tolerance, noise,
                   [sc for sc, k in zip(scopes, keep) if k])

"""Each peer against our fastest measured plan at no more memory: the verdict a report and the dashboard show.

A peer is compared with the strict measured frontier (``search.engine.ledger.Ledger.frontier``): a plan left
off the readable frontier as within noise of a neighbour still answers a peer at its own memory. Both are
taken as the search ranks them (``search.records.ranking.Ranking``): measured side by side in the same deciding
and confirming passes and ranked on those measurements. The verdict is ``env.data.measured.compare_times``'s:
"faster" or "slower" only beyond both spreads, else "within noise (±x%)". A peer that is a plan of ours is shown
as that plan (``plan``, its digest); where that plan is on the frontier, it answers itself. Torch-free: written
to ``frontier.json`` and read by the dashboard.
"""

from __future__ import annotations

import json
from typing import Literal, Mapping, Sequence

from pydantic import BaseModel

from env.data.measured import MeasuredPlan, compare_times
from env.data.plan import action_summary
from search.records.pareto import fastest_within

# a peer told apart from its answer is measured beside it this often before the verdict (the rounds of a quote apart;
# ``search.engine.phases.deciding.confirming_passes``)
VERDICT_MEASUREMENTS = 5

Verdict = Literal["faster", "slower", "within noise", "the same plan", "no plan of ours this low", "out of memory"]


class Timed(BaseModel):
    """A peer's or plan's figures as ranked: peak bytes, median seconds a step and the spread of its samples."""

    peak_bytes: int
    step_seconds: float
    spread_seconds: float
    n_measurements: int

    @classmethod
    def of(cls, m: MeasuredPlan) -> "Timed":
        return cls(peak_bytes=m.peak_bytes, step_seconds=m.step_seconds, spread_seconds=m.spread_seconds,
                   n_measurements=m.n_measurements)


class OurPlan(Timed):
    """Our fastest measured plan at no more memory than the peer."""

    digest: str
    actions: list[str]  # per unit, in the frontier file's unit order
    plan: str  # its actions in words (``env.data.plan.action_summary``)


class PeerEstimate(BaseModel):
    """What a peer that plans on estimates (PyTorch's auto-SAC) predicted of itself, kept beside what was measured:
    its peak and the peak it estimates with nothing checkpointed (its memory model leaves out the optimizer's
    state, so a saving is compared, not a peak), and its recompute time."""

    estimated_peak_bytes: int
    estimated_unplanned_peak_bytes: int
    estimated_recompute_seconds: float
    estimated_on: str = ""  # how its op times were found

    @property
    def saving(self) -> float:
        return 1 - self.estimated_peak_bytes / self.estimated_unplanned_peak_bytes

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> "PeerEstimate | None":
        """From a peer's ``params``: auto-SAC's carried decisions (``decided``, ``env.measure.auto_sac.AutoSacPlan``
        as JSON); None for a peer without them."""
        text = params.get("decided")
        if not isinstance(text, str):
            return None
        d = json.loads(text)
        return cls(estimated_peak_bytes=d["estimated_peak_bytes"],
                   estimated_unplanned_peak_bytes=d["unplanned_peak_bytes"],
                   estimated_recompute_seconds=d["estimated_recompute_seconds"], estimated_on=d["estimated_on"])


class PeerVerdict(BaseModel):
    """One peer beside our answer to it. ``verdict`` is the peer's time against ours (``faster``: the peer is
    faster beyond both spreads); ``ratio`` is peer / ours and ``noise`` the larger spread over our time."""

    peer: str
    label: str = ""
    note: str = ""
    plan: str | None = None  # the digest of the plan of ours this peer is; None: measured as itself
    plan_summary: str | None = None  # that plan's actions in words
    measured: Timed | None = None  # None: out of memory
    ours: OurPlan | None = None
    verdict: Verdict
    ratio: float | None = None
    noise: float | None = None
    estimate: PeerEstimate | None = None  # what the peer estimated of itself, where it plans on estimates

    @property
    def text(self) -> str:
        """The verdict in words, as the report and the dashboard print it."""
        if self.verdict in ("faster", "slower"):
            counts = (f" ({self.measured.n_measurements} and {self.ours.n_measurements} measurements side by side)"
                      if self.measured and self.ours else "")
            return f"{self.ratio:.2f}x, peer {self.verdict} beyond both spreads{counts}"
        if self.verdict == "within noise":
            return f"within noise (±{self.noise:.0%})"
        return self.verdict


def answer_to(peer: MeasuredPlan, front: Sequence[MeasuredPlan]) -> MeasuredPlan | None:
    """Our fastest plan of ``front`` at no more memory than ``peer``: the plan a verdict compares it with; None
    where none is that low."""
    k = fastest_within([r.peak_bytes for r in front], [r.step_seconds for r in front], peer.peak_bytes)
    return None if k is None else front[k]


def peer_verdicts(peers: Mapping[str, MeasuredPlan], strict: Sequence[MeasuredPlan],
                  plans: Mapping[str, str | None], notes: Mapping[str, str] = {},
                  labels: Mapping[str, str] = {}, estimates: Mapping[str, PeerEstimate] = {}) -> list[PeerVerdict]:
    """Each of ``peers`` (name -> record as ranked; a peer that is a plan of ours: that plan's record, and
    ``plans[name]`` its digest) against the fastest plan of ``strict`` (the measured frontier as ranked) at no
    more memory, by peak (``answer_to``); ``estimates``: what a peer predicted of itself, shown beside it."""
    out = []
    for name, m in sorted(peers.items(), key=lambda kv: (kv[1].oom, kv[1].peak_bytes)):
        common = {"peer": name, "label": labels.get(name, ""), "note": notes.get(name, ""), "plan": plans.get(name),
                  "plan_summary": action_summary(m.actions) if plans.get(name) else None,
                  "estimate": estimates.get(name)}
        if m.oom:
            out.append(PeerVerdict(**common, verdict="out of memory"))
            continue
        ours = answer_to(m, strict)
        if ours is None:
            out.append(PeerVerdict(**common, measured=Timed.of(m), verdict="no plan of ours this low"))
            continue
        answer = OurPlan(**Timed.of(ours).model_dump(), digest=ours.digest, actions=list(ours.actions),
                         plan=action_summary(ours.actions))
        if ours.digest == m.digest:
            out.append(PeerVerdict(**common, measured=Timed.of(m), ours=answer, verdict="the same plan", ratio=1.0))
            continue
        v = compare_times((m.step_seconds, m.spread_seconds), (ours.step_seconds, ours.spread_seconds))
        out.append(PeerVerdict(**common, measured=Timed.of(m), ours=answer, verdict=v.verdict, ratio=v.ratio,
                               noise=v.noise))
    return out

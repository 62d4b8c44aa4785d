"""The one comparison under the frontier chart: every measured plan, rule and peer, each with its standing.

A row's status says where it stands against the run's one frontier (``RunData.frontier``):

- ``on the frontier``;
- ``dominated by <plan>``: a frontier plan at no more memory is faster beyond both spreads;
- ``within noise of <plan>``: a frontier plan at no more memory is as fast within the spreads;
- ``left out for <plan>``: a frontier plan at most ``memory_tolerance_bytes`` higher is faster by more
  than the run's timing noise (``search.records.pareto.readable``; its lower peak is of no use);
- ``not confirmed (faster than <plan>)``: faster beyond both spreads than every frontier plan at no more
  memory, yet not on the frontier (the confirming passes, or measured after ``frontier.json`` was written);
- a peer's status is the search's verdict from ``frontier.json`` (``search.records.peer_verdicts``: measured
  side by side with our fastest plan at no more memory, as report.md states it); for a run without one, its
  verdict against our fastest frontier plan at no more memory by ``env.data.measured.compare_times``, and ``the same plan as rule X`` where the peer is
  a plan of our space that the run measured as a rule: ``checkpoint-sequential-K`` (``env.measure.peers``) is the
  rule ``segments_K`` (``agents.baselines``), checked by their peaks agreeing to the byte.

Pure functions over ``RunData`` (no Streamlit): tests call them directly.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from dashboard import fmt
from dashboard.data import RunData
from env.data.measured import compare_times
from env.data.types import MIB
from search.records.peer_verdicts import PeerVerdict

ON_FRONTIER = "on the frontier"
COLUMNS = ["kind", "name", "peak (MiB)", "median step (ms)", "spread (IQR, ms)", "samples", "x selected", "status",
           "plan id"]


class Timed(NamedTuple):
    """What a status compares: a peak and a median step with its spread."""

    peak_bytes: float
    step_seconds: float
    spread_seconds: float


def _name(row: pd.Series) -> str:
    return f"{row.summary} ({row.digest})"


def _timed(row: pd.Series) -> Timed:
    return Timed(float(row.peak_bytes), float(row.step_seconds), float(row.spread_seconds))


def fastest_below(frontier: pd.DataFrame, peak_bytes: float) -> pd.Series | None:
    """The fastest frontier plan at no more than ``peak_bytes`` (fewer bytes breaks ties)."""
    lower = frontier.loc[frontier.peak_bytes <= peak_bytes]
    return None if lower.empty else lower.sort_values(["step_seconds", "peak_bytes"]).iloc[0]


def standing(run: RunData, me: Timed) -> str:
    """Where a measured point that is not on the frontier stands against it (module docstring)."""
    best = fastest_below(run.frontier, me.peak_bytes)
    if best is not None:
        v = compare_times((float(best.step_seconds), float(best.spread_seconds)), (me.step_seconds, me.spread_seconds))
        if v.verdict == "faster":
            return f"dominated by {_name(best)}: {1 / v.ratio:.2f}x its step"
        if v.verdict == "within noise":
            return f"within noise of {_name(best)} (±{v.noise:.0%}), at no more memory"
    near = run.frontier.loc[(run.frontier.peak_bytes > me.peak_bytes)
                            & (run.frontier.peak_bytes <= me.peak_bytes + run.memory_tolerance_bytes)
                            & (run.frontier.step_seconds < me.step_seconds * (1 - run.timing_noise))]
    if len(near):
        b = near.sort_values("step_seconds").iloc[0]
        return (f"left out for {_name(b)}: {fmt.size(b.peak_bytes - me.peak_bytes)} more, faster by more than "
                f"the run's noise ({run.timing_noise:.0%})")
    return f"not confirmed (faster than {_name(best)})" if best is not None else "not confirmed"


SEQUENTIAL_PEER, SEGMENTS_RULE = "checkpoint-sequential-", "segments_"  # the peer's and the rule's names for K


def same_rule(run: RunData, peer: pd.Series) -> str | None:
    """The rule that is this peer's computation (module docstring), None where there is none."""
    if not str(peer.peer).startswith(SEQUENTIAL_PEER):
        return None
    rule = SEGMENTS_RULE + str(peer.peer).removeprefix(SEQUENTIAL_PEER)
    row = run.evaluations.loc[run.evaluations.digest == run.rules.get(rule, "")]
    if row.empty or not bool(row.iloc[0].measured) or int(row.iloc[0].peak_bytes) != int(peer.peak_bytes):
        return None
    return str(row.iloc[0].rule)


def peer_verdict(run: RunData, peer: pd.Series) -> str:
    """A peer against our fastest frontier plan at no more memory, as the report says it: the search's own
    verdict where ``frontier.json`` holds one (measured side by side), else by ``compare_times`` here."""
    stored = run.peer_verdicts.get(str(peer.peer))
    if stored is not None:
        return stored_verdict(stored)
    rule = same_rule(run, peer)
    prefix = f"the same plan as rule {rule} (same peak to the byte); " if rule else ""
    ours = fastest_below(run.frontier, float(peer.peak_bytes))
    if ours is None:
        return prefix + "below every frontier plan's peak: nothing of ours to compare at no more memory"
    v = compare_times((float(peer.step_seconds), float(peer.spread_seconds)),
                      (float(ours.step_seconds), float(ours.spread_seconds)))
    return prefix + f"against {_name(ours)}: {v}" + (" (the peer is faster)" if v.verdict == "faster" else "")


def stored_verdict(v: PeerVerdict) -> str:
    """A verdict of ``frontier.json`` in the comparison's words."""
    same = f"the same plan as ours, {v.plan_summary} ({v.plan}); " if v.plan else ""
    if v.ours is None or v.ours.digest == v.plan:
        return same + ("on the frontier" if v.plan else v.text)
    faster = " (the peer is faster)" if v.verdict == "faster" else ""
    return same + f"against {v.ours.plan} ({v.ours.digest}), side by side: {v.text}{faster}"


def _ratio(seconds: float, selected: float | None) -> float:
    return seconds / selected if selected and not math.isnan(selected) else math.nan


def comparison_table(run: RunData, selected: str | None) -> pd.DataFrame:
    """One row per measured plan (rules and the exact solver's plans named) and per peer; frontier first, then
    by peak. ``x selected`` is the median step over the selected plan's."""
    ev = run.evaluations.loc[run.evaluations.measured]
    sel = ev.loc[ev.digest == selected]
    sel_seconds = float(sel.iloc[0].step_seconds) if len(sel) else None
    rows = []
    for _, r in ev.iterrows():
        kind = "rule" if r.rule else ("exact solver" if r.exact else "plan")
        status = ON_FRONTIER if r.on_frontier else standing(run, _timed(r))
        if r.digest == selected:
            status += " · selected"
        rows.append({"kind": kind, "name": f"{r.rule}: {r.summary}" if r.rule else r.summary,
                     "peak (MiB)": r.peak_bytes / MIB, "median step (ms)": r.step_seconds * 1e3,
                     "spread (IQR, ms)": r.spread_seconds * 1e3, "samples": int(r.repeats),
                     "x selected": _ratio(float(r.step_seconds), sel_seconds), "status": status, "plan id": r.digest})
    for _, p in run.peers.iterrows():
        rows.append({"kind": "peer", "name": p.peer, "peak (MiB)": p.peak_bytes / MIB,
                     "median step (ms)": p.step_seconds * 1e3, "spread (IQR, ms)": p.spread_seconds * 1e3,
                     "samples": int(p.repeats), "x selected": _ratio(float(p.step_seconds), sel_seconds),
                     "status": "peer · " + peer_verdict(run, p), "plan id": ""})
    df = pd.DataFrame(rows, columns=COLUMNS)
    order = df.status.str.startswith(ON_FRONTIER).map({True: 0, False: 1})
    return df.assign(_o=order).sort_values(["_o", "peak (MiB)", "median step (ms)"]).drop(columns="_o") \
        .reset_index(drop=True)


def noise_rule(run: RunData) -> str:
    """The rule behind every verdict and the frontier, in one sentence for the page."""
    return (f"Faster or slower only where two median steps differ by more than both spreads (each one's "
            f"interquartile range of its step samples; with fewer than 4 samples, max - min), else within noise. "
            f"The frontier leaves out a plan that one at most {fmt.size(run.memory_tolerance_bytes)} higher beats by "
            f"more than the run's timing noise ({run.timing_noise:.0%} of a step).")

"""The throughput page: samples per second against the memory cap, ours beside the peers; a click picks a cap.

A throughput search (``python -m search.run --memory-cap ...``) writes its curve into ``frontier.json``
(``search.records.throughput.ThroughputCurve``): per cap our answer and each peer at the largest
micro-batch it fits, as quoted. ``load_curve`` reads it, ``curve_frame`` and ``throughput_figure`` are
plain functions tests call without a browser, and ``throughput_page`` lays them out: the chart (a
click on a point selects its cap's answer), the cap's table, and the answer as an exportable plan
with its micro-batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from env.data.errors import CkptSearchError
from env.data.measured import compare_times
from env.data.types import MIB
from search.records.frontier_file import load_frontier
from search.records.throughput import CapRow, ThroughputCurve, ThroughputPoint

CAP = "throughput_cap"  # session state: the selected cap, in bytes
CHART = "throughput_chart"
OURS_TRACE = "ours (searched plan and micro-batch)"


def load_curve(run_dir: str | Path) -> ThroughputCurve | None:
    """The run's throughput curve from ``frontier.json``, None when it has none (or no frontier file yet)."""
    try:
        return load_frontier(run_dir).throughput
    except CkptSearchError:
        return None


def curve_frame(curve: ThroughputCurve) -> pd.DataFrame:
    """One row per cap and configuration as quoted: cap_mib, name, label, micro_batch, accumulation, peak_mib,
    step_ms, spread_ms, n_samples, samples_per_second (and its half-spread), tokens_per_second, ours."""
    rows = [{"cap_bytes": r.cap_bytes, "cap_mib": r.cap_bytes / MIB, "name": p.name, "label": p.label,
             "micro_batch": p.micro_batch, "accumulation": p.accumulation, "peak_mib": p.peak_bytes / MIB,
             "step_ms": p.step_seconds * 1e3, "spread_ms": p.spread_seconds * 1e3, "n_samples": p.n_samples,
             "samples_per_second": p.samples_per_second,
             "spread_samples_per_second": _rate_spread(p.micro_batch, p.step_seconds, p.spread_seconds),
             "tokens_per_second": p.tokens_per_second, "ours": p.name == "ours"}
            for r in sorted(curve.caps, key=lambda r: r.cap_bytes) for p in r.quote]
    return pd.DataFrame(rows, columns=["cap_bytes", "cap_mib", "name", "label", "micro_batch", "accumulation",
                                       "peak_mib", "step_ms", "spread_ms", "n_samples", "samples_per_second",
                                       "spread_samples_per_second", "tokens_per_second", "ours"])


def _rate_spread(micro_batch: int, seconds: float, spread: float) -> float:
    """Samples per second's half-spread: the rate at the median step less the rate at the median plus its spread."""
    return micro_batch / seconds - micro_batch / (seconds + spread) if seconds > 0 else 0.0


def against_ours(point: ThroughputPoint, ours: ThroughputPoint) -> str:
    """A configuration against our answer, per sample (``env.data.measured.compare_times``): the report's verdict."""
    if point.name == "ours":
        return "ours"
    if point.digest == ours.digest and point.micro_batch == ours.micro_batch:
        return "the same plan and micro-batch as ours"
    v = compare_times((point.step_seconds, point.spread_seconds), (ours.step_seconds, ours.spread_seconds),
                      (point.micro_batch, ours.micro_batch))
    return str(v)


def cap_table(row: CapRow) -> pd.DataFrame:
    """One cap's quote as the page shows it: readable headers with units, the spread and the verdict against ours."""
    ours = row.answer
    tokens = any(p.tokens_per_second is not None for p in row.quote)
    rows = [{"configuration": p.label, "micro-batch": p.micro_batch, "accumulation": p.accumulation,
             "peak (MiB)": p.peak_bytes / MIB, "step (ms)": p.step_seconds * 1e3,
             "spread (IQR, ms)": p.spread_seconds * 1e3, "timed steps": p.n_samples,
             "samples/s": p.samples_per_second,
             **({"tokens/s": p.tokens_per_second} if tokens else {}),
             "against ours": against_ours(p, ours) if ours is not None else ""} for p in row.quote]
    return pd.DataFrame(rows)


def relation(row: CapRow) -> str:
    """Our answer's relation to the rules and peers at this cap, in words (empty when it has none)."""
    a = row.answer
    if a is None:
        return ""
    same = [p.label for p in row.peers() if p.digest == a.digest]
    said = [f"ours is {', '.join(same)}"] if same else []
    for p in row.peers():
        if p.digest == a.digest:
            continue
        v = against_ours(p, a)
        if v.startswith("within noise"):
            said.append(f"{p.label} is {v} of ours")
        elif "faster" in v:
            said.append(f"{p.label} is faster than ours ({v})")
    return "; ".join(said)


def throughput_figure(curve: ThroughputCurve, selected_cap: int | None = None) -> go.Figure:
    """Samples per second against the memory cap: ours as a line, each peer as markers; every point carries its
    cap in bytes as ``customdata``."""
    df = curve_frame(curve)
    fig = go.Figure()
    for name, group in df.groupby("name", sort=False):
        ours = name == "ours"
        fig.add_trace(go.Scatter(
            x=group.cap_mib, y=group.samples_per_second, mode="markers",  # caps are points: nothing is known between
            name=OURS_TRACE if ours else str(group.label.iloc[0]), customdata=group.cap_bytes,
            hovertext=[f"<b>{r.label}</b><br>micro-batch {r.micro_batch} x {r.accumulation}<br>peak {r.peak_mib:.1f} "
                       f"MiB under {r.cap_mib:.1f} MiB<br>{r.samples_per_second:.1f} samples/s"
                       for r in group.itertuples()],
            error_y=dict(type="data", array=group.spread_samples_per_second, visible=True, thickness=1, width=0,
                         color="rgba(120,120,120,0.45)"),
            hoverinfo="text", marker=dict(size=13 if ours else 9, symbol="star" if ours else "circle")))
    if selected_cap is not None:
        fig.add_vline(x=selected_cap / MIB, line_dash="dot", line_color="#888")
    fig.update_layout(xaxis_title="memory cap (MiB)", yaxis_title="samples per second (measured)",
                      legend=dict(orientation="h", y=-0.2), margin=dict(t=30))
    return fig


def cap_from_selection(points: Sequence[Mapping[str, Any]]) -> int | None:
    """The cap (bytes) of the first clicked point."""
    for p in points:
        custom = p.get("customdata")
        custom = custom[0] if isinstance(custom, (list, tuple)) and custom else custom
        if isinstance(custom, (int, float)):
            return int(custom)
    return None


def throughput_page(run_dir: Path) -> None:
    from search.export import render_throughput  # its snippet writer imports torch: on this page only

    curve = load_curve(run_dir)
    if curve is None:
        st.info("This run is no throughput search. Search the fastest plan and micro-batch under memory caps with "
                "`python -m search.run --memory-cap MB [MB ...]` (add --global-batch N for accumulation steps).")
        return
    caps = sorted(r.cap_bytes for r in curve.caps)
    event = st.session_state.get(CHART)
    clicked = cap_from_selection(list(event.get("selection", {}).get("points", []))) if event else None
    if clicked in caps:
        st.session_state[CAP] = clicked
    if st.session_state.get(CAP) not in caps:
        st.session_state[CAP] = caps[-1]
    st.plotly_chart(throughput_figure(curve, st.session_state[CAP]), key=CHART, on_select="rerun",
                    selection_mode="points")
    st.selectbox("memory cap", caps, key=CAP, format_func=lambda c: f"{c / MIB:.1f} MiB")
    row = next(r for r in curve.caps if r.cap_bytes == st.session_state[CAP])
    if row.answer is None:
        st.warning(row.why)
        return
    a = row.answer
    st.success(f"Under {row.cap_bytes / MIB:.1f} MiB: **{a.label}** at micro-batch {a.micro_batch} "
               f"({a.accumulation} accumulation steps), {a.samples_per_second:.1f} samples/s, peak "
               f"{a.peak_bytes / MIB:.1f} MiB (measured again after the choice, {curve.quote_rounds} interleaved "
               "rounds)")
    said = relation(row)
    if said:
        st.info(said[0].upper() + said[1:] + ". Faster or slower only beyond both spreads, per sample.")
    st.dataframe(cap_table(row), hide_index=True, width="stretch", column_config={
        c: st.column_config.NumberColumn(format="%.1f") for c in ("peak (MiB)", "step (ms)", "spread (IQR, ms)",
                                                                  "samples/s", "tokens/s")})
    frontier = load_frontier(run_dir)
    text = render_throughput(frontier, a, "json")
    st.download_button("Download plan JSON with its micro-batch", text, file_name="plan.json", mime="application/json")
    st.code(text, language="json")

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
from env.data.types import MIB
from search.export import render_throughput
from search.records.frontier_file import load_frontier
from search.records.throughput import ThroughputCurve

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
    samples_per_second, tokens_per_second, ours."""
    rows = [{"cap_bytes": r.cap_bytes, "cap_mib": r.cap_bytes / MIB, "name": p.name, "label": p.label,
             "micro_batch": p.micro_batch, "accumulation": p.accumulation, "peak_mib": p.peak_bytes / MIB,
             "step_ms": p.step_seconds * 1e3, "samples_per_second": p.samples_per_second,
             "tokens_per_second": p.tokens_per_second, "ours": p.name == "ours"}
            for r in sorted(curve.caps, key=lambda r: r.cap_bytes) for p in r.quote]
    return pd.DataFrame(rows, columns=["cap_bytes", "cap_mib", "name", "label", "micro_batch", "accumulation",
                                       "peak_mib", "step_ms", "samples_per_second", "tokens_per_second", "ours"])


def throughput_figure(curve: ThroughputCurve, selected_cap: int | None = None) -> go.Figure:
    """Samples per second against the memory cap: ours as a line, each peer as markers; every point carries its
    cap in bytes as ``customdata``."""
    df = curve_frame(curve)
    fig = go.Figure()
    for name, group in df.groupby("name", sort=False):
        ours = name == "ours"
        fig.add_trace(go.Scatter(
            x=group.cap_mib, y=group.samples_per_second, mode="lines+markers" if ours else "markers",
            name=OURS_TRACE if ours else str(group.label.iloc[0]), customdata=group.cap_bytes,
            hovertext=[f"<b>{r.label}</b><br>micro-batch {r.micro_batch} x {r.accumulation}<br>peak {r.peak_mib:.1f} "
                       f"MiB under {r.cap_mib:.1f} MiB<br>{r.samples_per_second:.1f} samples/s"
                       for r in group.itertuples()],
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
    df = curve_frame(curve)
    st.dataframe(df.loc[df.cap_bytes == row.cap_bytes].drop(columns=["cap_bytes", "ours"]), hide_index=True,
                 width="stretch")
    frontier = load_frontier(run_dir)
    text = render_throughput(frontier, a, "json")
    st.download_button("Download plan JSON with its micro-batch", text, file_name="plan.json", mime="application/json")
    st.code(text, language="json")

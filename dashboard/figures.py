"""Plotly figures of a run: plain functions of :class:`dashboard.data.RunData`, testable without a browser.

- ``frontier_figure``: every evaluated plan, the measured frontier as a step line, the
  baseline rules as labelled markers, the cost model's exact frontier as a reference line;
  absolute (MiB, ms) or relative to the all-keep baseline.
- ``plan_figure``: one plan unit by unit (action strip, bytes kept, time) from the profile.
- ``live_figure``: evaluations and hypervolume over time (the run's snapshots).
- ``price_figure``: cost and GPUs per frontier plan.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.data import RunData
from env.data.types import MIB

ACTION_COLOURS = {"keep": "#4c78a8", "recompute": "#f58518", "selective": "#54a24b", "offload": "#b279a2",
                  "chain": "#c45a00"}
FRONTIER_TRACE = "measured frontier"
EVALUATED_TRACE = "evaluated plans"
PREDICTED_TRACE = "predicted only"
PEERS_TRACE = "peers (what users pick instead)"


def axes(relative: bool) -> tuple[str, str, str, str]:
    """(x column, y column, x title, y title) for absolute or baseline-relative axes."""
    if relative:
        return "peak_rel", "time_rel", "peak memory (x baseline)", "step time (x baseline)"
    return "peak_mib", "step_ms", "peak memory (MiB)", "step time (ms)"


def _with_units(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["peak_mib"] = df.peak_bytes.astype(float) / MIB
    df["step_ms"] = df.step_seconds.astype(float) * 1e3
    df["spread_ms"] = df.spread_seconds.astype(float) * 1e3
    return df


def _hover(df: pd.DataFrame) -> list[str]:
    return [f"<b>{r.summary}</b><br>{' '.join(a[0].upper() for a in r.actions)}<br>"
            f"peak {r.peak_mib:.3f} MiB ({r.peak_rel:.1%} of baseline)<br>"
            f"step {r.step_ms:.2f} ms ± {r.spread_ms:.2f} ({r.time_rel:.2f}x)<br>"
            f"source {r.source} · plan {r.digest}" for r in df.itertuples()]


def frontier_figure(run: RunData, relative: bool = False, show_dominated: bool = True,
                    selected: str | None = None, budget_bytes: float | None = None) -> go.Figure:
    """The memory/time plane of a run. Points carry their plan digest as ``customdata``."""
    x, y, xt, yt = axes(relative)
    ev = _with_units(run.evaluations.loc[run.evaluations.measured])
    fig = go.Figure()
    shown = ev if show_dominated else ev.loc[~ev.dominated]
    fig.add_trace(go.Scatter(
        x=shown[x], y=shown[y], mode="markers", name=EVALUATED_TRACE, customdata=shown.digest,
        hovertext=_hover(shown), hoverinfo="text",
        marker=dict(size=9, color="#888", opacity=[0.25 if d else 0.9 for d in shown.dominated]),
        error_y=dict(type="data", array=shown.spread_ms if not relative else shown.spread_ms / (run.baseline_seconds * 1e3),
                     visible=True, thickness=1, width=0, color="rgba(120,120,120,0.35)")))
    predicted = run.evaluations.loc[~run.evaluations.measured & run.evaluations.predicted_peak_bytes.notna()]
    if show_dominated and len(predicted):
        px = predicted.predicted_peak_bytes.astype(float) / (run.baseline_peak_bytes if relative else MIB)
        py = predicted.predicted_step_seconds.astype(float) / (run.baseline_seconds if relative else 1e-3)
        fig.add_trace(go.Scatter(x=px, y=py, mode="markers", name=PREDICTED_TRACE, customdata=predicted.digest,
                                 hovertext=[f"{s} (cost model only, not measured)" for s in predicted.summary],
                                 hoverinfo="text", marker=dict(size=7, symbol="circle-open", color="#bbb")))
    exact = ev.loc[ev.exact].sort_values(["peak_bytes", "step_seconds"])
    if len(exact):
        fig.add_trace(go.Scatter(x=exact[x], y=exact[y], mode="lines", name="exact frontier (cost model)",
                                 line=dict(dash="dot", color="#54a24b", shape="hv"), hoverinfo="skip"))
    if len(run.frontier):
        fr = _with_units(run.frontier)
        fig.add_trace(go.Scatter(x=fr[x], y=fr[y], mode="lines+markers", name=FRONTIER_TRACE, customdata=fr.digest,
                                 hovertext=_hover(fr), hoverinfo="text", line=dict(shape="hv", color="#e45756", width=2),
                                 marker=dict(size=11, color="#e45756")))
    rules = ev.loc[ev.rule != ""]
    fig.add_trace(go.Scatter(x=rules[x], y=rules[y], mode="markers+text", name="baseline rules", text=rules.rule,
                             textposition="top center", customdata=rules.digest, hovertext=_hover(rules),
                             hoverinfo="text", marker=dict(symbol="diamond", size=12, color="#4c78a8")))
    if len(run.peers):
        pe = run.peers.assign(peak_mib=run.peers.peak_bytes / MIB, step_ms=run.peers.step_seconds * 1e3)
        fig.add_trace(go.Scatter(x=pe[x], y=pe[y], mode="markers+text", name=PEERS_TRACE, text=pe.peer,
                                 textposition="bottom center", hoverinfo="text",
                                 hovertext=[f"<b>{r.peer}</b> (peer, exports nothing)<br>peak {r.peak_mib:.3f} MiB, "
                                            f"step {r.step_ms:.2f} ms<br>{r.note}" for r in pe.itertuples()],
                                 marker=dict(symbol="x", size=11, color="#b279a2")))
    if selected is not None and (ev.digest == selected).any():
        s = ev.loc[ev.digest == selected]
        fig.add_trace(go.Scatter(x=s[x], y=s[y], mode="markers", name="selected", customdata=s.digest,
                                 hovertext=_hover(s), hoverinfo="text",
                                 marker=dict(symbol="star", size=20, color="#f2cf5b", line=dict(width=1, color="#333"))))
    if budget_bytes is not None:
        bx = budget_bytes / run.baseline_peak_bytes if relative else budget_bytes / MIB
        fig.add_vline(x=bx, line=dict(dash="dash", color="#666"), annotation_text="budget")
    if run.headroom:  # nothing to save: show the memory axis from zero, not zoomed into noise
        fig.update_xaxes(rangemode="tozero")
    fig.update_layout(xaxis_title=xt, yaxis_title=f"{yt}, {run.clock} clock" if run.clock else yt, height=520,
                      margin=dict(l=10, r=10, t=30, b=10),
                      legend=dict(orientation="h", y=1.08), clickmode="event+select", dragmode="select")
    return fig


def plan_figure(units: pd.DataFrame) -> go.Figure:
    """A plan over its units: the action strip, bytes kept for backward and time per unit."""
    rows = 3 if "kept_bytes" in units else 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.2, 0.4, 0.4][:rows] if rows == 3 else [1.0],
                        subplot_titles=["action", "kept for backward (KiB)", "fwd + bwd time (ms)"][:rows])
    codes = {a: i for i, a in enumerate(ACTION_COLOURS)}
    n = len(ACTION_COLOURS)
    scale = [[v, c] for i, c in enumerate(ACTION_COLOURS.values()) for v in (i / n, (i + 1) / n)]
    fig.add_trace(go.Heatmap(x=units.unit, y=["action"], z=[[codes.get(a, 0) for a in units.action]],
                             text=[list(units.action)], texttemplate="%{text}", colorscale=scale, zmin=0, zmax=n,
                             showscale=False, hovertemplate="%{x}: %{text}<extra></extra>"), row=1, col=1)
    if rows == 3:
        colours = [ACTION_COLOURS.get(a, "#999") for a in units.action]
        fig.add_trace(go.Bar(x=units.unit, y=units.kept_bytes / 1024, marker_color=colours, name="kept KiB",
                             hovertemplate="%{x}: %{y:.1f} KiB<extra></extra>"), row=2, col=1)
        fig.add_trace(go.Bar(x=units.unit, y=units.seconds * 1e3, marker_color=colours, name="ms",
                             hovertemplate="%{x}: %{y:.2f} ms<extra></extra>"), row=3, col=1)
    fig.update_layout(height=420 if rows == 3 else 160, showlegend=False, margin=dict(l=10, r=10, t=30, b=10))
    return fig


def live_figure(snapshots: pd.DataFrame, started_at: float | None = None) -> go.Figure:
    """Measured plans, frontier size and frontier hypervolume over the run's time."""
    titles = ["measured plans", "frontier size", "hypervolume (baseline-relative)"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles)
    if len(snapshots):
        t0 = started_at if started_at is not None else float(snapshots["at"].min())
        minutes = (snapshots["at"] - t0) / 60
        for col, (name, values) in enumerate((("measured", snapshots.n_measured),
                                              ("frontier size", snapshots.frontier_size),
                                              ("hypervolume", snapshots.hypervolume)), start=1):
            fig.add_trace(go.Scatter(x=minutes, y=values, mode="lines+markers", name=name, line=dict(shape="hv")),
                          row=1, col=col)
    fig.update_xaxes(title_text="minutes since start")
    fig.update_layout(height=320, showlegend=False, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def price_figure(prices: pd.DataFrame, currency: str = "$") -> go.Figure:
    """Cost of the training run per plan (bars) with the GPUs it needs (labels)."""
    fits = prices.loc[prices.fits]
    labels = [f"{r.summary} ({r.digest[:6]})" for r in fits.itertuples()]
    fig = go.Figure(go.Bar(x=labels, y=fits.cost, text=[f"{g} GPU x{a} acc" for g, a in zip(fits.gpus, fits.accumulation)],
                           textposition="outside", marker_color="#4c78a8",
                           hovertemplate="%{x}<br>cost %{y:,.2f}<br>%{text}<extra></extra>"))
    fig.update_layout(yaxis_title=f"training cost ({currency})", height=380, margin=dict(l=10, r=10, t=30, b=10))
    return fig

"""Plotly figures of a run: plain functions of :class:`dashboard.data.RunData`, testable without a browser.

- ``frontier_figure``: every evaluated plan, the measured frontier as a step line, the
  baseline rules and peers as markers named on hover (labels on the points overlap), the exact
  solver's plans as measured, with the step line of the best of them;
  absolute (MiB, ms) or relative to the all-keep baseline.
- ``plan_figure``: one plan unit by unit (action, bytes kept, time), one row per unit, so
  that 48 or 96 units stay readable.
- ``live_figure``: evaluations and hypervolume over time (the run's snapshots).
- ``price_figure``: cost and GPUs per frontier plan, extrapolated micro-batches hatched.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard import fmt
from dashboard.comparison import peer_verdict
from dashboard.data import RunData
from env.data.types import MIB
from search.records.pareto import nondominated

ACTION_COLOURS = {"keep": "#4c78a8", "recompute": "#f58518", "selective": "#54a24b", "offload": "#b279a2",
                  "chain": "#c45a00", "light": "#9cd08f", "block": "#7f3c8d"}
FRONTIER_TRACE = "measured frontier"
EVALUATED_TRACE = "evaluated plans"
PREDICTED_TRACE = "predicted only"
RULES_TRACE = "baseline rules (name on hover)"
PEERS_TRACE = "peers: what users pick instead (name and verdict on hover)"
EXACT_TRACE = "exact solver's plans (optimal on the cost model), as measured"
SELECTED_TRACE = "selected"


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
    def title(r: object) -> str:
        rule = getattr(r, "rule", "")
        return f"rule <b>{rule}</b>: {r.summary}" if rule else f"<b>{r.summary}</b>"  # type: ignore[attr-defined]

    return [f"{title(r)}<br>{' '.join(a[0].upper() for a in r.actions)}<br>"
            f"peak {fmt.size(r.peak_bytes)} ({fmt.change(r.peak_rel)} vs baseline)<br>"
            f"step {fmt.duration(r.step_seconds)}, spread (IQR) {fmt.duration(r.spread_seconds)}"
            f"{f' of {r.repeats} steps' if hasattr(r, 'repeats') else ''} ({fmt.change(r.time_rel)})<br>"
            f"found by {r.source} · plan {r.digest}" for r in df.itertuples()]


def _spread_bars(df: pd.DataFrame, y: str, relative: bool, baseline_seconds: float) -> dict:
    """Each point's timing spread (IQR) as a bar either side, never below zero seconds."""
    spread = df.spread_ms / (baseline_seconds * 1e3) if relative else df.spread_ms
    return dict(type="data", array=spread, arrayminus=np.minimum(spread, df[y]), visible=True, thickness=1, width=0,
                color="rgba(120,120,120,0.35)")


def _exact_traces(ev: pd.DataFrame, x: str, y: str) -> list[go.Scatter]:
    """The exact solver's plans as measured, and a step line through those no other of them beats.

    The solver's plans are optimal on the cost model; measured, some come out slower than a
    neighbour with less memory (the model's error and timing noise), so a line through all of
    them would zigzag. The line is their measured frontier; the markers show every one.
    """
    exact = ev.loc[ev.exact].sort_values(["peak_bytes", "step_seconds"])
    if exact.empty:
        return []
    best = exact.loc[nondominated(exact[["peak_bytes", "step_seconds"]].to_numpy(dtype=float))]
    return [go.Scatter(x=exact[x], y=exact[y], mode="markers", name=EXACT_TRACE, customdata=exact.digest,
                       hovertext=_hover(exact), hoverinfo="text", legendgroup="exact",
                       marker=dict(symbol="diamond-open", size=10, color="#54a24b", line=dict(width=2))),
            go.Scatter(x=best[x], y=best[y], mode="lines", name="their measured frontier", legendgroup="exact",
                       showlegend=False, hoverinfo="skip", line=dict(dash="dot", color="#54a24b", shape="hv"))]


def _peer_traces(run: RunData, x: str, y: str, relative: bool, show_dominated: bool) -> list[go.Scatter]:
    """The peers with their spreads and their verdicts on hover; hiding dominated points hides dominated peers."""
    if run.peers.empty:
        return []
    pe = _with_units(run.peers)
    pe["verdict"] = [peer_verdict(run, r) for _, r in pe.iterrows()]
    if not show_dominated:
        pe = pe.loc[~pe.verdict.str.contains("slower beyond both spreads")]
    hover = [f"peer <b>{r.peer}</b> (measured beside the plans; exports nothing)<br>"
             f"peak {fmt.size(r.peak_bytes)} ({fmt.change(r.peak_rel)} vs baseline)<br>"
             f"step {fmt.duration(r.step_seconds)}, spread (IQR) {fmt.duration(r.spread_seconds)} of {r.repeats} steps "
             f"({fmt.change(r.time_rel)})<br>{r.verdict}" + (f"<br>{r.note}" if r.note else "") for r in pe.itertuples()]
    return [go.Scatter(x=pe[x], y=pe[y], mode="markers", name=PEERS_TRACE, text=pe.peer, hoverinfo="text",
                       hovertext=hover, marker=dict(symbol="x", size=11, color="#b279a2"),
                       error_y=_spread_bars(pe, y, relative, run.baseline_seconds))]


def frontier_figure(run: RunData, relative: bool = False, show_dominated: bool = True,
                    selected: str | None = None, budget_bytes: float | None = None) -> go.Figure:
    """The memory/time plane of a run. Points carry their plan digest as ``customdata``."""
    x, y, xt, yt = axes(relative)
    ev = _with_units(run.evaluations.loc[run.evaluations.measured])
    fig = go.Figure()
    shown = ev if show_dominated else ev.loc[ev.on_frontier]  # hiding dominated points hides rules and peers too
    fig.add_trace(go.Scatter(
        x=shown[x], y=shown[y], mode="markers", name=EVALUATED_TRACE, customdata=shown.digest,
        hovertext=_hover(shown), hoverinfo="text",
        marker=dict(size=9, color="#888", opacity=[0.25 if d else 0.9 for d in shown.dominated]),
        error_y=_spread_bars(shown, y, relative, run.baseline_seconds)))
    predicted = run.evaluations.loc[~run.evaluations.measured & run.evaluations.predicted_peak_bytes.notna()]
    if show_dominated and len(predicted):
        px = predicted.predicted_peak_bytes.astype(float) / (run.baseline_peak_bytes if relative else MIB)
        py = predicted.predicted_step_seconds.astype(float) / (run.baseline_seconds if relative else 1e-3)
        fig.add_trace(go.Scatter(x=px, y=py, mode="markers", name=PREDICTED_TRACE, customdata=predicted.digest,
                                 hovertext=[f"{s} (cost model only, not measured)" for s in predicted.summary],
                                 hoverinfo="text", marker=dict(size=7, symbol="circle-open", color="#bbb")))
    for trace in _exact_traces(shown, x, y):
        fig.add_trace(trace)
    if len(run.frontier):
        fr = _with_units(run.frontier)
        fig.add_trace(go.Scatter(x=fr[x], y=fr[y], mode="lines+markers", name=FRONTIER_TRACE, customdata=fr.digest,
                                 hovertext=_hover(fr.assign(rule="")), hoverinfo="text",
                                 line=dict(shape="hv", color="#e45756", width=2), marker=dict(size=11, color="#e45756")))
    rules = shown.loc[shown.rule != ""]
    fig.add_trace(go.Scatter(x=rules[x], y=rules[y], mode="markers", name=RULES_TRACE, text=rules.rule,
                             customdata=rules.digest, hovertext=_hover(rules), hoverinfo="text",
                             marker=dict(symbol="diamond", size=12, color="#4c78a8")))
    for trace in _peer_traces(run, x, y, relative, show_dominated):
        fig.add_trace(trace)
    if selected is not None and (ev.digest == selected).any():
        s = ev.loc[ev.digest == selected]
        fig.add_trace(go.Scatter(x=s[x], y=s[y], mode="markers", name=SELECTED_TRACE, customdata=s.digest,
                                 hovertext=_hover(s), hoverinfo="text",
                                 marker=dict(symbol="star", size=20, color="#f2cf5b", line=dict(width=1, color="#333"))))
    if budget_bytes is not None:
        bx = budget_bytes / run.baseline_peak_bytes if relative else budget_bytes / MIB
        fig.add_vline(x=bx, line=dict(dash="dash", color="#666"), annotation_text="budget")
    if run.headroom:  # nothing to save: show the memory axis from zero, not zoomed into noise
        fig.update_xaxes(rangemode="tozero")
    # no clickmode/dragmode here: Streamlit sets them for its selection modes, and ours would disable point clicks
    fig.update_layout(xaxis_title=xt, yaxis_title=f"{yt}, {run.clock} clock" if run.clock else yt, height=580,
                      margin=dict(l=10, r=10, t=30, b=10),  # the legend below the plot, clear of the toolbar
                      legend=dict(orientation="h", yanchor="top", y=-0.16, xanchor="left", x=0))
    return fig


def plan_figure(units: pd.DataFrame) -> go.Figure:
    """A plan over its units, one row per unit in model order: its action, the bytes it keeps for
    backward and its forward + backward time (the profile's). Rows keep their height however many
    units there are, so unit names and actions stay readable at 48 units and more."""
    n = len(units)
    has_costs = "kept_bytes" in units and units.kept_bytes.notna().any()
    cols = 3 if has_costs else 1
    unit_name, per_unit = fmt.size_unit(float(units.kept_bytes.max())) if has_costs else ("MiB", float(MIB))
    titles = ["action", f"kept for backward ({unit_name})", "forward + backward (ms)"][:cols]
    fig = make_subplots(rows=1, cols=cols, shared_yaxes=True, horizontal_spacing=0.03, subplot_titles=titles,
                        column_widths=[0.2, 0.4, 0.4][:cols] if cols == 3 else [1.0])
    codes = {a: i for i, a in enumerate(ACTION_COLOURS)}
    k = len(ACTION_COLOURS)
    scale = [[v, c] for i, c in enumerate(ACTION_COLOURS.values()) for v in (i / k, (i + 1) / k)]
    names = list(units.unit)
    fig.add_trace(go.Heatmap(y=names, x=["action"], z=[[codes.get(a, 0)] for a in units.action],
                             text=[[a] for a in units.action], texttemplate="%{text}", textfont=dict(size=11),
                             colorscale=scale, zmin=0, zmax=k, showscale=False, xgap=0, ygap=1,
                             hovertemplate="%{y}: %{text}<extra></extra>"), row=1, col=1)
    if has_costs:
        colours = [ACTION_COLOURS.get(a, "#999") for a in units.action]
        fig.add_trace(go.Bar(y=names, x=units.kept_bytes / per_unit, orientation="h", marker_color=colours,
                             hovertemplate=f"%{{y}}: %{{x:.3g}} {unit_name}<extra></extra>"), row=1, col=2)
        fig.add_trace(go.Bar(y=names, x=units.seconds * 1e3, orientation="h", marker_color=colours,
                             hovertemplate="%{y}: %{x:.2f} ms<extra></extra>"), row=1, col=3)
    fig.update_yaxes(autorange="reversed", type="category", tickfont=dict(size=11))
    fig.update_xaxes(showticklabels=False, row=1, col=1)
    fig.update_layout(height=max(220, 80 + 20 * n), showlegend=False, bargap=0.15, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def live_figure(snapshots: pd.DataFrame, started_at: float | None = None, frontier_size: int | None = None,
                frontier_at: float | None = None) -> go.Figure:
    """Measured plans, frontier size and frontier hypervolume over the run's time. The snapshots count the
    non-dominated measured plans as they came; ``frontier_size`` (at ``frontier_at``) is the frontier the pages
    show (after the confirming passes and the noise rule), drawn as the size chart's last point."""
    titles = ["measured plans", "frontier size", "hypervolume (baseline-relative)"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles)
    if len(snapshots):
        t0 = started_at if started_at is not None else float(snapshots["at"].min())
        minutes = (snapshots["at"] - t0) / 60
        for col, (name, values, fmt_y) in enumerate((("measured", snapshots.n_measured, "d"),
                                                     ("non-dominated so far", snapshots.frontier_size, "d"),
                                                     ("hypervolume", snapshots.hypervolume, ".3f")), start=1):
            fig.add_trace(go.Scatter(x=minutes, y=values, mode="lines+markers", name=name, line=dict(shape="hv"),
                                     hovertemplate=f"%{{x:.1f}} min: %{{y:{fmt_y}}}<extra>{name}</extra>"),
                          row=1, col=col)
        if frontier_size is not None:
            at = (frontier_at if frontier_at is not None else float(snapshots["at"].max())) - t0
            fig.add_trace(go.Scatter(x=[at / 60], y=[frontier_size], mode="markers+text", name="frontier shown",
                                     text=[f"frontier shown: {frontier_size}"], textposition="top left",
                                     marker=dict(size=11, color="#e45756"),
                                     hovertemplate="the frontier the pages show: %{y}<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title_text="minutes since start", tickformat=".1f")
    fig.update_yaxes(tickformat="d", row=1, col=1)
    fig.update_yaxes(tickformat="d", row=1, col=2)
    fig.update_yaxes(tickformat=".2f", row=1, col=3)
    fig.update_layout(height=320, showlegend=False, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def price_figure(prices: pd.DataFrame, currency: str = "$") -> go.Figure:
    """Cost of the training run per plan (bars), labelled with the GPUs, micro-batch and accumulation it
    needs; a bar whose micro-batch lies outside the measured batch sizes is hatched (extrapolated)."""
    fits = prices.loc[prices.fits]
    labels = [f"{r.summary} ({r.digest[:6]})" for r in fits.itertuples()]
    text = [f"{r.gpus} GPU{'s' if r.gpus > 1 else ''}<br>micro-batch {r.micro_batch}"
            + (f" × {r.accumulation}" if r.accumulation > 1 else "") + ("<br>(extrapolated)" if r.extrapolated else "")
            + (f"<br>(capped: the fit allows {r.fit_largest})" if r.capped else "")
            for r in fits.itertuples()]
    fig = go.Figure(go.Bar(x=labels, y=fits.cost, text=text, textposition="outside", marker_color="#4c78a8",
                           marker_pattern_shape=["/" if e else "" for e in fits.extrapolated],
                           hovertemplate="%{x}<br>cost %{y:,.2f}<br>%{text}<extra></extra>"))
    fig.update_layout(yaxis_title=f"training cost ({currency})", height=420, margin=dict(l=10, r=10, t=60, b=10),
                      uniformtext=dict(minsize=11, mode="show"))  # labels stay readable over narrow bars
    fig.update_traces(cliponaxis=False)
    return fig

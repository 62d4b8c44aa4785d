"""The dashboard's pages: thin Streamlit layout over ``data``, ``figures``, ``pricing`` and ``selection``.

Each ``*_page(run)`` draws one tab. All numbers come from the pure modules; nothing here
computes more than a label.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import pandas as pd
import streamlit as st

from dashboard import figures, pricing, selection
from dashboard.data import RunData, nearest_rule, unit_table
from dashboard.new_search import LaunchPolicy, start_search
from env.data.errors import CkptSearchError
from env.data.types import MIB
from search.training.snippet import plan_snippet

LIVE_EVERY_S = 2.0


def _select_budget() -> None:
    run: RunData = st.session_state["_run"]
    st.session_state[selection.SELECTED] = selection.digest_under_budget(run, st.session_state[selection.BUDGET])


def _select_pick() -> None:
    st.session_state[selection.SELECTED] = st.session_state[selection.PICK]


def _apply_click(run: RunData, fig_for_lookup: Callable[[], object]) -> None:
    event = st.session_state.get(selection.CHART)
    points = list(event.get("selection", {}).get("points", [])) if event else []
    digest = selection.digest_from_selection(points, fig_for_lookup()) if points else None
    if digest and digest != st.session_state.get(selection.CLICK_SEEN) and (run.evaluations.digest == digest).any():
        st.session_state[selection.SELECTED] = digest
    st.session_state[selection.CLICK_SEEN] = digest


def frontier_page(run: RunData) -> None:
    if run.headroom:  # a frontier whose points differ by noise is no result: say so before showing it
        st.warning(run.headroom)
    units_explained(run)
    if run.frontier.empty:
        st.info(f"Run '{run.run_id}' has no measured plans yet; the frontier appears with the first measurement.")
        return
    for note in run.notes:
        st.caption(note)
    if run.fsdp_ranks:
        st.caption(f"Measured under FSDP2 with {run.fsdp_ranks} ranks: every peak is per rank (the largest rank's), "
                   "every step time the slowest rank's.")
    c1, c2, c3 = st.columns([1, 1, 3])
    relative = c1.toggle("relative to baseline", key="relative")
    hide = c2.toggle("hide dominated plans", key="hide_dominated")
    low, high = selection.budget_range(run)
    budget = st.session_state.get(selection.BUDGET, high)
    st.session_state[selection.BUDGET] = min(max(budget, low), high)
    c3.slider("memory budget (MiB): the fastest frontier plan that fits is selected", min_value=low, max_value=high,
              step=selection.budget_step(low, high), format="%.4f", key=selection.BUDGET, on_change=_select_budget)
    _apply_click(run, lambda: figures.frontier_figure(run, relative, not hide))
    selected = st.session_state.get(selection.SELECTED)
    fig = figures.frontier_figure(run, relative, not hide, selected, st.session_state[selection.BUDGET] * MIB)
    st.plotly_chart(fig, key=selection.CHART, on_select="rerun", selection_mode="points")
    _plan_picker(run, selected)
    if selected is None:
        st.warning("No frontier plan fits this budget; raise it to at least "
                   f"{low:.4f} MiB (the smallest measured peak).")
    else:
        _selected_line(run, selected)
    shown = run.frontier.assign(peak_mib=run.frontier.peak_bytes / MIB, step_ms=run.frontier.step_seconds * 1e3,
                                clock=run.clock)
    st.dataframe(shown[["summary", "peak_mib", "peak_rel", "step_ms", "clock", "time_rel", "source", "digest"]],
                 hide_index=True, width="stretch")


def units_explained(run: RunData) -> None:
    """The decision units, each with the bytes it saves for backward and its share, and the coverage."""
    if run.unit_choice is None:
        return
    lines = run.unit_choice.lines()
    with st.expander(f"Decision units: {lines[-1]}"):
        st.code("\n".join(lines[:-1]), language=None)


def _plan_picker(run: RunData, selected: str | None) -> None:
    """Every measured plan, frontier first, as a list: to inspect a rule or a dominated plan too."""
    ev = run.evaluations.loc[run.evaluations.measured].sort_values(["dominated", "peak_bytes", "step_seconds"])
    digests = list(ev.digest)
    labels = {r.digest: f"{'frontier' if not r.dominated else 'dominated'}{f' · rule {r.rule}' if r.rule else ''} · "
                        f"{r.summary}: {r.peak_bytes / MIB:.4f} MiB, {r.step_seconds * 1e3:.2f} ms {r.clock} ({r.digest})"
              for r in ev.itertuples()}
    st.session_state[selection.PICK] = selected if selected in digests else None
    st.selectbox("or pick any measured plan", digests, format_func=labels.get, key=selection.PICK,
                 on_change=_select_pick, placeholder="choose a plan")


def _selected_line(run: RunData, digest: str) -> None:
    row = run.evaluations.loc[run.evaluations.digest == digest].iloc[0]
    st.success(f"Selected: **{row.summary}** ({digest}) - peak {row.peak_bytes / MIB:.4f} MiB "
               f"({1 - row.peak_rel:.1%} less memory than baseline), step {row.step_seconds * 1e3:.2f} ms by the {row.clock} clock ({row.time_rel:.2f}x baseline)")


def plan_page(run: RunData) -> None:
    digest = st.session_state.get(selection.SELECTED)
    if digest is None or run.frontier.empty:
        st.info("Select a plan on the Frontier page (budget slider, click, or list).")
        return
    row = run.evaluations.loc[run.evaluations.digest == digest].iloc[0]
    st.subheader(f"{row.summary} ({digest})")
    m = st.columns(4)
    m[0].metric("peak memory", f"{row.peak_bytes / MIB:.4f} MiB", f"{row.peak_rel - 1:+.1%} vs baseline",
                delta_color="inverse")
    m[1].metric(f"step time ({row.clock} clock)", f"{row.step_seconds * 1e3:.2f} ms", f"{row.time_rel - 1:+.1%} vs baseline",
                delta_color="inverse")
    m[2].metric("spread (IQR)", f"{row.spread_seconds * 1e3:.2f} ms", f"{row.repeats} timed steps", delta_color="off")
    predicted = "n/a" if pd.isna(row.predicted_peak_bytes) else f"{row.predicted_peak_bytes / MIB:.4f} MiB"
    m[3].metric("cost-model peak", predicted, "prediction", delta_color="off")
    units = unit_table(run, list(row.actions))
    st.plotly_chart(figures.plan_figure(units), key="plan_chart")
    clock = CLOCKS.get(str(row.clock), f"the {row.clock}")
    st.caption(f"Measured on **{row.device}**, torch {row.torch_version}, batch {row.batch_shape}, "
               f"median of {row.repeats} steps by {clock} time (spread {row.spread_seconds * 1e3:.2f} ms)"
               + ("; each step taken relative to the all-keep step measured just before it on the same Evaluator, "
                  "in the baseline's median seconds, as the search ranked plans" if row.paired else "") + "; "
               f"proposed by {row.source}. "
               "Per-unit bytes and times are the profile's, measured with every unit under that action.")
    st.dataframe(units, hide_index=True, width="stretch")
    _compare_with_rule(run, digest)
    export_section(run, digest)


CLOCKS = {"wall": "wall-clock", "thread-cpu": "the measuring thread's CPU"}  # env.measure.timeline.step_clock


def _compare_with_rule(run: RunData, digest: str) -> None:
    rule = nearest_rule(run, digest)
    if rule is None:
        return
    me = run.evaluations.loc[run.evaluations.digest == digest].iloc[0]
    st.markdown(f"**Nearest baseline rule: `{rule.rule}`** ({rule.summary})")
    st.table(pd.DataFrame({
        "": ["peak (MiB)", "step (ms)", "x baseline memory", "x baseline time"],
        "this plan": [f"{me.peak_bytes / MIB:.4f}", f"{me.step_seconds * 1e3:.2f}", f"{me.peak_rel:.3f}", f"{me.time_rel:.2f}"],
        f"rule {rule.rule}": [f"{rule.peak_bytes / MIB:.4f}", f"{rule.step_seconds * 1e3:.2f}", f"{rule.peak_rel:.3f}",
                              f"{rule.time_rel:.2f}"],
    }).set_index(""))


def export_section(run: RunData, digest: str) -> None:
    plan = run.plan(digest)
    text = plan.to_json()
    snippet = plan_snippet(plan, title=run.workload)
    st.markdown("**Export**")
    c1, c2 = st.columns(2)
    c1.download_button("Download plan JSON", text, file_name=f"plan-{digest}.json", mime="application/json",
                       key="download_json", on_click="ignore")
    c2.download_button("Download Python snippet (torch only)", snippet, file_name=f"checkpoint_plan_{digest}.py",
                       mime="text/x-python", key="download_snippet", on_click="ignore")
    with st.expander("plan JSON", expanded=True):
        st.code(text, language="json")
    with st.expander("Python snippet"):
        st.code(snippet, language="python")


def pricing_page(run: RunData) -> None:
    st.markdown("For each frontier plan measured at 2+ batch sizes: the largest micro-batch that fits one GPU "
                "(peak = a + b x batch, fitted), the data-parallel GPUs and accumulation steps that reach the global "
                "batch, the wall time and the cost. Communication time is not counted.")
    c = st.columns(5)
    cluster = pricing.Cluster(
        gpu_memory_gb=c[0].number_input("GPU memory (GB)", min_value=0.0001, value=80.0, format="%.4f", key="gpu_gb"),
        price_per_gpu_hour=c[1].number_input("price per GPU-hour", min_value=0.0, value=2.5, key="gpu_price"),
        global_batch=int(c[2].number_input("global batch", min_value=1, value=1024, key="global_batch")),
        steps=int(c[3].number_input("training steps", min_value=1, value=10000, key="train_steps")),
        max_gpus=int(c[4].number_input("GPUs available", min_value=1, value=64, key="max_gpus")))
    if not run.batch_scaling:
        st.info("This run has no batch-scaling measurements (frontier plans at 2+ batch sizes); "
                "run the search with --batch-scaling to price memory.")
        return
    try:
        table = pricing.price_table(run.frontier, run.batch_scaling, cluster)
    except CkptSearchError as e:
        st.error(str(e))
        return
    if table.empty:
        st.info("No frontier plan has measurements at 2+ batch sizes yet.")
        return
    left_out = len(run.frontier) - len(table)
    if left_out:
        st.caption(f"{left_out} frontier plan(s) have no batch-scaling measurements and are not priced.")
    st.plotly_chart(figures.price_figure(table), key="price_chart")
    shown = table.assign(bytes_per_sample_kib=table.bytes_per_sample / 1024, fixed_mib=table.fixed_bytes / MIB)
    st.dataframe(shown[["summary", "fits", "micro_batch", "accumulation", "gpus", "step_seconds", "wall_hours", "cost",
                        "bytes_per_sample_kib", "fixed_mib", "digest"]], hide_index=True, width="stretch")


def live_panel(run: RunData) -> None:
    """Counters, progress and the frontier's growth; the app wraps it in a refreshing fragment."""
    ev = run.evaluations
    last_hv = float(run.snapshots.hypervolume.iloc[-1]) if len(run.snapshots) else math.nan
    m = st.columns(5)
    m[0].metric("status", run.status)
    m[1].metric("plans evaluated", len(ev))
    m[2].metric("measured", int(ev.measured.sum()))
    m[3].metric("frontier size", len(run.frontier))
    m[4].metric("hypervolume", "n/a" if math.isnan(last_hv) else f"{last_hv:.4f}")
    st.plotly_chart(figures.live_figure(run.snapshots, run.started_at), key="live_chart")
    for r in run.progress.itertuples() if len(run.progress) else []:
        total = r.total_timesteps or 0
        frac = min(1.0, r.timesteps / total) if total else 0.0
        budget = f"{r.budget_bytes / MIB:.3f} MiB" if r.budget_bytes else "-"
        st.progress(frac, text=f"{r.agent} (budget {budget}): {r.timesteps}/{total or '?'} steps, "
                                f"{r.episodes} episodes, best reward {r.best_reward}, {r.status}")
    if not len(ev):
        st.info("No plans evaluated yet: the search is profiling the model.")


def new_search_page(runs_root: Path, policy: LaunchPolicy) -> None:
    if not policy.enabled:
        st.info(policy.reason)
        return
    with st.form("new_search"):
        st.markdown(f"Starts `python -m search.run` in the background; its run folder goes under `{runs_root}`.")
        workload = st.text_input("workload", value="gpt/tiny", help="gpt, cnn, lstm, mlp, presets gpt/tiny, ...")
        c = st.columns(2)
        agents = int(c[0].number_input("agents", min_value=1, value=2))
        timesteps = int(c[1].number_input("timesteps per agent", min_value=1, value=512))
        submitted = st.form_submit_button("Start search")
    if submitted:
        try:
            started = start_search(workload, agents, timesteps, runs_root, policy=policy)
        except CkptSearchError as e:
            st.error(str(e))
            return
        st.session_state["run_choice"] = started.run_dir.name
        st.session_state["started"] = f"started pid {started.pid}: {' '.join(started.command)}"
        st.rerun()
    if "started" in st.session_state:
        st.caption(st.session_state["started"])

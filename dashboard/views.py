"""The dashboard's pages: thin Streamlit layout over ``data``, ``figures``, ``pricing`` and ``selection``.

Each ``*_page(run)`` draws one tab. All numbers come from the pure modules and are written by
``dashboard.fmt``; nothing here computes more than a label.
"""

from __future__ import annotations

import functools
import math
import shlex

import pandas as pd
import streamlit as st

from dashboard import comparison, figures, fmt, selection
from dashboard.data import RunData, nearest_rule, unit_table
from env.data.types import MIB
from search.records.frontier_file import COMPILE_HOW

LIVE_EVERY_S = 2.0
CLOCKS = {"wall": "wall-clock", "thread-cpu": "the measuring thread's CPU"}  # env.measure.timeline.step_clock
NumberColumn = st.column_config.NumberColumn


def _delta(ratio: float, what: str) -> dict:
    """A metric's delta against the baseline: green when less (memory and time both), no arrow when equal."""
    text = f"{fmt.change(ratio)} {what}"
    equal = text.startswith("±") or text.startswith("n/a")
    return dict(delta=text, delta_color="off" if equal else "inverse", delta_arrow="off" if equal else "auto")


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
    state = st.session_state
    c1, c2, c3 = st.columns([1, 1, 3])
    relative = c1.toggle("relative to baseline", key="relative")
    hide = c2.toggle("hide dominated plans", key="hide_dominated")
    budget = selection.BudgetSlider.of(run)
    low, decimals = budget.low, budget.decimals
    c3.slider("memory budget (MiB)", min_value=low, max_value=budget.high, key=selection.BUDGET,
              step=budget.step, format=f"%.{decimals}f",
              on_change=selection.on_budget, args=(state, run),
              help="Moving it selects the fastest frontier plan within the budget; a click on the chart or a pick "
                   "from the list selects that plan and moves the budget to its peak.")
    selected = state.get(selection.SELECTED)
    fig = figures.frontier_figure(run, relative, not hide, selected, state[selection.BUDGET] * MIB)
    st.plotly_chart(fig, key=selection.CHART, on_select=functools.partial(selection.on_chart, state, run),
                    selection_mode=("points", "box"))
    st.caption("Click a point, or box-select several (the fastest of them is taken). The red step line is the "
               "measured frontier; the dotted green one the best of the exact solver's plans as measured "
               "(optimal on the cost model, so a gap shows the model's error); rules and peers are named on hover.")
    if state.pop(selection.NO_PLAN, False):
        st.info("That point has no plan of ours (a peer: it exports nothing); its verdict is in the table below. "
                "The selection is unchanged.")
    _plan_picker(run, selected)
    if selected is None:
        st.warning(f"No frontier plan fits this budget; raise it to at least {low:.{decimals}f} MiB "
                   "(the smallest measured peak).")
    else:
        _selected_line(run, selected, str(state.get(selection.HOW, "start")))
    comparison_section(run, selected)


def comparison_section(run: RunData, selected: str | None) -> None:
    """Every measured plan, rule and peer in one sortable table with its status, and the rule behind it."""
    table = comparison.comparison_table(run, selected)
    st.markdown("**Every plan, rule and peer measured**, frontier first (click a header to sort)")
    st.dataframe(table, hide_index=True, width="stretch", key="comparison_table", column_config={
        "peak (MiB)": NumberColumn(format="%.2f"), "median step (ms)": NumberColumn(format="%.2f"),
        "spread (IQR, ms)": NumberColumn(format="%.2f"), "x selected": NumberColumn(format="%.2fx"),
        "status": st.column_config.TextColumn(width="large")})
    st.download_button("Download this table (CSV)", table.to_csv(index=False), file_name=f"{run.run_id}-plans.csv",
                       mime="text/csv", key="download_comparison", on_click="ignore")
    st.caption(comparison.noise_rule(run) + f" Step times by the {run.clock} clock, on {run.device or 'the run device'}.")


def units_explained(run: RunData) -> None:
    """The decision units, each with the bytes it saves for backward and its share, and the coverage."""
    if run.unit_choice is None:
        return
    lines = run.unit_choice.lines()
    with st.expander(f"Decision units: {lines[-1]}"):
        st.code("\n".join(lines[:-1]), language=None)


def _plan_label(r: object) -> str:
    rule = getattr(r, "rule", "")
    where = "frontier" if getattr(r, "on_frontier") else "not on the frontier"
    return (f"{where}{f' · rule {rule}' if rule else ''} · {getattr(r, 'summary')}: {fmt.size(getattr(r, 'peak_bytes'))}, "
            f"{fmt.duration(getattr(r, 'step_seconds'))} ({getattr(r, 'digest')})")


def _plan_picker(run: RunData, selected: str | None) -> None:
    """Every measured plan, frontier first, as a list: to inspect a rule or a dominated plan too."""
    ev = run.evaluations.loc[run.evaluations.measured].sort_values(["dominated", "peak_bytes", "step_seconds"])
    digests = list(ev.digest)
    labels = {r.digest: _plan_label(r) for r in ev.itertuples()}
    st.session_state[selection.PICK] = selected if selected in digests else None
    st.selectbox("or pick any measured plan", digests, format_func=labels.get, key=selection.PICK,
                 on_change=selection.on_pick, args=(st.session_state, run), placeholder="choose a plan")


def _selected_line(run: RunData, digest: str, how: str) -> None:
    row = run.evaluations.loc[run.evaluations.digest == digest].iloc[0]
    most = 1 - run.frontier.peak_bytes.min() / run.baseline_peak_bytes
    start = (f"the fastest plan saving at least {selection.START_SHARE:.0%} of the most any plan saves ({most:.0%})"
             if most > 0 else "the fastest plan (no plan saves memory against a measured baseline yet)")
    why = {"start": start,
           "budget": "the fastest frontier plan within the budget", "chart": "picked on the chart",
           "list": "picked from the list"}.get(how, "")
    st.success(f"Selected: **{row.summary}** ({digest}), {why}: peak {fmt.size(row.peak_bytes)} "
               f"({fmt.change(row.peak_rel)} memory), step {fmt.duration(row.step_seconds)} by the {row.clock} clock "
               f"({fmt.change(row.time_rel)} time), both against the all-keep baseline.")
    if not row.on_frontier:
        st.caption(f"Not on the frontier: {comparison.standing(run, comparison.Timed(row.peak_bytes, row.step_seconds, row.spread_seconds))}.")


def plan_page(run: RunData) -> None:
    digest = st.session_state.get(selection.SELECTED)
    if digest is None or run.frontier.empty:
        st.info("Select a plan on the Frontier page (budget slider, click, or list).")
        return
    row = run.evaluations.loc[run.evaluations.digest == digest].iloc[0]
    st.subheader(f"{row.summary} ({digest})")
    m = st.columns(4)
    m[0].metric("peak memory", fmt.size(row.peak_bytes), **_delta(row.peak_rel, "vs baseline"))
    m[1].metric(f"step time ({row.clock} clock)", fmt.duration(row.step_seconds), **_delta(row.time_rel, "vs baseline"))
    m[2].metric("spread (IQR)", fmt.duration(row.spread_seconds), f"{row.repeats} timed steps", delta_color="off",
                delta_arrow="off")
    m[3].metric("cost-model peak", fmt.size(row.predicted_peak_bytes), "predicted", delta_color="off", delta_arrow="off")
    units = unit_table(run, list(row.actions))
    st.plotly_chart(figures.plan_figure(units), key="plan_chart")
    clock = CLOCKS.get(str(row.clock), f"the {row.clock}")
    st.caption(f"Measured on **{row.device}**, torch {row.torch_version}, batch {row.batch_shape}, "
               f"median of {row.repeats} steps by {clock} time (spread {fmt.duration(row.spread_seconds)})"
               + ("; each step taken relative to the all-keep step measured just before it on the same Evaluator, "
                  "in the baseline's median seconds, as the search ranked plans" if row.paired else "") + "; "
               f"found by {row.source}. Per-unit bytes and times are the profile's, measured with every unit under "
               "that action.")
    _unit_table(units)
    _compare_with_rule(run, digest)
    export_section(run, digest)


def _unit_table(units: pd.DataFrame) -> None:
    if "kept_bytes" not in units:
        st.dataframe(units, hide_index=True, width="stretch")
        return
    name, per = fmt.size_unit(float(units[["kept_bytes", "backward_peak_bytes"]].max().max()))
    shown = pd.DataFrame({
        "unit": units.unit, "action": units.action, f"kept for backward ({name})": units.kept_bytes / per,
        f"saved vs keep ({name})": units.saved_bytes / per, f"peak while recomputed ({name})": units.backward_peak_bytes / per,
        "forward + backward (ms)": units.seconds * 1e3, "extra vs keep (ms)": units.extra_seconds * 1e3})
    missing = units.kept_bytes.isna()
    if missing.any():  # an action the profile has no costs for (a chain region is measured whole, in the step)
        for c in shown.columns[2:]:
            decimals = 2 if "(ms)" in c else 3
            shown[c] = ["not profiled" if m else f"{v:.{decimals}f}" for v, m in zip(shown[c], missing)]
        st.caption(f"Not profiled per unit: {', '.join(sorted(set(units.action[missing])))} (its cost is the plan's "
                   "measured step, not a per-unit figure).")
    largest = float(units[["kept_bytes", "backward_peak_bytes"]].max().max()) / per
    size_format = "%.3f" if largest < 1 else ("%.2f" if largest < 10 else "%.1f")  # about three digits
    st.dataframe(shown, hide_index=True, width="stretch",
                 column_config={c: NumberColumn(format=size_format if "(ms)" not in c else "%.2f")
                                for c in shown.columns[2:]} if not missing.any() else None)


def _compare_with_rule(run: RunData, digest: str) -> None:
    me = run.evaluations.loc[run.evaluations.digest == digest].iloc[0]
    if me.rule:  # the plan is a rule: say so, rather than compare it with another
        st.markdown(f"**This plan is rule `{me.rule}`** (one of the baseline rules measured beside every frontier).")
        return
    rule = nearest_rule(run, digest)
    if rule is None:
        return
    st.markdown(f"**Nearest baseline rule: `{rule.rule}`** ({rule.summary})")
    st.table(pd.DataFrame({
        "": ["peak", "step", "memory vs baseline", "time vs baseline"],
        "this plan": [fmt.size(me.peak_bytes), fmt.duration(me.step_seconds), fmt.change(me.peak_rel), fmt.change(me.time_rel)],
        f"rule {rule.rule}": [fmt.size(rule.peak_bytes), fmt.duration(rule.step_seconds), fmt.change(rule.peak_rel),
                              fmt.change(rule.time_rel)],
    }).set_index(""))


def export_command(run: RunData, digest: str, json_name: str) -> str | None:
    """The ``search.export`` command that writes this plan (a frontier plan: the fastest within its own peak),
    None for a plan off the frontier, which the command never exports."""
    point = run.frontier.loc[run.frontier.digest == digest]
    if point.empty:
        return None
    budget = math.ceil(float(point.iloc[0].peak_bytes) / MIB * 1e4) / 1e4  # its peak, rounded up: it fits
    return f"python -m search.export {shlex.quote(str(run.path))} --budget-mb {budget:.4f} --out {json_name}"


def apply_code(run: RunData, json_name: str) -> str:
    """Python that applies the plan file to the searched model as pasted: the model built as the search built it."""
    return (f"from search import apply_plan\n"
            f"from env.workloads.workload import load_workload\n\n"
            f"model = load_workload({run.workload!r}).model  # or your own model, built as for the search\n"
            f"handle = apply_plan(model, {json_name!r})  # the plan JSON: downloaded above, or by the command\n"
            f"# ... train as usual: the checkpointed units recompute in backward ...\n"
            f"handle.remove()  # the model as it was without the plan\n")


def export_section(run: RunData, digest: str) -> None:
    if digest in run.refused:  # the correctness gate failed it: no download
        st.error(f"Not exportable: this plan was {run.refused[digest]}")
        return
    from search.training.snippet import plan_snippet  # reads env.runtime's source: torch, on this page only

    plan = run.plan(digest)
    text = plan.to_json()
    snippet = plan_snippet(plan, title=run.workload)
    json_name, py_name = f"plan-{digest}.json", f"checkpoint_plan_{digest}.py"
    st.markdown("**Export**")
    c1, c2 = st.columns([1, 2])
    c1.download_button("Download plan JSON", text, file_name=json_name, mime="application/json",
                       key="download_json", on_click="ignore")
    c1.download_button("Download Python snippet (torch only)", snippet, file_name=py_name,
                       mime="text/x-python", key="download_snippet", on_click="ignore")
    command = export_command(run, digest, json_name)
    c2.markdown("**How to apply**, before training (both blocks run as pasted; the icon at a block's corner copies it)")
    if command:
        c2.code(command, language="bash", wrap_lines=True)
    else:
        c2.caption("This plan is not on the frontier, which search.export writes from: download its JSON above.")
    c2.code(apply_code(run, json_name), language="python", wrap_lines=True)
    c2.caption(f"With only torch: `from {py_name[:-3]} import apply_checkpoint_plan; apply_checkpoint_plan(model)` "
               "(the snippet above). With torch.compile: apply the plan first, then compile.")
    scopes = run.frontier.loc[run.frontier.digest == digest, "compile_scope"].dropna().tolist() \
        if "compile_scope" in run.frontier else []
    for scope in dict.fromkeys(scopes):  # a compiled search's point: compile it as it was measured
        c2.markdown(f"Measured compiled ({scope}): `{COMPILE_HOW[scope]}`")
    with st.expander("plan JSON"):
        st.code(text, language="json")
    with st.expander("Python snippet"):
        st.code(snippet, language="python")


def _number(x: object) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)) else "-"


def live_panel(run: RunData) -> None:
    """Counters, progress and the frontier's growth; the app wraps it in a refreshing fragment."""
    ev = run.evaluations
    last_hv = float(run.snapshots.hypervolume.iloc[-1]) if len(run.snapshots) else math.nan
    m = st.columns(5)
    m[0].metric("status", run.status.partition(":")[0])
    m[1].metric("plans evaluated", len(ev))
    m[2].metric("measured", int(ev.measured.sum()))
    m[3].metric("frontier size", len(run.frontier))
    m[4].metric("hypervolume", "n/a" if math.isnan(last_hv) else f"{last_hv:.3f}")
    st.plotly_chart(figures.live_figure(run.snapshots, run.started_at, len(run.frontier), run.finished_at),
                    key="live_chart")
    st.caption("The size chart counts the non-dominated measured plans as they came; its red point is the frontier "
               "every page shows, after the confirming passes and the noise rule (see the Frontier page).")
    for r in run.progress.itertuples() if len(run.progress) else []:
        total = r.total_timesteps or 0
        frac = min(1.0, r.timesteps / total) if total else 0.0
        budget = fmt.size(r.budget_bytes) if r.budget_bytes else "-"
        st.progress(frac, text=f"{r.agent} (budget {budget}): {r.timesteps}/{total or '?'} steps, "
                                f"{r.episodes} episodes, best reward {_number(r.best_reward)}, {r.status}")
    if not len(ev) and run.status == "running":
        st.info("No plans evaluated yet: the search is profiling the model.")

"""Dashboard figures and selection helpers: built from a real run folder, checked without a browser."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from dashboard import comparison, figures, selection
from dashboard.data import RunData, load_run, unit_table
from dashboard.pricing import Cluster, price_table
from env.data.types import MIB
from tests.fixtures_runs import cached_run

pytestmark = pytest.mark.slow  # the run folder is measured once per process (about 5 s)


@pytest.fixture(scope="module")
def run() -> RunData:
    return load_run(cached_run("gpt/tiny"))


def _trace(fig, name: str):
    found = [t for t in fig.data if t.name == name]
    assert found, f"no trace '{name}' in {[t.name for t in fig.data]}"
    return found[0]


def test_frontier_figure_traces(run: RunData) -> None:
    fig = figures.frontier_figure(run)
    ev = run.evaluations.loc[run.evaluations.measured]
    evaluated = _trace(fig, figures.EVALUATED_TRACE)
    assert list(evaluated.customdata) == list(ev.digest)
    faded = np.array(evaluated.marker.opacity) < 0.5
    assert list(faded) == list(ev.dominated)
    assert np.all(np.array(evaluated.y) - np.array(evaluated.error_y.arrayminus) >= 0), "no spread below 0 ms"
    front = _trace(fig, figures.FRONTIER_TRACE)
    assert front.line.shape == "hv" and list(front.customdata) == list(run.frontier.digest)
    assert np.allclose(front.x, run.frontier.peak_bytes / MIB) and np.all(np.diff(front.y) < 0)
    rules = _trace(fig, figures.RULES_TRACE)
    assert {n for t in rules.text for n in t.split(" / ")} == set(run.rules)
    assert rules.mode == "markers", "rule names on hover only: labels on the points overlap"
    assert all(f"rule <b>{name}</b>" in h for name, h in zip(rules.text, rules.hovertext))
    exact = _trace(fig, figures.EXACT_TRACE)
    assert exact.mode == "markers" and len(exact.x) == len(set(run.exact) & set(ev.digest))
    line = [t for t in fig.data if t.legendgroup == "exact" and t.mode == "lines"][0]
    assert line.line.shape == "hv" and set(line.x) <= set(exact.x)
    assert np.all(np.diff(line.x) > 0) and np.all(np.diff(line.y) < 0), "a step line, no zigzag"
    assert "keep" in evaluated.hovertext[0] or "recompute" in evaluated.hovertext[0]
    assert fig.layout.clickmode is None and fig.layout.dragmode is None, "Streamlit's selection modes set these"


def test_frontier_figure_relative_hidden_selected_budget(run: RunData) -> None:
    digest = run.frontier.digest.iloc[0]
    budget = float(run.frontier.peak_bytes.iloc[-1])
    fig = figures.frontier_figure(run, relative=True, show_dominated=False, selected=digest, budget_bytes=budget)
    rules = _trace(fig, figures.RULES_TRACE)
    i = list(rules.text).index("none")
    assert (rules.x[i], rules.y[i]) == (1.0, 1.0)  # the all-keep baseline sits at (1, 1)
    assert len(_trace(fig, figures.EVALUATED_TRACE).x) == int((~run.evaluations.dominated).sum())
    assert set(rules.customdata) <= set(run.frontier.digest), "hiding dominated plans hides dominated rules too"
    peers = [t for t in fig.data if t.name == figures.PEERS_TRACE]
    assert all("slower beyond both spreads" not in h for t in peers for h in t.hovertext)
    assert list(_trace(fig, figures.SELECTED_TRACE).customdata) == [digest]
    assert fig.layout.shapes[0].x0 == pytest.approx(budget / run.baseline_peak_bytes)
    assert fig.layout.xaxis.title.text == "peak memory (x baseline)"


def test_one_comparison_of_every_plan_rule_and_peer(run: RunData) -> None:
    selected = selection.start_plan(run)
    table = comparison.comparison_table(run, selected)
    ev = run.evaluations.loc[run.evaluations.measured]
    assert set(table["plan id"]) - {""} == set(ev.digest) and (table.kind == "peer").sum() == len(run.peers) >= 1
    on = table.status.str.startswith(comparison.ON_FRONTIER)
    assert set(table.loc[on, "plan id"]) == set(run.frontier.digest) and on.iloc[: on.sum()].all()  # frontier first
    others = table.loc[~on & (table.kind != "peer"), "status"]
    assert others.str.match(r"(dominated by|within noise of|left out for|not confirmed)").all()
    for status in table.loc[table.kind == "peer", "status"]:  # the report's verdict: beyond both spreads, or noise
        assert status.startswith("peer · ") and ("within noise (±" in status or "beyond both spreads" in status
                                                 or "nothing of ours" in status)
    assert table.loc[table["plan id"] == selected, "x selected"].iloc[0] == pytest.approx(1.0)
    assert table.samples.min() >= 1 and (table["spread (IQR, ms)"] >= 0).all()
    assert "both spreads" in comparison.noise_rule(run) and f"{run.timing_noise:.0%}" in comparison.noise_rule(run)


def test_unmeasured_plans_are_shown_at_their_prediction(run: RunData) -> None:
    ev = run.evaluations.copy()
    ev.loc[ev.index[-2:], "measured"] = False  # as a hybrid-mode run leaves plans the cost model rejected
    fig = figures.frontier_figure(dataclasses.replace(run, evaluations=ev))
    pred = _trace(fig, figures.PREDICTED_TRACE)
    assert list(pred.customdata) == list(ev.digest[-2:])
    assert np.allclose(pred.x, ev.predicted_peak_bytes[-2:] / MIB) and np.allclose(pred.y, ev.predicted_step_seconds[-2:] * 1e3)
    assert len(_trace(fig, figures.EVALUATED_TRACE).x) == len(ev) - 2
    assert figures.PREDICTED_TRACE not in [t.name for t in figures.frontier_figure(run).data]


def test_plan_figure_rows_and_bars(run: RunData) -> None:
    acts = ["recompute", "keep", "selective", "keep"]
    units = unit_table(run, acts)
    fig = figures.plan_figure(units)
    heat, kept, secs = fig.data
    codes = list(figures.ACTION_COLOURS)
    assert [codes[int(z[0])] for z in heat.z] == acts and list(heat.y) == list(units.unit)
    assert kept.orientation == "h" and list(kept.y) == list(units.unit)
    assert np.allclose(kept.x, units.kept_bytes / MIB) and np.allclose(secs.x, units.seconds * 1e3)
    assert fig.layout.annotations[1].text == "kept for backward (MiB)"  # one unit family: no KiB


def test_plan_figure_stays_readable_at_48_and_96_units() -> None:
    for n in (48, 96):
        names = [f"blocks.{i // 4}.{part}" for i, part in zip(range(n), ["ln_1", "attn", "ln_2", "mlp"] * n)]
        actions = ["keep", "recompute", "selective"] * (n // 3)
        units = pd.DataFrame({"unit": names, "action": actions, "kept_bytes": np.linspace(1e5, 3e6, n),
                              "seconds": np.full(n, 1e-3)})
        fig = figures.plan_figure(units)
        heat = fig.data[0]
        assert list(heat.y) == names and [t[0] for t in heat.text] == actions and heat.texttemplate == "%{text}"
        rows_px = (fig.layout.height - fig.layout.margin.t - fig.layout.margin.b) / n
        assert rows_px >= 18, f"{rows_px:.1f} px a row at {n} units: names and actions would overlap"
        assert fig.layout.yaxis.type == "category" and fig.layout.yaxis.autorange == "reversed"  # model order, top down
        assert fig.layout.annotations[1].text == "kept for backward (MiB)"


def test_live_and_price_figures(run: RunData) -> None:
    fig = figures.live_figure(run.snapshots, run.started_at)
    measured, size, hv = fig.data
    assert list(measured.y) == list(run.snapshots.n_measured) and hv.y[-1] == run.snapshots.hypervolume.iloc[-1]
    assert list(size.y) == list(run.snapshots.frontier_size) and min(measured.x) >= 0
    table = price_table(run.frontier, run.batch_scaling, Cluster(4e-3, 2.0, 256, 100))
    bars = figures.price_figure(table).data[0]
    fits = table.loc[table.fits]
    assert np.allclose(bars.y, fits.cost)
    assert [p == "/" for p in bars.marker.pattern.shape] == list(fits.extrapolated)  # extrapolated bars hatched
    assert all(("(extrapolated)" in t) == e for t, e in zip(bars.text, fits.extrapolated))


def test_click_and_budget_select_plans(run: RunData) -> None:
    fig = figures.frontier_figure(run)
    curve = [t.name for t in fig.data].index(figures.FRONTIER_TRACE)
    first = run.frontier.digest.iloc[0]
    assert selection.digest_from_selection([{"curve_number": curve, "point_index": 0}], fig) == first
    assert selection.digest_from_selection([{"customdata": [first], "curve_number": 0}], fig) == first
    assert selection.digest_from_selection([], fig) is None
    low, high = selection.budget_range(run)
    assert low == pytest.approx(run.frontier.peak_bytes.min() / MIB) and high >= low
    assert selection.digest_under_budget(run, low) == first
    assert selection.digest_under_budget(run, low * 0.99) is None
    assert 0 < selection.budget_step(low, high) <= max((high - low) / 100, 1e-4)
    assert selection.budget_step(low, high, decimals=1) >= 0.1


def test_one_selection_shared_by_slider_chart_and_list(run: RunData) -> None:
    state: dict = {}
    selection.reset_for(state, run)
    start = selection.start_plan(run)
    assert state[selection.SELECTED] == start and state[selection.HOW] == "start"
    base, fr = run.baseline_peak_bytes, run.frontier
    most = 1 - fr.peak_bytes.min() / base
    chosen = fr.loc[fr.digest == start].iloc[0]
    assert 1 - chosen.peak_bytes / base >= 0.5 * most - 1e-9  # saves at least half the reachable saving
    assert not ((1 - fr.peak_bytes / base >= 0.5 * most - 1e-9) & (fr.step_seconds < chosen.step_seconds)).any()
    assert start != run.rules["none"] or most == 0, "never opens on the no-checkpointing plan"
    assert state[selection.BUDGET] == pytest.approx(chosen.peak_bytes / MIB)

    smallest = fr.iloc[0]
    state[selection.BUDGET] = smallest.peak_bytes / MIB  # the slider moved
    selection.on_budget(state, run)
    assert (state[selection.SELECTED], state[selection.HOW]) == (smallest.digest, "budget")

    dominated = run.evaluations.loc[run.evaluations.dominated & run.evaluations.measured].iloc[0]
    state[selection.CHART] = {"selection": {"points": [{"customdata": dominated.digest}, {"x": 1.0, "y": 2.0}]}}
    selection.on_chart(state, run)  # a click (a peer's point carries no plan)
    assert (state[selection.SELECTED], state[selection.HOW]) == (dominated.digest, "chart")
    assert not state[selection.NO_PLAN]
    state[selection.CHART] = {"selection": {"points": [{"x": 1.0, "y": 2.0}]}}  # a peer alone: no plan to select
    selection.on_chart(state, run)
    assert state[selection.NO_PLAN] and state[selection.SELECTED] == dominated.digest  # said, and nothing changes
    low, high = selection.budget_range(run)
    assert state[selection.BUDGET] == pytest.approx(min(max(dominated.peak_bytes / MIB, low), high))  # the slider follows
    boxed = list(fr.digest)  # a box around the whole frontier: its fastest plan
    state[selection.CHART] = {"selection": {"points": [{"customdata": d} for d in boxed]}}
    selection.on_chart(state, run)
    assert state[selection.SELECTED] == fr.sort_values("step_seconds").digest.iloc[0]

    state[selection.PICK] = run.rules["all"]
    selection.on_pick(state, run)
    all_peak = run.evaluations.loc[run.evaluations.digest == run.rules["all"]].peak_bytes.iloc[0] / MIB
    assert state[selection.SELECTED] == run.rules["all"] and state[selection.BUDGET] == pytest.approx(max(all_peak, low))
    selection.reset_for(state, run)  # a rerun keeps what the user chose
    assert state[selection.SELECTED] == run.rules["all"] and state[selection.HOW] == "list"


def test_a_peer_reads_the_verdict_the_search_wrote(run: RunData, tmp_path) -> None:
    """Where frontier.json holds the search's side-by-side verdict, the comparison states it, not one of its own;
    a peer that is a plan of ours is named as that plan."""
    from dashboard.data import _peer_verdicts
    from search.records.frontier_file import write_frontier, load_frontier
    from search.records.peer_verdicts import OurPlan, PeerVerdict, Timed

    name = str(run.peers.iloc[0].peer)
    ours = run.frontier.iloc[0]
    timed = {"peak_bytes": int(ours.peak_bytes), "step_seconds": float(ours.step_seconds), "spread_seconds": 0.001,
             "n_measurements": 3}
    v = PeerVerdict(peer=name, measured=Timed(**timed), verdict="within noise", ratio=1.01, noise=0.04,
                    ours=OurPlan(**timed, digest=str(ours.digest), actions=list(ours.actions), plan="recompute 2"))
    write_frontier(tmp_path, load_frontier(run.path).model_copy(update={"peers": [v]}))
    assert _peer_verdicts(load_frontier(tmp_path)) == {name: v}
    table = comparison.comparison_table(dataclasses.replace(run, peer_verdicts={name: v}), None)
    status = table.loc[(table.kind == "peer") & (table.name == name), "status"].iloc[0]
    assert status == f"peer · against recompute 2 ({ours.digest}), side by side: within noise (±4%)"
    same = v.model_copy(update={"plan": str(ours.digest), "plan_summary": "recompute 2"})
    assert comparison.stored_verdict(same) == f"the same plan as ours, recompute 2 ({ours.digest}); on the frontier"

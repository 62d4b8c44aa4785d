"""Dashboard figures and selection helpers: built from a real run folder, checked without a browser."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dashboard import figures, selection
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
    front = _trace(fig, figures.FRONTIER_TRACE)
    assert front.line.shape == "hv" and list(front.customdata) == list(run.frontier.digest)
    assert np.allclose(front.x, run.frontier.peak_bytes / MIB) and np.all(np.diff(front.y) < 0)
    rules = _trace(fig, "baseline rules")
    assert {n for t in rules.text for n in t.split(" / ")} == set(run.rules)
    exact = _trace(fig, "exact frontier (cost model)")
    assert len(exact.x) == len(set(run.exact) & set(ev.digest))
    assert "keep" in evaluated.hovertext[0] or "recompute" in evaluated.hovertext[0]


def test_frontier_figure_relative_hidden_selected_budget(run: RunData) -> None:
    digest = run.frontier.digest.iloc[0]
    budget = float(run.frontier.peak_bytes.iloc[-1])
    fig = figures.frontier_figure(run, relative=True, show_dominated=False, selected=digest, budget_bytes=budget)
    rules = _trace(fig, "baseline rules")
    i = list(rules.text).index("none")
    assert (rules.x[i], rules.y[i]) == (1.0, 1.0)  # the all-keep baseline sits at (1, 1)
    assert len(_trace(fig, figures.EVALUATED_TRACE).x) == int((~run.evaluations.dominated).sum())
    assert list(_trace(fig, "selected").customdata) == [digest]
    assert fig.layout.shapes[0].x0 == pytest.approx(budget / run.baseline_peak_bytes)
    assert fig.layout.xaxis.title.text == "peak memory (x baseline)"


def test_unmeasured_plans_are_shown_at_their_prediction(run: RunData) -> None:
    ev = run.evaluations.copy()
    ev.loc[ev.index[-2:], "measured"] = False  # as a hybrid-mode run leaves plans the cost model rejected
    fig = figures.frontier_figure(dataclasses.replace(run, evaluations=ev))
    pred = _trace(fig, figures.PREDICTED_TRACE)
    assert list(pred.customdata) == list(ev.digest[-2:])
    assert np.allclose(pred.x, ev.predicted_peak_bytes[-2:] / MIB) and np.allclose(pred.y, ev.predicted_step_seconds[-2:] * 1e3)
    assert len(_trace(fig, figures.EVALUATED_TRACE).x) == len(ev) - 2
    assert figures.PREDICTED_TRACE not in [t.name for t in figures.frontier_figure(run).data]


def test_plan_figure_strip_and_bars(run: RunData) -> None:
    acts = ["recompute", "keep", "selective", "keep"]
    units = unit_table(run, acts)
    fig = figures.plan_figure(units)
    heat, kept, secs = fig.data
    codes = list(figures.ACTION_COLOURS)
    assert [codes[int(z)] for z in heat.z[0]] == acts
    assert np.allclose(kept.y, units.kept_bytes / 1024) and np.allclose(secs.y, units.seconds * 1e3)


def test_live_and_price_figures(run: RunData) -> None:
    fig = figures.live_figure(run.snapshots, run.started_at)
    measured, size, hv = fig.data
    assert list(measured.y) == list(run.snapshots.n_measured) and hv.y[-1] == run.snapshots.hypervolume.iloc[-1]
    assert list(size.y) == list(run.snapshots.frontier_size) and min(measured.x) >= 0
    table = price_table(run.frontier, run.batch_scaling, Cluster(4e-3, 2.0, 256, 100))
    bars = figures.price_figure(table).data[0]
    assert np.allclose(bars.y, table.loc[table.fits].cost)


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

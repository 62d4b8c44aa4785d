"""Dashboard data loading and the price of memory: plain functions, no browser.

The run folders are real: gpt/tiny profiled and measured on this machine (tests/fixtures_runs.py),
built once per test process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dashboard.data import RunDataError, RunNotReady, list_runs, load_run, nearest_rule, select_plan, unit_table
from dashboard.pricing import (
    GB,
    Cluster,
    LinearFit,
    PricingError,
    fit_line,
    fit_scaling,
    max_micro_batch,
    price_plan,
    price_table,
    priced_and_left_out,
)
from env.cost.cost_model import CostModel
from search.records import meta
from search.records.store import STORE_NAME, RunStore
from tests.fixtures_runs import cached_run


@pytest.fixture(scope="module")
def run_dir() -> Path:
    return cached_run("gpt/tiny")


@pytest.fixture()
def run_copy(run_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "runs" / run_dir.name
    shutil.copytree(run_dir, dst)
    return dst


# -- loading -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_one_frontier_the_file_s_and_every_other_plan_has_a_frontier_plan_beside_it(run_dir: Path) -> None:
    run = load_run(run_dir)
    ev = run.evaluations
    assert run.frontier_source == "frontier.json"
    assert set(run.frontier.digest) == set(ev.loc[ev.on_frontier].digest) == set(ev.loc[~ev.dominated].digest)
    assert list(run.frontier.peak_bytes) == sorted(run.frontier.peak_bytes)
    assert np.all(np.diff(run.frontier.step_seconds.to_numpy()) < 0)  # more memory only if faster
    for r in ev.loc[ev.dominated & ev.measured].itertuples():  # each other plan: a frontier plan as good, or near
        near = run.frontier.peak_bytes <= r.peak_bytes + run.memory_tolerance_bytes
        assert (near & (run.frontier.step_seconds <= r.step_seconds * (1 + run.timing_noise))).any()


@pytest.mark.slow
def test_without_frontier_file_the_frontier_is_computed_the_same(run_dir: Path, run_copy: Path) -> None:
    (run_copy / "frontier.json").unlink()
    with_file, without = load_run(run_dir), load_run(run_copy)
    assert without.frontier_source == "evaluations" and "no frontier.json" in without.notes[0]
    assert list(without.frontier.digest) == list(with_file.frontier.digest)


@pytest.mark.slow
def test_a_damaged_frontier_file_shows_the_intact_store(run_dir: Path, run_copy: Path) -> None:
    text = (run_copy / "frontier.json").read_text()
    (run_copy / "frontier.json").write_text(text[: len(text) // 2])  # truncated mid-write
    run = load_run(run_copy)
    assert run.frontier_source == "evaluations" and len(run.frontier) >= 2
    assert "frontier.json cannot be read" in run.notes[0] and "store, which is intact" in run.notes[0]
    assert set(run.frontier.digest) <= set(run.evaluations.loc[run.evaluations.measured].digest)


@pytest.mark.slow
def test_baseline_rules_exact_and_predictions(run_dir: Path) -> None:
    run = load_run(run_dir)
    ev = run.evaluations.set_index("digest")
    none = ev.loc[run.rules["none"]]
    assert none.rule == "none" and set(none.actions) == {"keep"}
    assert (none.peak_bytes, none.step_seconds) == (run.baseline_peak_bytes, run.baseline_seconds)
    assert none.peak_rel == 1.0 and none.time_rel == 1.0
    assert ev.loc[run.exact].exact.all() and not ev.drop(run.exact).exact.any()
    cm = CostModel(run.profile)
    for digest in ev.index[:4]:
        assert cm.predict(run.plan(digest)).peak_bytes == ev.loc[digest].predicted_peak_bytes


@pytest.mark.slow
def test_select_plan_is_the_fastest_under_the_budget(run_dir: Path) -> None:
    f = load_run(run_dir).frontier
    assert select_plan(f, f.peak_bytes.min() - 1) is None
    assert select_plan(f, f.peak_bytes.max()).digest == f.loc[f.step_seconds.idxmin()].digest
    for r in f.itertuples():  # on a frontier, the budget at a point's peak selects that point
        assert select_plan(f, r.peak_bytes).digest == r.digest


@pytest.mark.slow
def test_nearest_rule_is_closest_on_relative_axes(run_dir: Path) -> None:
    run = load_run(run_dir)
    ev = run.evaluations
    digest = run.frontier.digest.iloc[0]
    got = nearest_rule(run, digest)
    me = ev.loc[ev.digest == digest].iloc[0]
    rules = ev.loc[(ev.rule != "") & (ev.digest != digest)]
    dists = np.hypot(rules.peak_rel - me.peak_rel, rules.time_rel - me.time_rel)
    assert got is not None and got.digest == rules.loc[dists.idxmin()].digest


@pytest.mark.slow
def test_unit_table_reads_the_profile(run_dir: Path) -> None:
    run = load_run(run_dir)
    acts = ["recompute", "keep", "selective", "keep"]
    t = unit_table(run, acts)
    assert list(t.unit) == run.units and list(t.action) == acts
    assert t.saved_bytes[0] > 0 and t.saved_bytes[1] == 0 and t.saved_bytes[3] == 0
    assert t.kept_bytes[0] == run.profile.costs["recompute"][0].kept_bytes
    assert t.extra_seconds[1] == 0.0


@pytest.mark.slow
def test_list_runs_newest_first_and_broken_runs(run_copy: Path) -> None:
    root = run_copy.parent
    older = root / "older"
    shutil.copytree(run_copy, older)
    with RunStore(older / STORE_NAME) as s:
        s.write(meta.STARTED_AT, 1.0)
    (root / "broken").mkdir()
    (root / "broken" / STORE_NAME).write_bytes(b"this is not sqlite" * 100)
    (root / "starting").mkdir()
    (root / "starting" / "search.log").write_text("profiling gpt/tiny\n")
    (root / "unrelated").mkdir()
    runs = {r.run_id: r for r in list_runs(root)}
    assert set(runs) == {run_copy.name, "older", "broken", "starting"}
    ordered = [r.run_id for r in list_runs(root)]
    assert ordered.index(run_copy.name) < ordered.index("older")
    assert ordered[-1] == "broken"  # its time is only its folder's: listed last, never opened first
    assert runs["broken"].status == "broken" and runs["starting"].status == "starting"
    assert runs[run_copy.name].workload == "gpt/tiny"
    with pytest.raises(RunDataError, match="corrupt"):
        load_run(root / "broken")
    with pytest.raises(RunNotReady, match="no results yet.*profiling gpt/tiny"):
        load_run(root / "starting")


def test_list_runs_of_a_missing_or_empty_folder(tmp_path: Path) -> None:
    assert list_runs(tmp_path / "nope") == [] and list_runs(tmp_path) == []


# -- price of memory -----------------------------------------------------------------------------

def test_fit_line_and_largest_micro_batch() -> None:
    fit = fit_line([2, 4, 8], [1000 + 10 * b for b in (2, 4, 8)])
    assert fit.intercept == pytest.approx(1000) and fit.slope == pytest.approx(10)
    assert max_micro_batch(LinearFit(1000.0, 10.0), 1095) == 9
    assert max_micro_batch(LinearFit(1000.0, 10.0), 999) == 0
    with pytest.raises(PricingError, match="2 or more distinct sizes"):
        fit_line([4, 4], [1, 2])


def _points(a: float, b: float, c: float, d: float, sizes: tuple[int, ...] = (8, 16)) -> list[dict]:
    return [{"batch_size": s, "peak_bytes": a + b * s, "step_seconds": c + d * s} for s in sizes]


def test_price_plan_numbers() -> None:
    pts = _points(1e9, 1e8, 0.1, 0.001, (8, 16, 64))  # 1 GB fixed, 100 MB per sample; 0.1 s + 1 ms per sample
    p = price_plan("d", "s", pts, Cluster(gpu_memory_gb=11, price_per_gpu_hour=2.0, global_batch=1000, steps=3600))
    assert (p.fits, p.micro_batch, p.gpus, p.accumulation) == (True, 100, 10, 1)
    assert p.step_seconds == pytest.approx(0.2) and p.wall_hours == pytest.approx(0.2) and p.cost == pytest.approx(4.0)
    few = price_plan("d", "s", pts, Cluster(11, 2.0, 1000, 3600, max_gpus=4))  # accumulation makes up the rest
    assert (few.gpus, few.accumulation, few.micro_batch) == (4, 3, 84)
    assert few.step_seconds == pytest.approx(3 * 0.184) and few.cost == pytest.approx(4 * 3 * 0.184 * 2.0)
    assert not price_plan("d", "s", pts, Cluster(1.05, 2.0, 1000, 3600)).fits


def test_time_fit_never_decreases_and_memory_must_grow() -> None:
    peak, time = fit_scaling([{"batch_size": 2, "peak_bytes": 100, "step_seconds": 0.03},
                              {"batch_size": 4, "peak_bytes": 180, "step_seconds": 0.01}])
    assert time.slope == 0.0 and time.intercept == pytest.approx(0.02) and peak.slope == pytest.approx(40)
    with pytest.raises(PricingError, match="does not grow"):
        fit_scaling(_points(100, 0, 0.1, 0.0))
    with pytest.raises(PricingError, match="must be positive"):
        Cluster(0, 1.0, 8, 10).check()


def test_no_price_beyond_twice_the_largest_measured_micro_batch() -> None:
    pts = _points(1e9, 1e8, 0.1, 0.001, (2, 4))  # the fit says 100 samples fit 11 GB; only 2 and 4 were measured
    p = price_plan("d", "s", pts, Cluster(gpu_memory_gb=11, price_per_gpu_hour=2.0, global_batch=1000, steps=3600))
    assert p.micro_batch == 8 and p.fit_largest == 100 and p.capped and p.extrapolated  # 2x 4, marked, not 100
    assert p.gpus * p.accumulation * p.micro_batch >= 1000


def test_peak_only_points_never_enter_a_time_fit() -> None:
    pts = _points(1e9, 1e8, 0.1, 0.001, (8, 16)) + [{"batch_size": 32, "peak_bytes": 1e9 + 32e8,
                                                    "step_seconds": float("inf")}]
    peak, time = fit_scaling(pts)
    assert peak.slope == pytest.approx(1e8) and time.slope == pytest.approx(0.001)
    with pytest.raises(PricingError, match="2 or more distinct sizes"):  # one timed size: no time fit
        fit_scaling(pts[:1] + pts[2:])


def test_a_fit_cheaper_per_sample_than_keep_is_refused() -> None:
    frontier = pd.DataFrame({"digest": ["keep", "rec"], "summary": ["keep 4", "recompute 4"]})
    scaling = {"keep": _points(2e9, 1e8, 0.1, 0.031, (2, 4)), "rec": _points(1e9, 5e7, 0.1, 0.024, (2, 4))}
    table, left_out = priced_and_left_out(frontier, scaling, Cluster(11, 2.0, 1000, 3600), "keep", 0.05)
    assert list(table.digest) == ["keep"]
    assert "less than keeping everything" in left_out[0] and left_out[0].startswith("recompute 4 (rec)")


@pytest.mark.slow
def test_price_table_on_measured_batch_scaling(run_dir: Path) -> None:
    run = load_run(run_dir)
    gpu_gb = 4e-3  # a 4 MB GPU: gpt/tiny needs about 1 MB at batch 2, so the micro-batch matters
    table = price_table(run.frontier, run.batch_scaling, Cluster(gpu_gb, 2.0, 256, 100))
    priced = set(run.batch_scaling) & set(run.frontier.digest)
    assert set(table.digest) == priced and len(table) >= 1
    assert list(table.cost) == sorted(table.cost)
    for r in table.itertuples():
        pts = run.batch_scaling[r.digest]
        peak, _ = fit_scaling(pts)
        for p in pts:  # a line fits measured peak memory over batch sizes within 5%
            assert peak(p["batch_size"]) == pytest.approx(p["peak_bytes"], rel=0.05)
        largest = max_micro_batch(peak, gpu_gb * GB)
        assert r.micro_batch <= largest and peak(largest + 1) > gpu_gb * GB
        assert r.gpus * r.accumulation * r.micro_batch >= 256


@pytest.mark.slow
def test_a_plan_the_gate_refused_reads_as_refused(run_copy: Path) -> None:
    from env.data.plan_check import PlanCheck

    digest = load_run(run_copy).evaluations.digest.iloc[-1]
    check = PlanCheck(digest=digest, passed=False, error=0.5, tolerance=1e-3, culprits=["blocks.1"])
    with RunStore(run_copy / STORE_NAME) as store:
        store.write(meta.GATE, {digest: check})
    assert load_run(run_copy).refused == {digest: check.line()}
    assert "'blocks.1'" in check.line()

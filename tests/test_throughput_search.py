"""A throughput search end to end (real Ray, real measurements, a real store) on gpt/tiny; its export, its
report, the dashboard's throughput page on it, and bench/throughput.py --quick."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from dashboard.launch import RUNS_ENV
from dashboard.throughput import cap_from_selection, curve_frame, throughput_figure
from env.data.types import MIB
from search.engine.throughput.quote import proposed_by
from search.records import meta
from search.records.frontier_file import load_frontier
from search.records.store import RunStore
from tests.test_dashboard_app import every_page_readable

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "dashboard" / "app.py")
CAPS_MIB = (1.2, 2.5)
TINY = ["--workload", "gpt/tiny", "--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128",
        "--max-measurements", "10", "--repeats", "1", "--no-progress", "--no-batch-scaling",
        "--throughput-timesteps", "64"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, ray_session) -> Path:
    from search.run import main

    out = tmp_path_factory.mktemp("runs")
    assert main([*TINY, "--out", str(out), "--name", "tp", "--memory-cap", *map(str, CAPS_MIB)]) == 0
    return out / "tp"


@pytest.mark.slow
def test_a_memory_cap_search_answers_each_cap_with_a_measured_plan_that_fits(run_dir: Path):
    curve = load_frontier(run_dir).throughput
    assert curve is not None and [r.cap_bytes for r in curve.caps] == [int(c * MIB) for c in CAPS_MIB]
    assert curve.micro_batches[0] == 1 and curve.default_micro_batch == 2 and curve.tokens_per_sample == 16
    far = set(curve.profiled_batches) - {2}  # the second profile, taken while the ladder was found: a power of two
    assert len(far) == 1 and far.pop() in {1, 4, 8}  # up to FIT_SPAN times the own batch (early_fit_batch)
    with RunStore(run_dir, readonly=True) as store:
        measured = {(b, m.digest): m for b, m in store.measured_at_micro_batches()}
        assert store.read(meta.STATUS) == "finished"
    for row in curve.caps:
        ours = row.answer
        assert ours is not None and ours.name == "ours" and set(ours.plan) == set(load_frontier(run_dir).units)
        assert ours.counted_peak_bytes <= row.cap_bytes and ours.samples_per_second > 0
        assert ours.n_samples == curve.quote_rounds * 1  # quoted: one timed step per round (--repeats 1)
        chosen = measured[(row.selected.micro_batch, row.selected.digest)]  # the measurements that chose it
        assert chosen.peak_bytes <= row.cap_bytes and row.selected.digest == ours.digest
        names = {p.name for p in row.quote}
        assert {"ours", "rule:none", "rule:all"} <= names
        assert any(n.startswith("peer:checkpoint-sequential") for n in names)
        for p in row.peers():  # each peer at the largest micro-batch it fits, as measured in the quote
            assert p.counted_peak_bytes <= row.cap_bytes and p.n_samples == curve.quote_rounds
            larger = measured.get((p.micro_batch + 1, p.digest))
            assert larger is None or larger.peak_bytes > row.cap_bytes
        assert row.model_optimal is not None and row.model_optimal.peak_bytes <= row.cap_bytes
        for who, p in row.by_proposer.items():  # the agent's best against the exact solver's, quoted alike
            assert proposed_by(measured[(p.micro_batch, p.digest)], who) and p.counted_peak_bytes <= row.cap_bytes
            assert p.n_samples == curve.quote_rounds
    # each proposer's first-ranked configuration is measured at every cap, so both stand in every row
    assert all(set(row.by_proposer) == {"exact", "agent"} for row in curve.caps)
    above = [m for m in measured.values() if not m.oom and m.peak_bytes > curve.caps[-1].cap_bytes]
    assert above and not any(m.step_seconds_samples for m in above)  # only the peak, where no cap fits
    # the contenders' largest fitting micro-batches, the lowest-memory plan and the ladder were found by peaks
    # alone (the quote and the fit's checks time them); anything else proposed was timed when it was proposed
    assert not any(m.step_seconds_samples for d, m in measured.items() if d[1].startswith("peer:"))
    # (the ladder's probe times its steps up to the largest micro-batch the fit was made from, measure_ladder)
    top, fitted_to = curve.caps[-1].cap_bytes, max(curve.profiled_batches)
    assert all(m.step_seconds_samples for (b, _), m in measured.items() if not m.oom and m.peak_bytes <= top
               and not all(src.startswith(("rule:", "peer:", "throughput:lowest")) or src == "throughput:probe"
                           and b > fitted_to for src in m.sources))
    # the fit's checks: timed up to there, and above it where the quote measured the plan; the peak alone elsewhere
    quoted = {(p.micro_batch, p.digest) for r in curve.caps for p in [*r.quote, *r.by_proposer.values()]}
    keep = next(p.digest for p in curve.caps[0].quote if p.name == "rule:none")
    for c in curve.fit_checks:
        if c.measured_peak_bytes > top:
            assert c.measured_seconds is None
        elif c.micro_batch <= fitted_to:
            assert c.measured_seconds is not None
        elif c.plan == "all keep":
            assert (c.measured_seconds is not None) == ((c.micro_batch, keep) in quoted)
        else:
            assert c.measured_seconds is None or any(b == c.micro_batch for b, _ in quoted)
    assert len({(c.micro_batch, c.plan) for c in curve.fit_checks}) == len(curve.fit_checks)
    unfitted = [c for c in curve.fit_checks if not c.fitted]
    assert unfitted and all(abs(c.predicted_peak_bytes / c.measured_peak_bytes - 1) < 0.05 for c in unfitted)
    assert curve.frontiers and all(pts for pts in curve.frontiers.values())
    # the pool widened to both cores of the test's Ray (throughput_evaluators), and both measured at micro-batches
    assert curve.evaluators == 2 and len({e for m in measured.values() for e in m.evaluators}) == 2
    report = (run_dir / "report.md").read_text()
    assert "## Throughput under memory caps" in report and "### Cap 1.2 MiB" in report and "**ours**" in report
    assert "Measured by 2 Evaluators side by side" in report and "Best measured by who proposed it" in report
    with RunStore(run_dir, readonly=True) as store:  # every answer checked by the correctness gate before it was chosen
        checks = store.read(meta.GATE)
    assert all(checks[r.answer.digest].passed for r in curve.caps)
    assert f"{len({r.answer.digest for r in curve.caps})} plans answering a memory cap were checked" in report
    assert json.loads((run_dir / "report.json").read_text())["throughput"]["caps"]


@pytest.mark.slow
def test_the_report_sets_each_answers_predicted_samples_per_second_beside_the_measured(run_dir: Path):
    """Per cap, the answer as the model priced it when the search chose it (the fit alone, and scaled by the steps
    timed at the nearest micro-batch) beside the quote's samples per second, in report.md and frontier.json."""
    curve = load_frontier(run_dir).throughput
    report = (run_dir / "report.md").read_text()
    assert "### Predicted against measured" in report
    scaled = 0
    for row in curve.caps:
        a = row.answer
        assert row.fit_seconds > 0 and row.predicted_seconds > 0 and a.samples_per_second > 0
        predicted = a.micro_batch / row.predicted_seconds
        line = (f"| {row.cap_bytes / MIB:.1f} | {a.label} | {a.micro_batch} | {a.micro_batch / row.fit_seconds:.1f} | "
                f"{predicted:.1f} | {a.samples_per_second:.1f} | {predicted / a.samples_per_second:.2f}x |")
        assert line in report, line
        scaled += row.predicted_seconds != row.fit_seconds
    assert scaled  # the search timed steps, and they moved the prices off the fit's
    saved = json.loads((run_dir / "frontier.json").read_text())["throughput"]["caps"]
    assert [c["predicted_seconds"] for c in saved] == [r.predicted_seconds for r in curve.caps]


@pytest.mark.slow
def test_the_export_cli_writes_the_answer_with_its_micro_batch(run_dir: Path, tmp_path: Path, capsys):
    from search.export import main

    assert main([str(run_dir), "--memory-cap", str(CAPS_MIB[-1]), "--out", str(tmp_path / "plan.json")]) == 0
    data = json.loads((tmp_path / "plan.json").read_text())
    best = load_frontier(run_dir).throughput.best_within(int(CAPS_MIB[-1] * MIB))
    assert data["micro_batch"] == best.micro_batch and data["accumulation_steps"] == 1
    assert data["actions"] == {u: a.value for u, a in best.plan.items()}
    assert f"micro-batch {best.micro_batch}" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cap_no_plan_fits_fails_in_one_line_naming_the_lowest_measured_peak(tmp_path: Path, ray_session, capsys):
    from search.run import main

    assert main([*TINY, "--out", str(tmp_path), "--name", "low", "--memory-cap", "0.1"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    with RunStore(tmp_path / "low", readonly=True) as store:
        assert store.read(meta.STATUS).startswith("failed: memory cap 0.1 MiB: no plan fits")
        lowest = min(m.peak_bytes for b, m in store.measured_at_micro_batches() if b == 1)
    assert len(err) == 1 and f"memory cap 0.1 MiB: no plan fits; the lowest measured peak is {lowest / MIB:.1f} MiB" \
        in err[0] and "at micro-batch 1" in err[0]


@pytest.mark.slow
def test_the_throughput_page_paints_and_a_click_selects_a_cap(run_dir: Path, monkeypatch: pytest.MonkeyPatch):
    curve = load_frontier(run_dir).throughput
    fig = throughput_figure(curve)
    ours = next(t for t in fig.data if t.name.startswith("ours"))
    assert list(ours.customdata) == [r.cap_bytes for r in curve.caps]
    assert list(ours.y) == pytest.approx([r.answer.samples_per_second for r in curve.caps])
    assert cap_from_selection([{"customdata": [curve.caps[0].cap_bytes]}]) == curve.caps[0].cap_bytes
    assert set(curve_frame(curve).name) >= {"ours", "rule:none"}
    monkeypatch.setenv(RUNS_ENV, str(run_dir.parent))
    monkeypatch.setattr(sys, "argv", ["app.py"])
    st_config.set_option("server.address", "127.0.0.1")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    every_page_readable(at)  # no "None", no raw column names on a throughput run's pages either
    at.session_state["page"] = "Throughput"  # only the open page runs
    at.run()
    top = curve.caps[-1]
    assert any(f"Under {top.cap_bytes / MIB:.1f} MiB" in s.value for s in at.success)
    assert any(f'"micro_batch": {top.answer.micro_batch}' in c.value for c in at.code)
    at.selectbox(key="throughput_cap").set_value(curve.caps[0].cap_bytes).run()
    assert not at.exception
    low = curve.caps[0]
    assert any(f"Under {low.cap_bytes / MIB:.1f} MiB" in s.value and f"micro-batch {low.answer.micro_batch}" in s.value
               for s in at.success)
    table = next(d.value for d in at.dataframe if "against ours" in d.value.columns)
    assert list(table["against ours"])[0] == "ours" and table["samples/s"].notna().all()
    assert all(v.startswith(("within noise", "the same plan")) or "beyond both spreads" in v
               for v in table["against ours"][1:])


@pytest.mark.slow
def test_the_throughput_bench_quick(tmp_path: Path):
    out = tmp_path / "throughput.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "throughput.py"), "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    w = result["workloads"][0]
    assert w["workload"] == "gpt/tiny" and w["caps"] == ["1.2 x lowest", "no checkpointing", "2 x no checkpointing"]
    assert result["machine"]["cpu_count"] >= 1 and w["search"]["wall_seconds"] > 0
    for row in w["search"]["caps"]:
        assert row["answer"]["counted_peak_bytes"] <= row["cap_bytes"] and row["answer"]["samples_per_second"] > 0
        assert all(p["counted_peak_bytes"] <= row["cap_bytes"] for p in row["peers"])
    grid = w["grid"]
    assert grid["plans_measured"] >= len(w["search"]["micro_batches"])
    for row in grid["caps"]:
        assert row["grid_best"]["peak_bytes"] <= row["cap_bytes"] and row["ours_over_grid"] > 0
        assert row["grid_best"]["quoted_spread_seconds"] >= 0 and isinstance(row["within_spreads"], bool)
    designs = w["agents"]["designs"]
    assert set(designs) == {"one agent per micro-batch", "one agent conditioned on the micro-batch"}
    for d in designs.values():
        assert d["train_seconds"] > 0 and all(c["regret"] is None or -1e-9 <= c["regret"] <= 1 for c in d["caps"])
    assert "| cap | ours: plan at micro-batch: samples/s |" in proc.stdout


@pytest.mark.slow
@pytest.mark.browser
def test_the_throughput_page_paints_in_a_real_browser(run_dir: Path):
    """The run served by a real dashboard, its Throughput tab opened in Debian's Chromium: the chart draws a point
    per cap for ours and the answer of the cap picked shows."""
    import os

    from dashboard.launch import free_port, start_server

    chromium = "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        pytest.skip(f"{chromium} missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    port = free_port()
    server = start_server(run_dir.parent, port)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(f"http://127.0.0.1:{port}/")
            page.get_by_role("tab", name="Throughput").click(timeout=60_000)
            page.get_by_text("Under ").first.wait_for(timeout=45_000)
            chart = page.locator(".js-plotly-plot").filter(has_text="samples per second")
            chart.locator(".scatterlayer .point").first.wait_for(timeout=45_000)
            assert chart.locator(".scatterlayer .point").count() >= len(CAPS_MIB)
            assert page.get_by_test_id("stException").count() == 0
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.slow
def test_a_long_call_on_the_first_evaluator_sends_the_jobs_to_the_others_until_it_is_done(ray_session):
    """The throughput search profiles on the first Evaluator while the others find the ladder: no job may queue
    behind the profile (on gpt/small one waited 14 s there), and once the profile is done the first takes jobs
    again, within the same dispatch."""
    from search.engine.evaluator_pool import EvaluatorPool
    from search.records.config import SearchConfig

    pool = EvaluatorPool(SearchConfig(workload="gpt/tiny", evaluators=2, repeats=1, progress=False).validate())
    first, second = (s.info["evaluator"] for s in pool.live)
    names = ["keep"] * len(pool.units)
    arrived = []  # (who measured it, whether the profile was done when it arrived)

    def measured(got: dict) -> dict:
        arrived.append((got["record"].evaluators[0], bool(ray_session.wait([profiled], timeout=0)[0])))
        return got

    with pool.first_aside(lambda handle: handle.profile_at.remote(16, None)) as profiled:
        got = pool.run_jobs([1, 2, 3, 4] * 6, lambda handle, b, killed: handle.measure_at.remote(names, b, None, not_fitting=killed), measured)
        profile = ray_session.get(profiled)
        after = pool.run_jobs([2, 3], lambda handle, b, killed: handle.measure_at.remote(names, b, None, not_fitting=killed), lambda g: g)
    assert pool.live[0].aside is None and len(got) == 24 and profile["units"] == pool.units
    assert got[0]["record"].evaluators[0] == second  # dispatched while the first profiled
    assert all(who == second for who, done in arrived if not done)  # none queued behind the profile
    assert {g["record"].evaluators[0] for g in after} == {first, second}  # the profile done: both take jobs

"""The dashboard in a real Chromium: frontier chart, budget slider, plan JSON download.

Starts ``streamlit run dashboard/app.py`` headless on a free port against a small real run
folder and drives Debian's /usr/bin/chromium with playwright (no browser is downloaded).
Skipped when /usr/bin/chromium or playwright is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dashboard.data import load_run, select_plan
from dashboard.launch import free_port, start_server
from env.data.plan import Plan
from tests.fixtures_runs import cached_run

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.browser, pytest.mark.slow,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} missing (apt-get install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api")


def test_budget_slider_and_json_download(tmp_path: Path) -> None:
    run_dir = cached_run("gpt/tiny")
    run = load_run(run_dir)
    smallest = select_plan(run.frontier, float(run.frontier.peak_bytes.min()))
    port = free_port()
    server = start_server(run_dir.parent, port)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            page.goto(f"http://127.0.0.1:{port}/")
            # the first paint can be an empty chart: wait for drawn points
            page.locator(".js-plotly-plot .scatterlayer .point").first.wait_for(timeout=45_000)
            slider = page.get_by_role("slider", name="memory budget")
            value_and_min = "e => [Number(e.value), Number(e.min)]"
            start, low = slider.evaluate(value_and_min)
            assert start > low  # it starts at the top: the fastest plan overall
            slider.focus()
            slider.press("Home")  # the tightest budget: the smallest frontier plan
            page.get_by_text(f"({smallest.digest})").first.wait_for(timeout=20_000)
            now, low = slider.evaluate(value_and_min)
            assert now == pytest.approx(low)
            page.get_by_role("tab", name="Plan").click()
            with page.expect_download(timeout=20_000) as info:
                page.get_by_role("button", name="Download plan JSON").click()
            saved = tmp_path / "plan.json"
            info.value.save_as(saved)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    plan = Plan.load(saved)
    assert plan.digest == smallest.digest and plan.fingerprint == run.fingerprint
    assert [a.value for a in plan.action_list(run.units)] == list(smallest.actions)

"""The dashboard in a real Chromium: budget slider, a click on the chart, export, starting a search.

Starts ``streamlit run dashboard/app.py`` headless on a free port against small real run folders
and drives Debian's /usr/bin/chromium with playwright (no browser is downloaded). Skipped when
/usr/bin/chromium or playwright is missing. The first paint can be an empty chart: each test
waits for drawn points.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from dashboard import figures, selection
from dashboard.data import RunData, load_run
from dashboard.launch import free_port, start_server
from env.data.plan import Plan
from env.data.types import MIB
from tests.fixtures_runs import cached_run

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SLIDER = "e => [Number(e.value), Number(e.min), Number(e.max), Number(e.step)]"

pytestmark = [
    pytest.mark.browser, pytest.mark.slow,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} missing (apt-get install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A copy of a real gpt/tiny run folder under a runs folder, and the URL of a dashboard on it."""
    runs = tmp_path_factory.mktemp("runs")
    shutil.copytree(cached_run("gpt/tiny"), runs / "gpt-tiny")
    port = free_port()
    server = start_server(runs, port)
    try:
        yield runs, f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture()
def page(served: tuple[Path, str]) -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1400}, accept_downloads=True)
        page.goto(served[1])
        page.locator(".js-plotly-plot .scatterlayer .point").first.wait_for(timeout=45_000)
        yield page
        assert page.get_by_test_id("stException").count() == 0, page.get_by_test_id("stException").all_inner_texts()
        browser.close()


def _peak_mib(run: RunData, digest: str) -> float:
    return float(run.evaluations.set_index("digest").peak_bytes[digest]) / MIB


def test_budget_slider_and_json_download(served: tuple[Path, str], page, tmp_path: Path) -> None:
    run = load_run(served[0] / "gpt-tiny")
    start, smallest = selection.start_plan(run), run.frontier.iloc[0]
    page.get_by_text(f"({start})").first.wait_for(timeout=20_000)  # opens on the start plan ...
    slider = page.get_by_role("slider", name="memory budget")
    value, low, _, step = slider.evaluate(SLIDER)
    assert value == pytest.approx(_peak_mib(run, start), abs=step)  # ... with the budget at its peak
    slider.focus()
    slider.press("End")  # the loosest budget: the fastest plan of all
    fastest = run.frontier.sort_values("step_seconds").digest.iloc[0]
    page.get_by_text(f"({fastest}), the fastest frontier plan within the budget").wait_for(timeout=20_000)
    slider.press("Home")  # the tightest budget: the smallest frontier plan
    page.get_by_text(f"({smallest.digest}), the fastest frontier plan within the budget").wait_for(timeout=20_000)
    assert slider.evaluate(SLIDER)[0] == pytest.approx(low)
    page.get_by_role("tab", name="Plan").click()
    with page.expect_download(timeout=20_000) as info:
        page.get_by_role("button", name="Download plan JSON").click()
    saved = tmp_path / "plan.json"
    info.value.save_as(saved)
    plan = Plan.load(saved)
    assert plan.digest == smallest.digest and plan.fingerprint == run.fingerprint
    assert [a.value for a in plan.action_list(run.units)] == list(smallest.actions)


def _clearest_frontier_point(page, run: RunData, selected: str) -> tuple[str, float, float]:
    """The frontier point (not ``selected``) farthest on screen from any point of another plan, and its
    centre: plotly gives a click to the nearest marker, and a bigger one near it (a rule, the star) wins."""
    fig = figures.frontier_figure(run, selected=selected)  # the app's figure: same traces, same order
    traces = page.locator(".stPlotlyChart").first.locator(".scatterlayer .trace")
    centres = "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })"
    points = []  # (digest or None, x, y, frontier index or None)
    for k, trace in enumerate(fig.data):
        if "markers" not in trace.mode:
            continue
        xy = traces.nth(k).locator(".point").evaluate_all(centres)
        digests = list(trace.customdata) if trace.customdata is not None else [None] * len(xy)
        points += [(d, x, y, i if trace.name == figures.FRONTIER_TRACE else None) for i, (d, (x, y)) in enumerate(zip(digests, xy))]

    def clearance(p: tuple) -> float:
        return min(((p[1] - q[1]) ** 2 + (p[2] - q[2]) ** 2) ** 0.5 for q in points if q[0] != p[0])

    best = max((p for p in points if p[3] is not None and p[0] != selected), key=clearance)
    assert clearance(best) > 6, "every frontier point sits on another plan's marker"
    return best[0], best[1], best[2]


def test_a_click_on_a_frontier_point_selects_it_and_the_slider_follows(served: tuple[Path, str], page) -> None:
    run = load_run(served[0] / "gpt-tiny")
    start = selection.start_plan(run)
    page.get_by_text(f"({start})").first.wait_for(timeout=20_000)
    target, x, y = _clearest_frontier_point(page, run, start)
    page.mouse.move(x, y)
    page.wait_for_timeout(300)  # plotly picks the clicked point from its hover state
    page.mouse.down()
    page.mouse.up()
    page.get_by_text(f"({target}), picked on the chart").wait_for(timeout=20_000)
    value, _, _, step = page.get_by_role("slider", name="memory budget").evaluate(SLIDER)
    assert value == pytest.approx(_peak_mib(run, target), abs=step)
    page.get_by_role("tab", name="Plan").click()
    assert page.get_by_role("heading", name=f"({target})").is_visible()


def _start_search(page, workload: str) -> None:
    page.get_by_role("tab", name="New search").click()
    page.get_by_role("textbox", name="workload").fill(workload)
    page.get_by_role("spinbutton", name="timesteps per agent").fill("8")
    page.get_by_role("button", name="Start search").click()


def test_a_missing_workload_file_is_refused_before_launch(served: tuple[Path, str], page, tmp_path: Path) -> None:
    runs = served[0]
    _start_search(page, f"{tmp_path / 'no_such_model.py'}:make")
    error = page.get_by_test_id("stAlertContentError").filter(has_text="does not exist").first
    error.wait_for(timeout=20_000)
    assert "\n" not in error.inner_text().strip() and "no_such_model.py" in error.inner_text()
    assert [p.name for p in runs.iterdir()] == ["gpt-tiny"], "nothing was started"


def test_a_search_started_from_the_form_shows_its_live_page(served: tuple[Path, str], page) -> None:
    runs = served[0]
    _start_search(page, "gpt/tiny")
    try:
        page.get_by_role("tab", name="Live", selected=True).wait_for(timeout=120_000)  # a running run opens there
        page.get_by_test_id("stMetricValue").filter(has_text="running").first.wait_for(timeout=30_000)
        new = [p for p in runs.iterdir() if p.name != "gpt-tiny"]
        assert len(new) == 1
        assert page.get_by_test_id("stCaptionContainer").filter(has_text=f"{new[0].name} · gpt/tiny · running").count()
        assert page.get_by_test_id("stException").count() == 0
    finally:
        for p in runs.iterdir():
            if p.name != "gpt-tiny":
                kill_search(p)


def kill_search(run_dir: Path) -> None:
    """Kill the search writing ``run_dir`` and its Ray processes (the dashboard starts it in its own
    process group); found by its command line, which names the run."""
    groups = set()
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"search.run" in cmd and run_dir.name.encode() in cmd:
            groups.add(os.getpgid(int(proc.name)))
    for g in groups:
        os.killpg(g, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while groups and time.monotonic() < deadline:
        groups = {g for g in groups if _group_alive(g)}
        time.sleep(0.2)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True

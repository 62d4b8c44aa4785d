"""The dashboard in a real Chromium: budget slider, list and red line agreeing, the comparison table, a click
on the chart, the Plan page's copy blocks run as pasted, a price beyond the measured range, starting and
stopping a search.

Starts ``streamlit run dashboard/app.py`` headless on a free port against small real run folders
and drives Debian's /usr/bin/chromium with playwright (no browser is downloaded). Skipped when
/usr/bin/chromium or playwright is missing. The first paint can be an empty chart: each test
waits for drawn points.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pandas as pd
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


def _selected_in_list(page) -> str:
    """The plan list's shown value (its label ends with the plan's digest in brackets)."""
    return page.get_by_role("combobox", name="or pick any measured plan").input_value()


def test_slider_list_and_red_line_agree_and_the_table_compares_the_peers(served: tuple[Path, str], page,
                                                                         tmp_path: Path) -> None:
    run = load_run(served[0] / "gpt-tiny")
    start, smallest = selection.start_plan(run), run.frontier.iloc[0]
    page.get_by_text(f"({start})").first.wait_for(timeout=20_000)  # opens on the start plan ...
    slider = page.get_by_role("slider", name="memory budget")
    value, low, high, step = slider.evaluate(SLIDER)
    assert value == pytest.approx(_peak_mib(run, start), abs=step)  # ... with the budget at its peak
    slider.focus()
    for key, budget in (("End", high), ("Home", low)):  # the loosest and the tightest budget
        slider.press(key)
        chosen = selection.digest_under_budget(run, budget)  # the red line's fastest point within the budget
        assert chosen in set(run.frontier.digest)
        page.get_by_text(f"({chosen}), the fastest frontier plan within the budget").wait_for(timeout=20_000)
        assert f"({chosen})" in _selected_in_list(page) and _selected_in_list(page).startswith("frontier")
    assert slider.evaluate(SLIDER)[0] == pytest.approx(low) and chosen == smallest.digest
    with page.expect_download(timeout=20_000) as info:
        page.get_by_role("button", name="Download this table (CSV)").click()
    info.value.save_as(tmp_path / "plans.csv")
    table = pd.read_csv(tmp_path / "plans.csv")
    peers = table.loc[table.kind == "peer"]
    assert set(peers.name) == set(run.peers.peer) and peers.status.str.contains("within noise|beyond both").all()
    assert set(table.loc[table.status.str.startswith("on the frontier"), "plan id"]) == set(run.frontier.digest)
    page.get_by_text("else within noise").first.wait_for(timeout=5_000)  # the noise rule, said on the page


def test_the_plan_page_s_blocks_run_as_pasted_and_a_far_price_is_marked(served: tuple[Path, str], page,
                                                                        tmp_path: Path) -> None:
    run = load_run(served[0] / "gpt-tiny")
    start = selection.start_plan(run)
    page.get_by_role("tab", name="Plan").click()
    blocks = page.get_by_test_id("stCode").filter(has_text="search.export")
    blocks.first.wait_for(timeout=30_000)
    command = blocks.first.inner_text().strip()
    code = page.get_by_test_id("stCode").filter(has_text="handle.remove()").first.inner_text()
    assert code.startswith("from search import apply_plan") and f"plan-{start}.json" in command
    venv = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(command, shell=True, cwd=tmp_path, env=venv, check=True, timeout=120)  # as pasted in a shell
    (tmp_path / "pasted.py").write_text(code)
    subprocess.run([sys.executable, "pasted.py"], cwd=tmp_path, check=True, timeout=300)  # a fresh process
    assert Plan.load(tmp_path / f"plan-{start}.json").digest == start
    page.get_by_role("tab", name="Price of memory").click()
    box = page.get_by_role("spinbutton", name="GPU memory (GB)")
    box.fill("0.004")  # a 4 MB GPU: the fit says far larger micro-batches fit than the measured 2, 4 and 8
    box.press("Enter")
    page.get_by_text("CPU times").first.wait_for(timeout=30_000)
    page.get_by_text("capped: the fit allows").first.wait_for(timeout=30_000)  # the bar is marked, not priced far out


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
    page.get_by_role("heading", name=f"({target})").wait_for(timeout=60_000)


def _fill_workload(page, workload: str) -> None:
    page.get_by_role("tab", name="New search").click()
    page.get_by_role("textbox", name="workload").fill(workload)
    page.get_by_role("textbox", name="workload").press("Enter")


def _start_search(page, workload: str) -> str:
    """Fill the form, start the search; returns the command the page showed before the start."""
    _fill_workload(page, workload)
    page.get_by_role("spinbutton", name="timesteps per agent").fill("8")
    page.get_by_role("spinbutton", name="timesteps per agent").press("Enter")
    shown = page.get_by_test_id("stCode").filter(has_text="--timesteps 8").first
    shown.wait_for(timeout=20_000)
    command = shown.inner_text().strip()
    page.get_by_role("button", name="Start search").click()
    return command


def test_bad_workloads_are_refused_in_one_line_before_launch(served: tuple[Path, str], page, tmp_path: Path) -> None:
    runs = served[0]
    for workload, says in ((f"{tmp_path / 'no_such_model.py'}:make", "does not exist"),
                           ("gpt?n_layer=0", "option n_layer=0 of workload 'gpt' must be at least 1")):
        _fill_workload(page, workload)
        error = page.get_by_test_id("stAlertContentError").filter(has_text=says).first
        error.wait_for(timeout=20_000)
        assert "\n" not in error.inner_text().strip()
        page.get_by_role("button", name="Start search", disabled=True).wait_for(timeout=20_000)
    assert [p.name for p in runs.iterdir()] == ["gpt-tiny"], "nothing was started"


def test_a_search_started_from_the_form_shows_its_live_page_and_stop_ends_it(served: tuple[Path, str], page) -> None:
    runs = served[0]
    _fill_workload(page, "gpt/tiny")
    shown = page.get_by_test_id("stCode").filter(has_text="-m search.run").first
    shown.wait_for(timeout=20_000)  # the exact command, before anything starts
    assert "--workload gpt/tiny" in shown.inner_text() and [p.name for p in runs.iterdir()] == ["gpt-tiny"]
    command = _start_search(page, "gpt/tiny")
    try:
        page.get_by_role("tab", name="Live", selected=True).wait_for(timeout=120_000)  # a running run opens there
        page.get_by_test_id("stMetricValue").filter(has_text="running").first.wait_for(timeout=30_000)
        new = [p for p in runs.iterdir() if p.name != "gpt-tiny"]
        assert len(new) == 1 and f"--name {new[0].name}" in command  # the run the command shown named
        assert page.get_by_test_id("stCaptionContainer").filter(has_text=f"{new[0].name} · gpt/tiny · running").count()
        page.get_by_role("tab", name="New search").click()
        started = page.get_by_test_id("stCaptionContainer").filter(has_text="started pid").first.inner_text()
        assert started.endswith(command), "the command shown before the start is the one that ran"
        page.get_by_role("button", name=f"Stop search {new[0].name}").click()
        page.get_by_text(f"Search {new[0].name}: ").wait_for(timeout=60_000)
        assert not _search_processes(new[0]), "the search and its Ray processes are gone"
        assert page.get_by_test_id("stException").count() == 0
    finally:
        for p in runs.iterdir():
            if p.name != "gpt-tiny":
                kill_search(p)


def kill_search(run_dir: Path) -> None:
    """Kill the search writing ``run_dir`` and its Ray processes (the dashboard starts it in its own
    process group); found by its command line, which names the run."""
    groups = {os.getpgid(pid) for pid in _search_processes(run_dir)}
    for g in groups:
        os.killpg(g, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while groups and time.monotonic() < deadline:
        groups = {g for g in groups if _group_alive(g)}
        time.sleep(0.2)


def _search_processes(run_dir: Path) -> list[int]:
    """The processes of the search writing ``run_dir`` (its command line names the run; a zombie has none)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"search.run" in cmd and run_dir.name.encode() in cmd:
            found.append(int(proc.name))
    return found


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True

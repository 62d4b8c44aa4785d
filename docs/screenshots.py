"""Take the README's screenshots of every dashboard page with a real Chromium.

    python docs/screenshots.py [RUNS_DIR] [--pages frontier plan ...] [--prefix NAME_]
    python docs/screenshots.py --first-paint URL [--times 3]   # seconds to a served dashboard's first paint

Without RUNS_DIR it first runs a real search (``python -m search.run`` on ``gpt/tiny?n_layer=8``
with its default agents and reward: every point on the pictures was proposed and measured by
that search, nothing is scripted). Shows the newest run under RUNS_DIR and writes
docs/<prefix><page>.png for frontier, plan, pricing, live, new_search and throughput, each as tall
as the page (the throughput page from a ``--memory-cap`` run: ``--pages throughput`` on its folder). Needs /usr/bin/chromium (apt-get install chromium) and the playwright Python package; it
never downloads a browser.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import Page, sync_playwright  # noqa: E402

from dashboard.data import list_runs, load_run  # noqa: E402
from dashboard.launch import free_port, start_server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DOCS = Path(__file__).resolve().parent
WIDTH = 1400
PAGES = {"frontier": "Frontier", "plan": "Plan", "pricing": "Price of memory", "live": "Live", "new_search": "New search",
         "throughput": "Throughput"}
LAST_TEXT = {"plan": "How to apply"}  # text a page shows last, once its run is done
GPU_PER_BASELINE = 1.5  # the price page's GPU: 1.5x the baseline's peak, so the plans differ in micro-batch and GPUs


def fit_height(page: Page) -> None:
    """Make the window as tall as the page's content, so one screenshot holds all of it."""
    height = page.get_by_test_id("stMainBlockContainer").evaluate("e => e.scrollHeight")
    page.set_viewport_size({"width": WIDTH, "height": max(800, min(int(height) + 40, 4000))})
    page.wait_for_timeout(1500)  # plotly redraws at the new size


def open_page(page: Page, name: str, gpu_gb: float) -> None:
    page.get_by_role("tab", name=PAGES[name]).click()
    page.wait_for_timeout(500)  # the running indicator appears within this once the page's run is going
    page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=120_000)  # only the open page runs
    if name in LAST_TEXT:  # a page that imports torch first: its indicator can show late
        page.get_by_text(LAST_TEXT[name]).first.wait_for(timeout=120_000)
    page.wait_for_timeout(1500)  # plotly draws after the tab is shown
    if name == "pricing":
        box = page.get_by_role("spinbutton", name="GPU memory (GB)")
        box.fill(f"{gpu_gb:.3g}")
        box.press("Enter")
        page.wait_for_timeout(500)
        page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=120_000)
        page.wait_for_timeout(1500)


def shoot(runs: Path, pages: list[str], prefix: str = "", out: Path = DOCS) -> list[Path]:
    shown = load_run(list_runs(runs)[0].path)  # the dashboard opens on the newest run
    gpu_gb = GPU_PER_BASELINE * shown.baseline_peak_bytes / 1e9
    port = free_port()
    server = start_server(runs, port)
    shots = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": WIDTH, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            page.locator(".js-plotly-plot .scatterlayer .point").first.wait_for(timeout=60_000)  # first paint can be empty
            page.wait_for_timeout(1000)
            for name in pages:
                open_page(page, name, gpu_gb)
                fit_height(page)
                page.mouse.move(0, 0)  # no hover label on the pictures
                shots.append(out / f"{prefix}{name}.png")
                page.screenshot(path=shots[-1])
                page.set_viewport_size({"width": WIDTH, "height": 1000})
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    return shots


def first_paint(url: str, times: int = 3) -> list[tuple[float, float]]:
    """Seconds from opening ``url`` in a fresh browser to (the first point drawn on a chart, the script done:
    Streamlit's running indicator gone), ``times`` times, each in a new session."""
    import time

    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(times):
            page = browser.new_context(viewport={"width": WIDTH, "height": 1000}).new_page()
            t0 = time.perf_counter()
            page.goto(url)
            page.locator(".js-plotly-plot .scatterlayer .point").first.wait_for(timeout=120_000)
            drawn = time.perf_counter() - t0
            page.wait_for_timeout(300)  # the running indicator appears within this once a run is going
            page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=120_000)
            out.append((drawn, time.perf_counter() - t0))
            page.context.close()
        browser.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="?", help="folder of run folders (default: run a fresh gpt/tiny?n_layer=8 search)")
    p.add_argument("--pages", nargs="+", choices=list(PAGES), default=[k for k in PAGES if k != "throughput"],
                   help="pages to shoot (throughput: give a folder whose newest run searched with --memory-cap)")
    p.add_argument("--prefix", default="", help="file name prefix, e.g. 48_units_")
    p.add_argument("--out", default=str(DOCS), help="folder to write the pictures to (default: docs/)")
    p.add_argument("--first-paint", metavar="URL", help="time a served dashboard's first paint instead")
    p.add_argument("--times", type=int, default=3, help="with --first-paint: fresh sessions to time")
    args = p.parse_args()
    if args.first_paint:
        for drawn, done in first_paint(args.first_paint, args.times):
            print(f"first point drawn {drawn:.1f} s, page done {done:.1f} s")
        return
    if args.runs:
        runs = Path(args.runs)
    else:
        import subprocess

        runs = Path(tempfile.mkdtemp(prefix="ckpt-screens-"))
        subprocess.run([sys.executable, "-m", "search.run", "--workload", "gpt/tiny?n_layer=8", "--no-progress",
                        "--out", str(runs), "--name", "gpt-tiny-demo"], cwd=ROOT, check=True)
    for path in shoot(runs, args.pages, args.prefix, Path(args.out)):
        print(path)


if __name__ == "__main__":
    main()

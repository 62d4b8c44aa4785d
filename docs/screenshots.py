"""Take the README's screenshots of every dashboard page with a real Chromium.

    python docs/screenshots.py [RUNS_DIR]

Without RUNS_DIR it first runs a real search (``python -m search.run`` on ``gpt/tiny?n_layer=8``
with its default agents and reward: every point on the pictures was proposed and measured by
that search, nothing is scripted). Writes docs/frontier.png, docs/plan.png, docs/pricing.png,
docs/live.png and docs/new_search.png. Needs /usr/bin/chromium (apt-get install chromium)
and the playwright Python package; it never downloads a browser.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import Page, sync_playwright  # noqa: E402

from dashboard.launch import free_port, start_server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DOCS = Path(__file__).resolve().parent


def open_tab(page: Page, name: str) -> None:
    page.get_by_role("tab", name=name).click()
    page.wait_for_timeout(1500)  # plotly draws after the tab is shown


def shoot(runs: Path, out: Path = DOCS) -> list[Path]:
    port = free_port()
    server = start_server(runs, port)
    shots = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            page.locator(".js-plotly-plot .scatterlayer .point").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            shots.append(out / "frontier.png")
            page.screenshot(path=shots[-1], full_page=True)
            for tab, name in (("Plan", "plan"), ("Price of memory", "pricing"), ("Live", "live"),
                              ("New search", "new_search")):
                open_tab(page, tab)
                if name == "pricing":  # a small GPU makes the memory/price trade-off visible on a tiny model
                    box = page.get_by_label("GPU memory (GB)")
                    box.fill("0.004")
                    box.press("Enter")
                    page.wait_for_timeout(2500)
                shots.append(out / f"{name}.png")
                page.screenshot(path=shots[-1], full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    return shots


def main() -> None:
    if len(sys.argv) > 1:
        runs = Path(sys.argv[1])
    else:
        import subprocess

        runs = Path(tempfile.mkdtemp(prefix="ckpt-screens-"))
        subprocess.run([sys.executable, "-m", "search.run", "--workload", "gpt/tiny?n_layer=8", "--no-progress",
                        "--out", str(runs), "--name", "gpt-tiny-demo"], cwd=ROOT, check=True)
    for p in shoot(runs):
        print(p)


if __name__ == "__main__":
    main()

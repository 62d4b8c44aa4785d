"""The README's numbers are the ones the result files hold: its block is generated, never typed."""

from __future__ import annotations

from pathlib import Path

from bench.common import RESULTS_DIR, read_results
from bench.readme_numbers import BEGIN, END, block_of, render

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_block_is_what_the_results_give() -> None:
    block = block_of((ROOT / "README.md").read_text())
    assert block is not None, f"README.md lost its generated block ({BEGIN} ... {END})"
    assert block == render(read_results(RESULTS_DIR)), "README numbers differ from bench/results: run python bench/report.py"


def test_a_changed_figure_is_caught() -> None:
    results = read_results(RESULTS_DIR)
    before = render(results)
    results["search_quality"]["workloads"][0]["methods"]["random"]["hypervolume"] += 0.1
    assert render(results) != before, "a changed result must change the block"

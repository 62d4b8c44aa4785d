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
    results["chains"]["workloads"][0]["peaks_bytes"]["chain where units chain"] += 2**20
    assert render(results) != before, "a changed result must change the block"


def test_the_throughput_row_follows_the_results_and_the_launch_bound_gpu_run_stays_in_benchmarks() -> None:
    """One throughput row, the CPU search's; the first GPU run (launch-bound toy sizes) is BENCHMARKS.md's only."""
    results = read_results(RESULTS_DIR)
    rows = [line for line in render(results).splitlines() if line.startswith("| Fastest (plan, micro-batch)")]
    assert len(rows) == 1 and "throughput.json" in rows[0] and "gpu_throughput" not in render(results)
    results["throughput"]["workloads"][0]["search"]["caps"][0]["ours_over_best_peer"] = 0.5
    assert "0.50x to " in render(results)

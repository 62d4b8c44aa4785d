"""Each benchmark script runs end to end on its ``--quick`` config and writes a valid result.

The scripts run as a user runs them (``python bench/<name>.py``), writing into a temporary
folder; the checks are on the numbers each result must hold whatever the machine's speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def load(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text())
    machine = result["machine"]
    assert machine["cpu_count"] >= 1 and machine["torch_version"] == torch.__version__
    assert {"cpu_model", "torch_threads", "device"} <= set(machine)
    return result


@pytest.fixture(scope="module")
def premium_result(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("results") / "premium.json"
    run_bench("premium.py", "--quick", "--out", str(out))
    return out


def test_premium_quick(premium_result: Path) -> None:
    result = load(premium_result)
    assert [w["architecture"] for w in result["workloads"]] == ["transformer", "cnn", "rnn"]
    for w in result["workloads"]:
        full = w["uniform"]["all"]
        # recomputing every unit frees activations; parameters and AdamW state stay, so the
        # saving of the whole peak is smaller than that of its activation part
        assert 0 < full["peak_saving"] < full["activation_saving"] < 1
        assert w["baseline"]["activation_saving"] == 0 and w["baseline"]["slowdown"] == 0
        assert set(w["targets"]) == {"30%", "50%", "70%"}
        for t in w["targets"].values():
            assert t["reachable"] == ("searched" in t)
            if t["reachable"]:  # targets are of the whole peak by default
                assert t["searched"]["peak_saving"] >= 0.3
        assert w["cited"]["selective"]["cited_saving_pct"] == [50, 60]


@pytest.mark.slow
def test_search_quality_quick(tmp_path: Path) -> None:
    out = tmp_path / "search_quality.json"
    run_bench("search_quality.py", "--quick", "--workloads", "gpt", "--out", str(out))
    (w,) = load(out)["workloads"]
    m = w["methods"]
    budget = load(out)["settings"]["measurements"]
    assert m["random"]["evaluations"] == m["random"]["distinct_plans"] == budget
    assert m["NSGA-II"]["evaluations"] == budget
    assert 0 < m["agents (search run)"]["evaluations"] <= budget
    assert m["exact (measured)"]["ratio_to_exact"] == pytest.approx(1.0)
    for row in m.values():
        assert 0 <= row["hypervolume"] <= (1.1 - 0) * (2.0 - 0)  # inside the reference box
        assert all(p["peak_ratio"] > 0 for p in row["frontier"])
    assert w["baseline"]["peak_ratio"] == 1.0 and w["plans_in_space"] == 3 ** w["n_units"]


@pytest.mark.slow
def test_search_cost_quick(tmp_path: Path) -> None:
    out = tmp_path / "search_cost.json"
    run_bench("search_cost.py", "--quick", "--out", str(out))
    result = load(out)
    assert [r["workers"] for r in result["ppo"]] == [1, 2]
    assert all(r["env_steps_per_second"] > 0 for r in result["ppo"])
    assert result["measurements"][0]["measurements_per_second"] > 0
    for r in result["scaling"]:
        assert 1 <= r["exact_frontier_size"] <= r["n_actions"] ** r["n_units"]
        assert r["env_steps_per_second"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_gpu_without_cuda_says_so() -> None:
    proc = run_bench("gpu.py", check=False)
    assert proc.returncode == 1
    assert "no CUDA device" in proc.stderr and "Nothing was measured" in proc.stderr


def test_report_renders_results_and_names_missing_ones(premium_result: Path, tmp_path: Path) -> None:
    md, plots = tmp_path / "BENCHMARKS.md", tmp_path / "plots"
    run_bench("report.py", "--results", str(premium_result.parent), "--out", str(md), "--plots", str(plots))
    text = md.read_text()
    assert "## The checkpointing premium" in text and "| every unit recomputed |" in text
    assert "Not measured yet: run `python bench/search_quality.py`." in text
    assert "AMD" in text or "cpu" in text  # the machine line
    png = plots / "premium.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](plots/premium.png)" in text


def test_agents_scale_quick(tmp_path: Path) -> None:
    out = tmp_path / "agents_scale.json"
    run_bench("agents_scale.py", "--quick", "--out", str(out))
    result = load(out)
    assert [r["n_units"] for r in result["rows"]] == [6, 12]
    for r in result["rows"]:
        assert r["reference"] == "exact" and r["hv_ratio"] >= 0.99 and r["rules_beyond"] == {}
        assert len(r["coverage"]) == 20 and 1.0 <= r["coverage_mean"] <= 1.01
    hybrid = result["hybrid"]
    assert [r["measured"] for r in hybrid["rounds"]][0] == 1 and hybrid["rounds"][-1]["measured"] > 1
    assert hybrid["final"]["hv_ratio"] >= 0.98

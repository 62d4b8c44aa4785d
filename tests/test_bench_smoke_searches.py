"""The benchmarks that run whole searches, at quick sizes (the rest of the bench smoke tests: test_bench_smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_bench_smoke import load, run_bench


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


@pytest.mark.slow
def test_evaluator_pool_quick(tmp_path: Path) -> None:
    out = tmp_path / "evaluator_pool.json"
    run_bench("evaluator_pool.py", "--quick", "--out", str(out))
    r = load(out)
    # one round: 1 Evaluator, then 2 (later rounds turn the order by env.data.rounds.rotated, tested below)
    assert [row["evaluators"] for row in r["rounds"]] == [1, 2]
    for row in r["rounds"]:
        assert row["plans"] == 4 and row["measurements_per_minute"] > 0
        assert sum(row["per_evaluator"].values()) == 4 and len(row["per_evaluator"]) == row["evaluators"]
    assert r["speedup_2_over_1"] == pytest.approx(r["measurements_per_minute_median"]["2"]
                                                  / r["measurements_per_minute_median"]["1"])
    assert all(len(row["warm_up_steps"]) == row["evaluators"] and min(row["warm_up_steps"]) >= 4 for row in r["rounds"])
    assert [row["processes"] for row in r["plain_processes"]] == [1, 2]  # the ceiling, without Ray
    assert all(row["mean_timed_step_seconds"] < row["mean_measurement_seconds"] for row in r["plain_processes"])


@pytest.mark.slow
def test_default_run_quick(tmp_path: Path) -> None:
    out = tmp_path / "default_run.json"
    run_bench("default_run.py", "--quick", "--out", str(out))
    r = load(out)
    assert r["workload"] == "gpt/tiny" and r["clock"] == "thread-cpu" and r["wall_seconds"] > 0
    assert 0 < r["measured"] <= 12 and r["frontier"]
    from bench.views import VIEWS
    assert "The default `python -m search.run` took" in VIEWS["default_run"].summary(r)[0]


@pytest.mark.slow
def test_reported_vs_quote_quick(tmp_path: Path) -> None:
    out = tmp_path / "reported_vs_quote.json"
    run_bench("reported_vs_quote.py", "--quick", "--out", str(out))
    r = load(out)
    assert r["clock"] == "thread-cpu" and r["rounds"] == 2 and r["rows"]
    for row in r["rows"]:
        assert len(row["quoted_ratio_rounds"]) == 2 and row["quoted_peak_bytes"] == row["peak_bytes"]
        assert row["error"] == pytest.approx(row["reported_ratio"] / row["quoted_ratio"] - 1)
        assert set(row["plan"].values()) != {"keep"}  # the baseline is the yardstick, not a row
    from bench.views import VIEWS
    assert "frontier plans reported within 5%" in VIEWS["reported_vs_quote"].summary(r)[0]


@pytest.mark.slow
def test_dynamic_quick(tmp_path: Path) -> None:
    """Two searches (one per sequence length), then the same batches trained with the static plan
    of the longest shape and with DynamicPlan's choice per shape; both stay under the cap."""
    out = tmp_path / "dynamic.json"
    run_bench("dynamic.py", "--quick", "--out", str(out))
    r = load(out)
    assert r["lengths"] == [8, 16] and len(r["order"]) == r["steps"] == 8 and set(r["order"]) <= {8, 16}
    assert len(r["static"]["totals_seconds"]) == len(r["dynamic"]["totals_seconds"]) == r["rounds"] == 2
    assert r["both_under_cap"] and all(v <= r["cap_mb"] for v in r["static"]["peaks_mb"].values())
    assert r["dynamic_over_static"] == pytest.approx(r["median_seconds"]["dynamic"] / r["median_seconds"]["static"])


@pytest.mark.slow
def test_peers_default_quick(tmp_path: Path) -> None:
    """The README's first command (quick sizes), its report's verdicts beside a quote apart: every peer the report
    answered is quoted, a verdict of faster or slower says whether the quote contradicts it, and the view shows
    the run's cost in baseline steps."""
    from bench.views import markdown

    out = tmp_path / "peers_default.json"
    run_bench("peers.py", "--default", "--quick", "--out", str(out))
    r = load(out)
    (w,) = r["workloads"]
    assert w["baseline_steps"] > 0 and not w["compiled"]
    said = {p["peer"]: p for p in w["peers"]}
    quoted = {p["peer"]: p for p in w["quote"]["peers"]}
    assert set(quoted) == {name for name, p in said.items() if p.get("measured") is not None}
    for name, q in quoted.items():
        assert ("contradicted" in q) == (said[name]["verdict"] in ("faster", "slower"))
    text = markdown("peers_default", r)
    assert "baseline steps" in text and "contradicted" in text and all(name in text for name in quoted)

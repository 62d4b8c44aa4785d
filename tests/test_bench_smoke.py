"""Each benchmark script runs end to end on its ``--quick`` config and writes a valid result.

The scripts run as a user runs them (``python bench/<name>.py``), writing into a temporary
folder; the checks are on the numbers each result must hold whatever the machine's speed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from env.data.errors import CkptSearchError

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
        # every quoted plan comes from the quoting rounds alone, each measured as often as the others
        quoted = [w["baseline"], *w["rules"].values()] + [t["searched"] for t in w["targets"].values() if t["reachable"]]
        assert {q["n_measurements"] for q in quoted} == {w["quoting_rounds"]}


def test_a_quoted_plan_measured_less_than_the_rules_is_refused() -> None:
    from bench.premium import check_equal_measurements

    row = {"label": "gpt", "rules": {"all": {"n_measurements": 2}, "sqrt_n": {"n_measurements": 2}},
           "targets": {"30%": {"reachable": False},
                       "50%": {"reachable": True, "searched": {"n_measurements": 2}}}}
    check_equal_measurements(row)
    row["targets"]["50%"]["searched"]["n_measurements"] = 1  # the luckiest of fewer samples
    with pytest.raises(CkptSearchError, match="quote plans measured alike"):
        check_equal_measurements(row)


def test_committed_premium_results_quote_plans_measured_alike() -> None:
    from bench.premium import check_equal_measurements

    path = ROOT / "bench" / "results" / "premium.json"
    if not path.is_file():
        pytest.skip("no premium results committed yet: python bench/premium.py")
    for w in json.loads(path.read_text())["workloads"]:
        check_equal_measurements(w)




@pytest.mark.slow
def test_the_search_quality_summary_says_so_where_the_exact_plans_span_no_hypervolume() -> None:
    """A quick run at load can measure the exact solver's plans all beyond the reference point: no ratio to print."""
    from bench.views.search import AGENTS_OWN, search_quality_summary

    methods = {k: {"hypervolume": 0.1, "evaluations": 5} for k in ("random", "agents (search run)", "NSGA-II", "rules")}
    methods[AGENTS_OWN] = {"ratio_to_exact": None}
    line, = search_quality_summary({"workloads": [{"workload": "gpt", "n_units": 4, "methods": methods}]})
    assert "span no hypervolume" in line and "None" not in line
    methods[AGENTS_OWN] = {"ratio_to_exact": 0.97}
    assert "their own plans 0.970 of the exact solver's" in search_quality_summary(
        {"workloads": [{"workload": "gpt", "n_units": 4, "methods": methods}]})[0]






@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="needs the hf extra")
def test_units_table_quick(tmp_path: Path) -> None:
    out = tmp_path / "units_table.json"
    run_bench("units_table.py", "--quick", "--rows", "examples/unet_skips.py:build", "hf/t5", "--out", str(out))
    rows = load(out)["rows"]
    assert [r["workload"].split("?")[0] for r in rows] == ["examples/unet_skips.py:build", "hf/t5"]
    for r in rows:
        assert r["auto"]["coverage"] >= 0.95 and r["auto"]["n_units"] >= 2
        assert r["blocks"]["coverage"] < r["auto"]["coverage"]
        assert r["auto"]["peak_mb"] <= r["peak_mb_keep"]


def test_warmup_quick(tmp_path: Path) -> None:
    out = tmp_path / "warmup.json"
    run_bench("warmup.py", "--quick", "--out", str(out))
    got = load(out)
    assert [(r["micro_batch"], r["plan"]) for r in got["rows"]] == [
        (2, "all keep"), (2, "recompute everything"), (2, "every 2nd recomputed")]
    for r in got["rows"]:  # one round of two timed steps, with one warm-up step and with two
        assert r["measurements"] == 1 and set(r["first_ms"]) == {"1", "2"} and r["first_ms"]["1"] > 0
        assert 0.2 < r["first_over_rest_one_warmup"] < 5 and 0.2 < r["one_over_two_warmups"] < 5
    peaks = got["peak_rows"]  # the peak alone, one warm-up step against none: the same bytes, each plan and peer
    assert {(r["micro_batch"], r["item"]) for r in peaks} >= {(1, "all keep"), (3, "recompute everything")}
    assert any(r["item"].startswith("checkpoint-sequential") for r in peaks)
    assert all(r["same_bytes"] and r["measurements"] == 1 and r["peak_mib"] > 0 for r in peaks)




@pytest.mark.slow
def test_compiled_search_quick(tmp_path: Path) -> None:
    """The only end-to-end ``--compile`` search in the suite: units compiled once each, plans measured compiled."""
    out = tmp_path / "compiled_search.json"
    run_bench("compiled_search.py", "--quick", "--out", str(out))
    r = load(out)
    [row] = r["rows"]
    assert row["mode"] == "compiled" and row["clock"] == "thread-cpu" and 0 < row["measured"] <= 8
    assert row["frontier"] and row["lowest"]["peak_bytes"] < row["baseline"]["peak_bytes"]
    assert r["command_compiled"].endswith("--compile --compile-scope units") and r["wall_ratio_median"] is None
    from bench.views import VIEWS
    assert VIEWS["compiled_search"].summary(r)[0].startswith("`--compile` measured")




@pytest.mark.slow
def test_peers_quick(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    run_bench("peers.py", "--quick", "--out", str(out))
    w = load(out)["workloads"][0]
    names = {p["peer"] for p in w["peers"]}
    assert {"compile-budget-0.0", "compile-budget-1.0"} <= names and any(n.startswith("checkpoint-sequential") for n in names)
    for p in w["peers"]:  # search.records.peer_verdicts: against ours at no more memory, compare_times' verdict
        if p["measured"] and p["ours"]:
            assert p["ours"]["peak_bytes"] <= p["measured"]["peak_bytes"]
            assert p["ratio"] == pytest.approx(p["measured"]["step_seconds"] / p["ours"]["step_seconds"])
    q = w["quote"]  # fresh measurements: every quoted plan timed alike, ours selected on the search's
    assert q["samples_per_plan"] == 1 and q["baseline"]["samples"] == 1
    assert {p["peer"] for p in q["peers"]} == {p["peer"] for p in w["peers"] if p["measured"]}
    for p in q["peers"]:
        assert p["samples"] == 1
        if p["ours"] is not None:
            # auto-SAC too: the quote installs the decisions the search made (its peak once moved below ours where
            # the quote's process decided again, from op times measured on this CPU)
            assert p["ours"]["samples"] == 1 and p["ours"]["fits"], p
            assert p["time_ratio_peer_over_ours"] == pytest.approx(p["step_seconds"] / p["ours"]["step_seconds"])
    kept = {p["peer"]: p["gradients_kept"] for p in q["peers"]}  # checked, dropout on
    assert kept["compile-budget-1.0"] and all(v for n, v in kept.items() if n.startswith("checkpoint-sequential"))
    assert not kept["compile-budget-0.0"]  # torch 2.13 (pytorch/pytorch#190758; tests/test_peers.py's xfail)
    from bench.views import markdown
    assert "compile-budget-0.0" in markdown("peers", load(out))
    from env.measure.auto_sac import missing
    if missing() is None:  # PyTorch's auto-SAC at the same budgets, its estimates beside the measured figures
        quoted = {p["peer"]: p for p in q["peers"]}
        low, full = quoted["auto-sac-0.0"]["auto_sac"], quoted["auto-sac-1.0"]["auto_sac"]
        assert kept["auto-sac-0.0"] and kept["auto-sac-1.0"]
        assert low["modules"] and not full["modules"] and full["estimated_saving"] == 0.0
        assert low["estimated_peak_bytes"] < full["estimated_peak_bytes"] == full["estimated_unplanned_peak_bytes"]
        assert low["measured_saving"] > 0 and quoted["auto-sac-0.0"]["peak_bytes"] < q["baseline"]["peak_bytes"]
        assert "auto-SAC's estimates against the measurement" in markdown("peers", load(out))


def test_interleaved_rounds_rotate_who_goes_first_and_merge_each_plans_samples() -> None:
    from env.data.rounds import interleaved, rotated
    from env.data.measured import MeasuredPlan

    assert [rotated("abc", r)[0] for r in range(4)] == ["a", "b", "c", "a"] and rotated([], 3) == []
    order: list[str] = []

    def job(name: str, seconds: float):
        def run() -> MeasuredPlan:
            order.append(name)
            return MeasuredPlan(workload="w", batch_shape="b", digest=name, actions=["keep"], peak_bytes=1,
                                live_before_bytes=0, step_seconds_samples=[seconds + len(order)],
                                clock="thread-cpu", device="cpu", torch_version="t", measurement_ids=[str(len(order))])
        return run

    got = interleaved({"a": job("a", 0.0), "b": job("b", 0.0)}, rounds=2)
    assert order == ["a", "b", "b", "a"] and list(got) == ["a", "b"]
    assert got["a"].step_seconds_samples == [1.0, 4.0] and got["b"].step_seconds_samples == [2.0, 3.0]


def test_a_peer_quote_timed_unequally_is_refused() -> None:
    from bench.measuring import check_equal_samples
    from env.data.measured import MeasuredPlan

    def rec(samples: list[float]) -> MeasuredPlan:
        return MeasuredPlan(workload="w", batch_shape="b", digest="d", actions=["keep"], peak_bytes=1,
                            live_before_bytes=0, step_seconds_samples=samples, clock="thread-cpu", device="cpu",
                            torch_version="t")

    assert check_equal_samples([rec([1.0, 1.1]), rec([0.9, 1.0])], "w") == 2
    with pytest.raises(CkptSearchError, match="quote plans measured alike"):  # ours: the luckiest of fewer samples
        check_equal_samples([rec([1.0, 1.1]), rec([0.9])], "w")


def test_committed_peer_quotes_time_every_plan_alike() -> None:
    for name in ("peers", "peers_compiled"):
        path = ROOT / "bench" / "results" / f"{name}.json"
        if not path.is_file():
            continue
        for w in json.loads(path.read_text())["workloads"]:
            q = w["quote"]
            counts = {q["baseline"]["samples"]} | {p["samples"] for p in q["peers"]}
            counts |= {p["ours"]["samples"] for p in q["peers"] if p["ours"] is not None}
            assert counts == {q["samples_per_plan"]}, f"{name}: {w['workload']}"


def test_a_compile_budget_beside_eager_plans_is_judged_on_memory_only() -> None:
    from bench.views.peers import peers_headlines, peers_summary

    def peer(name: str, ratio: float) -> dict[str, Any]:  # 10 ms against ours, beyond both spreads
        return {"peer": name, "peak_bytes": 2 << 20, "step_seconds": 0.01 * ratio, "spread_seconds": 0.0001,
                "note": "", "ours": {"plan": "recompute 2", "peak_bytes": 1 << 20, "step_seconds": 0.01,
                                     "spread_seconds": 0.0001, "fits": True},
                "time_ratio_peer_over_ours": ratio, "beyond_spread": True}

    quote = {"peers": [peer("compile-budget-0.5", 0.8), peer("checkpoint-sequential-2", 0.9)],
             "samples_per_plan": 6, "load_average_1": 1.0}
    for compiled, slower in ((False, 1), (True, 2)):  # eager: only checkpoint_sequential's time is tallied
        r = {"workloads": [{"workload": "w", "compiled": compiled, "clock": "thread-cpu", "quote": quote}],
             "machine": {}, "written_at": "now"}
        assert f"slower than {slower} " in peers_summary(r)[0]
        assert f"slower than {slower}" in peers_headlines(r)[0].figure
    assert "judged on memory only (their times beside our eager ones: faster beyond both spreads in 1)" in \
        peers_summary({**r, "workloads": [{**r["workloads"][0], "compiled": False}]})[0]


def test_checking_the_gradients_of_a_results_file_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    proc = run_bench("peers.py", "--gradients-only", "--out", str(tmp_path / "none.json"), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "none.json does not exist; run the bench that writes it first" in lines[0]


def test_a_peer_faster_only_with_other_gradients_is_shown_but_does_not_win() -> None:
    from bench.views.peers import peers_headlines, peers_summary, peers_table

    def peer(name: str, ratio: float, kept: bool) -> dict[str, Any]:  # 10 ms against ours, beyond both spreads
        return {"peer": name, "peak_bytes": 2 << 20, "step_seconds": 0.01 * ratio, "spread_seconds": 0.0001,
                "note": "", "ours": {"plan": "recompute 2", "peak_bytes": 1 << 20, "step_seconds": 0.01,
                                     "spread_seconds": 0.0001, "fits": True},
                "time_ratio_peer_over_ours": ratio, "beyond_spread": True, "gradient_error": 0.0 if kept else 0.7,
                "gradients_kept": kept}

    quote = {"peers": [peer("compile-budget-0.5", 0.9, False), peer("checkpoint-sequential-2", 0.95, True)],
             "samples_per_plan": 6, "load_average_1": 1.0, "rounds": 2,
             "baseline": {"peak_bytes": 3 << 20, "step_seconds": 0.01, "spread_seconds": 0.0001}}
    r = {"workloads": [{"workload": "w", "compiled": True, "clock": "thread-cpu", "quote": quote}],
         "machine": {}, "written_at": "now"}
    summary = peers_summary(r)[0]
    assert "slower than 2 (peers that win: checkpoint-sequential-2 0.95x; faster but with gradients that differ " \
           "from the unplanned model's: compile-budget-0.5 0.90x)" in summary
    assert "slower than 2 (1 of them with gradients that differ" in peers_headlines(r)[0].figure
    assert "peer faster; its gradients differ from the unplanned model's (error 0.7)" in peers_table(r)
    quote["peers"] = [peer("compile-budget-0.5", 0.9, False)]
    assert "(peers that win: none; faster but" in peers_summary(r)[0]


@pytest.mark.slow
def test_agents_search_quick(tmp_path: Path) -> None:
    out = tmp_path / "agents_search.json"
    run_bench("agents_search.py", "--quick", "--out", str(out))
    row = load(out)["rows"][0]
    assert row["units"] == 5 and row["measured"] <= 12  # gpt/tiny: 4 blocks and the loss unit lm_loss and row["hv_agents_own"] > 0 and not row["warm_start"]
    assert row["agents_over_exact"] == pytest.approx(row["hv_agents_own"] / row["hv_exact_measured"])
    q = row["quote"]  # the quote: fresh measurements, every plan timed alike (one round of 3 steps here)
    # as many exact plans as the agents' frontier has, or the whole exact frontier when it has fewer
    assert q["samples_per_plan"] == 3 and q["exact_plans"] == min(q["agents_plans"], q["exact_frontier_plans"]) >= 1
    assert q["control_plans"] == q["exact_plans"] and row["control"]["hv_ratio"] > 0  # the exact plans quoted twice
    assert row["commit"] and len(row["quoted"]["control"]) == q["exact_plans"]
    assert all(len(p["step_seconds_samples"]) == 3 for p in row["quoted"]["agents"])
    assert len(row["coverage"]) == 20 and row["expert"]["units"] == 4
    assert all(c["budget_bytes"] <= row["baseline"]["peak_mb"] * 2 ** 20 for c in row["coverage"])
    assert row["quote_noise"] is not None and set(row["rules_beyond_noise"]) <= set(row["rules_beyond_agents"])
    assert set(row["rules_beyond_by"]) == set(row["rules_beyond_agents"])
    assert set(row["rules_beyond_confirmed"]) <= set(row["rules_beyond_noise"])  # the second quote's verdict
    assert set(row["rules_confirmed_by"]) <= set(row["rules_beyond_noise"])


def test_the_second_quote_measures_each_flagged_rule_beside_the_agents_plan_it_was_compared_with() -> None:
    sys.path.insert(0, str(ROOT))
    from agents.baselines import baseline_rules
    from bench.agents_search import _fastest, _samples, analyse, confirm
    from bench.measuring import Ledger
    from env.data.plan import Action
    from search.engine.evaluator import Evaluator

    ev = Evaluator("gpt/tiny", 0, [], ["keep", "recompute"], repeats=2, device="cpu", threads=1, name="quote")
    first = Ledger(ev.evaluate, [Action.KEEP, Action.RECOMPUTE])
    rules = {k: tuple(v) for k, v in baseline_rules(len(ev.units), first.actions).items() if k in ("none", "all")}
    agents = [rules["all"], (1,) + (0,) * (len(ev.units) - 1)]
    for p in [*agents, rules["none"]]:
        first.measure(p, "quote")
    quoted = {"agents": [_samples(first.records[p]) for p in agents], "exact": [], "control": [],
              "rules": {n: _samples(first.records[p]) for n, p in rules.items()}}
    # as if the first quote had put the baseline beyond the agents' frontier by more than its noise
    found = {"rules_beyond_noise": ["none"], "rules_beyond_by": {"none": 0.05}}
    again = confirm({"evaluator": ev, "ledger": first, "rules": rules}, agents, quoted, found, rounds=2)
    assert list(again) == ["none"]  # the rule, beside the agents' plan the first quote ranked fastest at its memory
    assert again["none"]["agents"]["digest"] == _fastest(quoted["agents"], quoted["rules"]["none"]["peak_bytes"])["digest"]
    assert again["none"]["rule"]["digest"] == quoted["rules"]["none"]["digest"]
    # fresh measurements, as many for each: 2 rounds of 2 steps, none of the first quote's
    assert [len(again["none"][k]["step_seconds_samples"]) for k in ("agents", "rule")] == [4, 4]
    assert not set(again["none"]["rule"]["step_seconds_samples"]) & set(quoted["rules"]["none"]["step_seconds_samples"])
    verdict = analyse({**quoted, "confirmation": again})  # no control here: no band, so only what no agent plan fits
    assert verdict["rules_confirmed_by"]["none"] > -1 and verdict["rules_beyond_confirmed"] == []


def _quoted(peak: int, *seconds: float) -> dict[str, Any]:
    return {"digest": f"p{peak}-{seconds[0]}", "peak_bytes": peak, "step_seconds_samples": list(seconds)}


def test_a_row_is_analysed_from_its_samples_against_the_quotes_own_noise(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.agents_search import analyse, reanalyse

    quoted = {  # two agent plans; the exact plans, and their copies 1% and 2% off: a noise band of about 2%
        "agents": [_quoted(10, 1.0, 1.01, 0.99), _quoted(20, 0.8, 0.81, 0.79)],
        "exact": [_quoted(10, 1.0, 1.0, 1.0), _quoted(20, 0.7, 0.7, 0.7)],
        "control": [_quoted(10, 1.01, 1.01, 1.01), _quoted(20, 0.714, 0.714, 0.714)],
        "rules": {"none": _quoted(30, 0.5, 0.5, 0.5),  # faster than every agent plan by far
                  "close": _quoted(20, 0.79, 0.79, 0.79),  # faster than agent plan 20 by 1.3%: within the noise
                  "small": _quoted(5, 1.5, 1.5, 1.5),  # no agent plan fits its memory
                  "slow": _quoted(20, 0.9, 0.9, 0.9)},  # dominated by agent plan 20
        "expert": _quoted(20, 0.9, 0.9, 0.9)}
    a = analyse(quoted)
    assert a["quote_noise"] == pytest.approx(0.0194, abs=1e-3)
    assert a["rules_beyond_agents"] == ["none", "close", "small"]
    assert a["rules_beyond_by"]["none"] == pytest.approx(0.6) and a["rules_beyond_by"]["small"] is None
    assert a["rules_beyond_noise"] == ["none", "small"]
    cov = {c["budget_bytes"]: c for c in a["coverage"]}
    assert len(cov) == 20 and min(cov) == 5 and max(cov) == 30
    assert cov[5]["agents_seconds"] is None and "agents_over_exact" not in cov[5]
    assert cov[10]["agents_over_exact"] == pytest.approx(1.0) and cov[10]["beyond_noise"] is False
    assert cov[30]["agents_over_exact"] == pytest.approx(0.8 / 0.7) and cov[30]["beyond_noise"] is True
    # without a control there is no noise to judge by: the rules beyond are listed, none "beyond the noise"
    # but those no agent plan fits
    bare = analyse({**quoted, "control": []})
    assert bare["quote_noise"] is None and bare["rules_beyond_noise"] == ["small"]
    assert bare["coverage"][-1]["beyond_noise"] is None
    assert "rules_beyond_confirmed" not in a  # quoted once: no second quote to confirm by
    # the second quote: a rule counts as beyond only where it measures beyond the band again ("near": 6.7%
    # in the first quote, 0.7% in the second); one no agent plan fits stays beyond, with nothing to measure
    twice = {**quoted, "rules": {**quoted["rules"], "near": _quoted(20, 0.75, 0.75, 0.75)},
             "confirmation": {"none": {"agents": _quoted(30, 0.8, 0.8, 0.8), "rule": _quoted(30, 0.5, 0.52, 0.5)},
                              "near": {"agents": _quoted(20, 0.76, 0.75, 0.77), "rule": _quoted(20, 0.755, 0.75, 0.76)}}}
    b = analyse(twice)
    assert b["rules_beyond_noise"] == ["none", "small", "near"]
    assert b["rules_confirmed_by"]["near"] == pytest.approx(0.76 / 0.755 - 1)
    assert b["rules_beyond_confirmed"] == ["none", "small"]
    from bench.views.agents import rules_beyond
    assert rules_beyond(b)[1] == ("none (the baseline), small in both quotes; within it in the second quote: "
                                  "near (agents +0.7% there)")
    assert rules_beyond(a)[1] == "none (the baseline), small"
    # --reanalyse: the same figures from the result file, the spread-based keys of old rows gone
    path = tmp_path / "agents_search.json"
    path.write_text(json.dumps({"rows": [{"quoted": quoted, "rules_beyond_margin": {}, "control": {"beyond_spread": 1}},
                                         {"flags": "quoted before samples were kept"}]}))
    assert reanalyse(path) == 1
    rows = json.loads(path.read_text())["rows"]
    assert {k: rows[0][k] for k in a} == json.loads(json.dumps(a)) and "rules_beyond_margin" not in rows[0]
    assert rows[0]["control"] == {} and rows[1] == {"flags": "quoted before samples were kept"}


def test_the_quote_mixes_the_groups_it_compares_and_turns_each_round() -> None:
    from env.data.rounds import serpentine
    from bench.measuring import evenly_mixed

    assert evenly_mixed("abc", "ABC", "xy") == ["a", "A", "x", "b", "B", "y", "c", "C"]
    assert evenly_mixed([1, 2, 3, 4], [], ["e"]) == [1, 2, "e", 3, 4]  # the lone item in the middle
    assert serpentine([1, 2, 3], 0) == [1, 2, 3] and serpentine([1, 2, 3], 1) == [3, 2, 1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_gpu_without_cuda_says_so() -> None:
    proc = run_bench("gpu.py", check=False)
    assert proc.returncode == 1
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr  # one line, nothing else
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





def _counting_bench() -> tuple[Any, Any]:
    """A benchmark whose rows are named by ``id``; each run measures the ids it is given."""
    from bench.harness import Bench, Run

    def options(ap: Any) -> None:
        ap.add_argument("--ids", nargs="+", default=["a", "b"])
        ap.add_argument("--value", type=int, default=1)

    def measure(run: Run) -> None:
        for i in run.args.ids:
            run.add_row({"id": i, "value": run.args.value})

    return Bench("counting", "A benchmark of nothing.", options, quick={"value": 7}, rows="rows",
                 row_id=lambda r: r["id"]), measure


def test_append_keeps_the_rows_a_run_does_not_measure_and_files_the_replaced_ones_as_history(tmp_path: Path) -> None:
    from bench.harness import main

    bench, measure = _counting_bench()
    out = tmp_path / "counting.json"
    main(bench, measure, ["--ids", "a", "b", "c", "--out", str(out)])
    first = json.loads(out.read_text())
    assert [r["id"] for r in first["rows"]] == ["a", "b", "c"] and first["settings"]["value"] == 1
    main(bench, measure, ["--ids", "b", "--value", "2", "--append", "--out", str(out)])
    second = json.loads(out.read_text())
    # b measured again in its place; a and c kept with the machine and date they were measured on
    assert [(r["id"], r["value"]) for r in second["rows"]] == [("a", 1), ("b", 2), ("c", 1)]
    assert second["rows"][0]["written_at"] == first["written_at"] and "machine" in second["rows"][0]
    assert "written_at" not in second["rows"][1]  # this run's row: the file's machine line is its own
    (history,) = second["earlier_runs"]
    assert history["written_at"] == first["written_at"] and [r["id"] for r in history["rows"]] == ["b"]
    main(bench, measure, ["--ids", "d", "--out", str(out)])  # without --append: this run's rows alone
    assert [r["id"] for r in json.loads(out.read_text())["rows"]] == ["d"]


def test_quick_sets_what_the_bench_declares_and_a_bad_input_ends_in_one_line(tmp_path: Path) -> None:
    from bench.harness import parse

    bench, _ = _counting_bench()
    assert parse(bench, ["--quick"]).value == 7 and parse(bench, []).value == 1
    assert "--value 7" in bench.parser().format_help()  # --help says what --quick sets
    sys.path.insert(0, str(ROOT))
    from bench import measured_table
    from bench.harness import main

    out = tmp_path / "m.json"
    with pytest.raises(SystemExit) as stop:
        main(measured_table.BENCH, measured_table.measure, ["--repeats", "1", "--rounds", "2", "--out", str(out)])
    assert str(stop.value) == ("bench/measured_table.py: --repeats 1 x --rounds 2 gives fewer than 5 timed steps; "
                               "raise either") and not out.exists()


def test_the_readme_table_is_short_and_every_row_links_its_file_and_an_existing_section() -> None:
    import re

    from bench.common import RESULTS_DIR, read_results
    from bench.readme_numbers import render

    results = read_results(RESULTS_DIR)
    block = render(results)
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert 8 <= len(rows) <= 10
    md = (ROOT / "BENCHMARKS.md").read_text()  # generated from the same results with the README's block
    anchors = {re.sub(r"[^\w\- ]", "", h.lstrip("#").strip().lower()).replace(" ", "-")
               for h in md.splitlines() if re.match(r"#{2,4} ", h)}  # a GPU section's rows link its ### heading
    for line in rows:
        (path,) = re.findall(r"\]\((bench/results/\w+\.json)\)", line)
        (anchor,) = re.findall(r"\(BENCHMARKS\.md#([\w-]+)\)", line)
        assert (ROOT / path).is_file() and anchor in anchors, line


def test_benchmark_scripts_import_no_readme_renderer_nor_tests_and_define_no_memory_unit() -> None:
    import ast

    for path in sorted((ROOT / "bench").rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m == "tests" or m.startswith("tests.") for m in imported), path
        if path.name not in ("report.py", "readme_numbers.py"):
            assert "bench.readme_numbers" not in imported, path
        assigned = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert not assigned & {"MIB", "MB", "MiB"}, f"{path}: use env.data.types.MIB"


def test_random_plans_are_distinct_seeded_and_the_whole_space_when_it_is_small() -> None:
    from bench.measuring import random_plans

    assert random_plans(2, 2, 10, seed=0) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    plans = random_plans(6, 3, 20, seed=1)
    assert len(set(plans)) == 20 and all(len(p) == 6 and set(p) <= {0, 1, 2} for p in plans)
    assert plans == random_plans(6, 3, 20, seed=1) != random_plans(6, 3, 20, seed=2)


@pytest.mark.slow
def test_chains_quick(tmp_path: Path) -> None:
    out = tmp_path / "chains.json"
    run_bench("chains.py", "--quick", "--out", str(out))
    (w,) = load(out)["workloads"]
    assert w["units"] == 32 and w["links"] == 16
    peaks = w["peaks_bytes"]
    assert peaks["chain where units chain"] <= peaks["recompute every unit"] < peaks["keep every unit"]
    by = {(s["chain"], s["relative"]): s for s in w["solver"]}
    assert by[(True, 0.0)]["lowest_predicted_peak_bytes"] <= by[(False, 0.0)]["lowest_predicted_peak_bytes"]


@pytest.mark.slow
def test_store_writes_study_quick(tmp_path: Path) -> None:
    """The study counts what a throughput search writes: every measurement is a row of ``evaluations`` (inserted,
    then updated as repeats merge into it), and no result blob is rewritten into ``meta``."""
    out = tmp_path / "writes.json"
    run_bench("studies/store_writes.py", "--quick", "--out", str(out))
    got = json.loads(out.read_text())
    assert got["exit_code"] == 0 and got["write_statements"] > 0 and got["rows_changed"] >= got["write_statements"] // 2
    assert got["sql_bytes_written"] > 0 and got["store_bytes"] > 0
    assert {"INSERT evaluations", "UPDATE evaluations"} <= set(got["by_table"]), got["by_table"]

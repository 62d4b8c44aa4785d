"""bench/gpu.py's dry run, end to end on the CPU: every step at tiny sizes, each result written as it ends.

The GPU run is the same script with the realistic sizes; what only a GPU can run (the gpu tests) is recorded
as skipped with its reason here, and pytest's failure text is read from a real pytest run's report.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench.common import ROOT, BenchError
from bench.gpu import CPU_CLOCK, DEFAULT_STEPS, DRY_RUN, junit_cases, main
from bench.peers import check_device, run_row
from env.data.types import MIB


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def summary_once(out: Path, proc: subprocess.Popen, done: str) -> dict:
    """The summary as it stands the first time step ``done`` is no longer pending (polled while the run goes)."""
    path = out / "gpu_summary.json"
    while proc.poll() is None:
        try:
            now = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or caught midway through a write
            now = {}
        if now.get("steps", {}).get(done, {}).get("status", "pending") != "pending":
            return now
        time.sleep(0.1)
    raise AssertionError(f"the run ended (exit {proc.returncode}) before its summary showed {done} done")


@pytest.mark.slow
def test_the_dry_run_writes_every_step_as_it_ends(tmp_path: Path) -> None:
    out = tmp_path / "out"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "bench/gpu.py", "--dry-run", "--out-dir", str(out),
                             "--runs", str(tmp_path / "runs")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    midway = summary_once(out, proc, "premium")  # written after the premium step, before the peers ran
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert midway["steps"]["premium"]["status"] == "ok" and midway["steps"]["peers"] == {"status": "pending"}
    assert (out / "gpu_premium.json").is_file() and read(out / "gpu_premium.json")["written_at"] <= midway["written_at"]

    summary = read(out / "gpu_summary.json")
    assert list(summary["steps"]) == DEFAULT_STEPS and summary["all_ok"] and summary["dry_run"]
    assert summary["steps"]["tests"] == {"status": "skipped", "gpu_only": True,
                                         "why": "needs CUDA; this run measures on cpu"}
    assert not (out / "gpu_tests.json").exists()
    results = {}
    for step in ("premium", "peers", "throughput"):
        assert summary["steps"][step]["status"] == "ok" and summary["steps"][step]["result"] == f"gpu_{step}.json"
        results[step] = r = read(out / f"gpu_{step}.json")
        assert r["clock"] == CPU_CLOCK and r["device"].endswith("(cpu)") and r["machine"]["device"].startswith("cpu")
    assert results["premium"]["written_at"] <= results["peers"]["written_at"] <= results["throughput"]["written_at"]

    premium = results["premium"]["workloads"][0]
    assert premium["workload"] == DRY_RUN.workload and premium["clock"] == "thread-cpu"
    peers = results["peers"]["workloads"][0]  # quoted apart, on the device the search ran on
    assert peers["workload"] == DRY_RUN.workload and peers["search"]["device"] == "cpu"
    assert peers["device"].startswith("cpu") and peers["quote"]["samples_per_plan"] >= 1
    assert {p["peer"] for p in peers["quote"]["peers"]} and "--peers eager" in peers["command"]
    assert results["peers"]["search"]["command"] == peers["command"]
    curve = results["throughput"]["workloads"][0]["search"]
    assert curve["micro_batches"] == DRY_RUN.micro_batches and len(curve["caps"]) == 2
    wanted = [f * peers["baseline"]["peak_bytes"] for f in DRY_RUN.cap_fractions]  # of the peers search's baseline
    assert [c["cap_bytes"] for c in curve["caps"]] == pytest.approx(wanted, abs=MIB / 1000)
    assert all(c["answer"] is not None for c in curve["caps"])
    print(f"dry run: {time.perf_counter() - t0:.0f} s")


def test_a_failed_tests_text_is_kept_from_pytests_report(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text("import pytest\n\ndef test_fine():\n    assert True\n\n"
                                          "def test_wrong():\n    assert 1 + 1 == 3, 'arithmetic'\n\n"
                                          "@pytest.mark.skip(reason='not here')\ndef test_later():\n    pass\n")
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}",
                    str(tmp_path / "test_two.py")], cwd=tmp_path, capture_output=True, timeout=120)
    cases = {c["test"].split("::")[-1]: c for c in junit_cases(junit)}
    assert [cases[n]["outcome"] for n in ("test_fine", "test_wrong", "test_later")] == ["passed", "failure",
                                                                                        "skipped"]
    assert "longrepr" not in cases["test_fine"]
    assert "assert 1 + 1 == 3" in cases["test_wrong"]["longrepr"] and "arithmetic" in cases["test_wrong"]["message"]
    assert "not here" in cases["test_later"]["longrepr"] + cases["test_later"]["message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs the GPU steps")
def test_a_device_it_cannot_measure_on_is_refused_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cuda"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0] and "--dry-run" in err[0]
    assert main(["--device", "tpu"]) == 1
    assert "--device tpu: give cuda, cuda:N or cpu" in capsys.readouterr().err


def test_peers_are_quoted_only_from_a_run_folder_on_the_device_it_ran_on(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="give the folder of a search run"):
        run_row(tmp_path, "python -m search.run", None)
    row = {"workload": "gpt/gpt2", "device": "NVIDIA H100 80GB HBM3"}
    check_device(row, "NVIDIA H100 80GB HBM3")
    with pytest.raises(BenchError, match="the search measured on NVIDIA H100 80GB HBM3, this quote on cpu"):
        check_device(row, "cpu (1 threads)")

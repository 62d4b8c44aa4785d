"""bench/gpu.py's results and the report's GPU section, without a GPU (the GPU run itself is bench/gpu.py).

The section appears only when gpu_*.json results exist, and each names its device and clock.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from bench import fidelity, report
from bench.gpu import CLOCK, gpu_test_files, main, run, write_gpu_result
from bench.views.gpu import gpu_summary_line

ROWS = [{"peak_error": e, "time_error": 2 * e, "time_ratio_error": e / 2, "relative_spread": 0.01}
        for e in (0.001, -0.02, 0.004)]
OFFLOAD_ROW = {"peak_bytes": 10, "activation_bytes": 6, "step_seconds": 0.02, "spread_seconds": 0.001,
               "n_timed_steps": 9}


def write_gpu_results(folder: Path) -> None:
    cases = [{"test": "tests.test_gpu::test_a", "outcome": "passed", "seconds": 1.0},
             {"test": "tests.test_gpu::test_b", "outcome": "failure", "seconds": 2.0}]
    write_gpu_result("tests", {"exit_code": 1, "passed": 1, "failed": 1, "skipped": 0, "tests": cases,
                               "output_tail": ""}, "cuda", folder)
    write_gpu_result("fidelity", {"workloads": [{"workload": "gpt", "n_plans": 3, **fidelity.summary(ROWS)}]},
                     "cuda", folder)
    rows = [{"plan": p, **OFFLOAD_ROW, "peak_saving": s, "activation_saving": 2 * s, "slowdown": t}
            for p, s, t in (("keep", 0.0, 0.0), ("offload", 0.3, 0.04), ("offload, blocking (save_on_cpu)", 0.3, 0.4))]
    write_gpu_result("offload", {"workloads": [{"workload": "gpt", "batch_shape": "0:8x256", "n_units": 6,
                                                "rows": rows, "offloaded_bytes_per_step": 3 << 30}]}, "cuda", folder)
    write_gpu_result("search", {"command": "-m search.run --device cuda --out x", "exit_code": 130,
                                "stopped_at_budget": True, "wall_seconds": 100.0, "run_files": ["store.sqlite"],
                                "report_md": "# Search report\nfrontier: 7 plans", "output_tail": ""}, "cuda", folder)
    write_gpu_result("summary", {"steps": {"tests": {"status": "failed"}, "premium": {"status": "skipped",
                                                                                        "why": "only 3 s left"}},
                                 "budget_seconds": 480, "all_ok": False}, "cuda", folder)


def test_the_report_has_a_gpu_section_only_with_gpu_results(tmp_path: Path) -> None:
    results, plots = tmp_path / "results", tmp_path / "plots"
    results.mkdir()
    report.main(["--results", str(results), "--out", str(tmp_path / "cpu.md"), "--plots", str(plots)])
    assert "GPU" not in (tmp_path / "cpu.md").read_text()
    write_gpu_results(results)
    md = tmp_path / "gpu.md"
    report.main(["--results", str(results), "--out", str(md), "--plots", str(plots)])
    text = md.read_text()
    gpu = text[text.index("## On a GPU"):]
    assert "tests failed; premium skipped (only 3 s left)" in gpu
    assert gpu.count(f"Clock: {CLOCK}") == 4  # tests, fidelity, offload, search
    assert "### GPU tests" in gpu and "- failed: `tests.test_gpu::test_b`" in gpu
    assert "### Cost-model fidelity on a GPU" in gpu and "| gpt | 3 | 2.00% / 0.40% |" in gpu
    assert "](plots/gpu_fidelity.png)" in gpu and (plots / "gpu_fidelity.png").read_bytes()[:4] == b"\x89PNG"
    assert "| offload | 30% | 60% | +4.0% | 20.0 | 1.0 |" in gpu and "3072 MiB offloaded a step" in gpu
    assert "`python -m search.run --device cuda --out x`: stopped at the budget (resumable) after 100 s" in gpu
    assert "#### Search report" in gpu
    assert "### The checkpointing premium on a GPU" not in gpu  # not measured: not shown
    assert "Other results" not in text


def test_the_summary_line_names_each_steps_call_when_there_were_several() -> None:
    steps = {"tests": {"status": "ok", "run": "2026-12-04 18:06:35"},
             "fidelity": {"status": "failed", "why": "ran over", "run": "2026-12-04 18:00:26"}}
    line = gpu_summary_line({"device": "H200 (cuda)", "steps": steps, "calls": [{}, {}], "written_at": "2026-12-05"})
    assert line == "`python bench/gpu.py` on H200 (cuda) in 2 calls, 2026-12-05: tests ok at 18:06; " \
                   "fidelity failed (ran over) at 18:00."
    # written before selective's fix for random draws: the same line, and its selective figures marked as such
    before = gpu_summary_line({"device": "H200 (cuda)", "steps": steps, "calls": [{}, {}], "written_at": "2026-12-04"})
    assert before.startswith("`python bench/gpu.py` on H200 (cuda) in 2 calls, 2026-12-04: tests ok at 18:06; "
                             "fidelity failed (ran over) at 18:00. Every figure below with `selective` was measured "
                             "before its fix")


def test_the_gpu_tests_are_collected_from_the_modules_that_hold_them() -> None:
    """Only those modules: one that imports what a GPU machine may lack (the browser) is never collected."""
    files = gpu_test_files()
    assert "tests/test_gpu.py" in files and "tests/test_apply.py" in files
    assert "tests/test_dashboard_app.py" not in files and all(f.startswith("tests/test_") for f in files)


def test_a_command_over_its_cap_is_stopped_with_its_children(tmp_path: Path) -> None:
    """A bench's search starts Ray's processes: over the cap, the whole group goes, so the next step has the GPU."""
    pid_file = tmp_path / "child"
    child = "import time; time.sleep(60)"
    parent = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    t0 = time.perf_counter()
    proc, over = run([sys.executable, "-c", parent], 3)
    assert over and time.perf_counter() - t0 < 30 and "started" in proc.stdout
    pid = int(pid_file.read_text())
    for _ in range(50):  # the child is killed with the group; gone once its parent's init reaps it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with open(f"/proc/{pid}/stat") as stat:
            assert stat.read().split()[2] == "Z", "the child of a command over its cap still runs"
    done, over = run([sys.executable, "-c", "print('quick')"], 30)
    assert not over and done.returncode == 0 and done.stdout == "quick\n"


def test_a_bad_cap_is_refused_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--cap", "tests=soon"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--cap tests=soon" in err and "STEP=SECONDS" in err and "throughput" in err

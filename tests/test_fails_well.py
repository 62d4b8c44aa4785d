"""A search that fails well: damaged stores, interrupted and resumed runs, broken user models.

Each case ends in one line that names the problem and the fix, a run status that tells the truth,
and nothing lost or measured twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.ppo import AgentConfig
from search.records import meta
from search.records.config import SearchConfig
from search.records.store import STORE_NAME, RunStore, StoreError
from tests.test_search_run_faults import _wait_for

ROOT = Path(__file__).resolve().parents[1]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _damaged_run(run_dir: Path) -> Path:
    """A run folder whose store (a config and enough rows to span many pages) has 8 KiB of junk at offset 16384."""
    with RunStore(run_dir / STORE_NAME) as store:
        store.write(meta.CONFIG, json.loads(SearchConfig(workload="gpt/tiny").to_json()))
        store.write(meta.STATUS, "interrupted")
        for i in range(300):  # rows enough to span many pages
            store.propose(f"{i:016x}", ["keep"] * 100, "rule:none")
    path = run_dir / STORE_NAME
    data = bytearray(path.read_bytes())
    assert len(data) > 16384 + 8192
    data[16384:16384 + 8192] = os.urandom(8192)
    path.write_bytes(bytes(data))
    return path


def test_junk_inside_the_store_is_refused_before_any_write(tmp_path: Path) -> None:
    path = _damaged_run(tmp_path)
    before = _digest(path)
    for readonly in (True, False):
        with pytest.raises(StoreError) as e:
            RunStore(path, readonly=readonly)
        assert "\n" not in str(e.value) and "is corrupt" in str(e.value) and "nothing was written" in str(e.value)
    assert _digest(path) == before


def test_resuming_a_damaged_store_is_one_line_and_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = _damaged_run(tmp_path)
    before = _digest(path)
    done = subprocess.run([sys.executable, "-m", "search.run", "--resume", str(tmp_path), "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: run store") and "is corrupt" in lines[0], done.stderr
    assert "Started a local Ray instance" not in done.stderr
    assert _digest(path) == before
    wal = tmp_path / f"{STORE_NAME}-wal"  # SQLite's write-ahead log: opening may create it, nothing is in it
    assert not wal.exists() or wal.stat().st_size == 0
    assert {p.name for p in tmp_path.iterdir()} <= {STORE_NAME, wal.name, f"{STORE_NAME}-shm"}


TINY = ["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "256", "--chunk-timesteps", "128",
        "--max-measurements", "12", "--repeats", "1", "--no-progress", "--no-batch-scaling", "--peers", "none",
        "--evaluators", "1"]


@pytest.mark.slow
def test_a_resumed_agent_never_trains_past_its_timesteps(tmp_path: Path, ray_session) -> None:
    """kill -9 after an agent saved its policy but before its progress row was written: the resumed agent
    counts the steps of the policy it loads instead of training them again."""
    from search.run import main

    assert main([*TINY, "--out", str(tmp_path), "--name", "t"]) == 0
    run = tmp_path / "t"
    with RunStore(run / STORE_NAME) as store:  # the state a kill -9 between save and progress row leaves
        rollout = AgentConfig().episodes_per_rollout * len(store.read(meta.UNITS))
        whole = 256 // rollout * rollout  # PPO trains whole rollouts only: gpt/tiny's 5 units, 240 of 256
        for row in store.progress():
            assert row["timesteps"] == whole
            store.set_progress(row["agent"], timesteps=0, status="running")
        store.write(meta.STATUS, "interrupted")
    assert main(["--resume", str(run), "--no-progress"]) == 0
    with RunStore(run / STORE_NAME, readonly=True) as store:
        rows = store.progress()
    assert [r["timesteps"] for r in rows] == [whole, whole] and {r["status"] for r in rows} == {"finished"}


BROKEN = "tests/data/broken_models.py"
RUN = [sys.executable, "-m", "search.run"]
SMALL = ["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "256", "--chunk-timesteps", "128",
         "--max-measurements", "14", "--repeats", "2", "--no-progress", "--no-batch-scaling", "--peers", "none"]


def _has_baseline(store_path: Path) -> bool:
    import sqlite3

    try:
        return sqlite3.connect(f"file:{store_path}?mode=ro", uri=True).execute(
            "SELECT COUNT(*) FROM meta WHERE key = 'baseline_digest'").fetchone()[0] == 1
    except sqlite3.Error:
        return False


def _files(run_dir: Path) -> dict[str, str]:
    """Every file of a run folder and its digest; SQLite's shared-memory index (-shm), which any reader
    rewrites, is not the run's data."""
    return {str(p.relative_to(run_dir)): _digest(p) for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not p.name.endswith("-shm")}


@pytest.mark.slow
def test_sigterm_to_the_whole_group_drains_then_resume_finishes_and_a_second_resume_changes_nothing(tmp_path):
    """What SLURM, systemd and ``timeout`` do: SIGTERM to every process of the job, then a second one while it
    drains. Exit 143, status interrupted, the frontier and report written from what was measured; --resume
    finishes without losing or repeating a measurement; resuming the finished run changes no file."""
    import signal
    import time

    proc = subprocess.Popen([*RUN, *SMALL, "--out", str(tmp_path), "--name", "t"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    run = tmp_path / "t"
    assert _wait_for(lambda: _has_baseline(run / STORE_NAME)), "the run measured its baseline before the signal"
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGTERM)  # a second signal while it drains: noted, not obeyed
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err and "AbslFailureSignalHandler" not in err and "Exception ignored" not in err
    assert f"continue with: python -m search.run --resume {run}" in err
    with RunStore(run / STORE_NAME, readonly=True) as s:
        assert s.read(meta.STATUS) == "interrupted"
        before = {m.digest: list(m.measurement_ids) for m in s.measured()}
    assert (run / "frontier.json").is_file() and (run / "report.md").is_file()
    done = subprocess.run([*RUN, "--resume", str(run), "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with RunStore(run / STORE_NAME, readonly=True) as s:
        assert s.read(meta.STATUS) == "finished"
        after = {m.digest: list(m.measurement_ids) for m in s.measured()}
    for digest, ids in before.items():
        assert after[digest][:len(ids)] == ids, "a measurement taken before the signal was lost"
    files = _files(run)
    again = subprocess.run([*RUN, "--resume", str(run), "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "finished already" in again.stderr and "nothing was changed" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1, again.stderr
    assert _files(run) == files


@pytest.mark.slow
@pytest.mark.parametrize("factory, error, where", [
    ("no_grad", "RuntimeError: element 0 of tensors does not require grad", "the choice of decision units"),
    ("wrong_dtype", "RuntimeError: mat1 and mat2 must have the same dtype", "the choice of decision units"),
    ("raises_later?fail_after=3", "RuntimeError: boom after 3 calls", "the warm-up steps"),
])
def test_a_broken_model_is_one_line_with_its_own_error_and_the_run_says_failed(tmp_path, factory, error, where):
    done = subprocess.run([*RUN, "--workload", f"{BROKEN}:{factory}", "--out", str(tmp_path), "--name", "b",
                           "--no-progress", "--agents", "1", "--timesteps", "64"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and error in ours[0] and f"(during {where}" in ours[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "RayTaskError" not in done.stderr
    with RunStore(tmp_path / "b" / STORE_NAME, readonly=True) as s:
        assert s.read(meta.STATUS) == "failed: " + ours[0].removeprefix("error: ")


def test_exit_codes_are_in_the_help():
    done = subprocess.run([*RUN, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    text = " ".join(done.stdout.split())
    for code in ("0 finished", "2 bad input", "3 the model failed", "130 Ctrl-C", "143 SIGTERM"):
        assert code in text, code

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

from search.records.config import SearchConfig
from search.records.store import STORE_NAME, RunStore, StoreError

ROOT = Path(__file__).resolve().parents[1]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _damaged_run(run_dir: Path) -> Path:
    """A run folder whose store (a config and enough rows to span many pages) has 8 KiB of junk at offset 16384."""
    with RunStore(run_dir / STORE_NAME) as store:
        store.set_meta("config", json.loads(SearchConfig(workload="gpt/tiny").to_json()))
        store.set_meta("status", "interrupted")
        for i in range(300):
            store.set_meta(f"filler_{i}", "x" * 400)
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
        "--max-measurements", "12", "--repeats", "1", "--no-progress", "--no-batch-scaling", "--peers", "none"]


@pytest.mark.slow
def test_a_resumed_agent_never_trains_past_its_timesteps(tmp_path: Path, ray_session) -> None:
    """kill -9 after an agent saved its policy but before its progress row was written: the resumed agent
    counts the steps of the policy it loads instead of training them again."""
    from search.run import main

    assert main([*TINY, "--out", str(tmp_path), "--name", "t"]) == 0
    run = tmp_path / "t"
    with RunStore(run / STORE_NAME) as store:  # the state a kill -9 between save and progress row leaves
        for row in store.progress():
            assert row["timesteps"] == 256
            store.set_progress(row["agent"], timesteps=0, status="running")
        store.set_meta("status", "interrupted")
    assert main(["--resume", str(run), "--no-progress"]) == 0
    with RunStore(run / STORE_NAME, readonly=True) as store:
        rows = store.progress()
    assert [r["timesteps"] for r in rows] == [256, 256] and {r["status"] for r in rows} == {"finished"}

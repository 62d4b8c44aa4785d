"""The search service when parts of it die: a two-node cluster losing an Evaluator, a driver killed and resumed."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from search.records import meta
from search.records.store import RunStore

from tests.test_search_run import ROOT, TINY, _every_measurement_once, _run_cli


@dataclass
class KilledDriver:
    run: Path
    pid: int  # the killed driver's
    refused: subprocess.CompletedProcess  # a --resume while that driver lived
    driver: dict  # the store's driver record after the kill


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_node_cluster() -> tuple[subprocess.Popen, str]:
    """tests/ray_cluster.py: a head and a second node on loopback; returns the process and the address."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "ray_cluster.py"), "600"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    address = proc.stdout.readline().strip()
    assert address.startswith("127.0.0.1:"), f"the cluster did not start ({address!r})"
    return proc, address


def _measured_count(store_path: Path) -> int:
    try:
        return sqlite3.connect(f"file:{store_path}?mode=ro", uri=True).execute(
            "SELECT COUNT(*) FROM evaluations WHERE measured = 1").fetchone()[0]
    except sqlite3.Error:
        return 0


def _wait_for(predicate, timeout_s: float = 240.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_two_node_cluster_two_evaluators_one_killed(tmp_path):
    """A search joins (--address) a two-node cluster on loopback with two Evaluators: both nodes
    measure; one Evaluator is killed mid-run; the run finishes with every measurement recorded once."""
    cluster, address = _two_node_cluster()
    try:
        args = [*TINY, "--timesteps", "512", "--max-measurements", "16", "--evaluators", "2",
                "--address", address, "--out", str(tmp_path), "--name", "two"]
        proc = subprocess.Popen([sys.executable, "-m", "search.run", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        store_path = tmp_path / "two" / "store.sqlite"
        assert _wait_for(lambda: _measured_count(store_path) >= 3), "the run measured plans"
        with RunStore(store_path, readonly=True) as s:
            evaluators = s.read(meta.EVALUATORS)
        assert len(evaluators) == 2 and len({e["node"] for e in evaluators}) == 2, evaluators
        os.kill(evaluators[1]["pid"], signal.SIGKILL)  # a worker killed mid-run
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert out.strip().splitlines()[-1] == str(tmp_path / "two")
        assert json.loads((tmp_path / "two" / "frontier.json").read_text())["points"]
        records = _every_measurement_once(store_path)
        nodes = {label.split("@", 1)[1] for m in records for label in m.evaluators}
        assert len(nodes) >= 2, "both nodes measured"
        report = (tmp_path / "two" / "report.md").read_text()
        assert "evaluator_1 died" in report and "| evaluator_1 |" in report
        with RunStore(store_path, readonly=True) as s:
            assert s.read(meta.STATUS) == "finished"
            assert len(s.read(meta.BASELINE_BY_EVALUATOR)) == 2  # the baseline on every Evaluator
    finally:
        os.killpg(cluster.pid, signal.SIGTERM)
        cluster.wait(timeout=60)


@pytest.fixture(scope="module")
def killed_driver(tmp_path_factory) -> KilledDriver:
    """One search of gpt/tiny: once it has measured a plan, a --resume of it while its driver lives; once it has
    measured four, kill -9 of its whole process group (the search, its Ray, its Evaluator)."""
    out = tmp_path_factory.mktemp("killed_driver")
    args = [*TINY, "--timesteps", "1024", "--chunk-timesteps", "256", "--max-measurements", "16",
            "--out", str(out), "--name", "k"]
    proc = subprocess.Popen([sys.executable, "-m", "search.run", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    store_path = out / "k" / "store.sqlite"
    try:
        assert _wait_for(lambda: _measured_count(store_path) >= 1), "the run measured a plan"
        refused = _run_cli(["--resume", str(out / "k"), "--no-progress"], timeout=120)
        assert _wait_for(lambda: _measured_count(store_path) >= 4), "the run measured plans before the kill"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    with RunStore(store_path, readonly=True) as s:
        driver = s.read(meta.DRIVER)
    return KilledDriver(out / "k", proc.pid, refused, driver)


@pytest.mark.slow
def test_resuming_a_run_whose_driver_lives_is_refused_in_one_line(killed_driver):
    done = killed_driver.refused
    assert done.returncode == 2, done.stderr[-2000:]
    line = done.stderr.strip()
    assert "\n" not in line and "is being searched by a live driver" in line and f"pid {killed_driver.pid}" in line
    assert killed_driver.driver["pid"] == killed_driver.pid, "the refused driver wrote nothing into the store"


@pytest.mark.slow
def test_sigkill_of_the_driver_then_resume_loses_and_repeats_nothing(killed_driver):
    from dashboard.data import load_run

    run, store_path = killed_driver.run, killed_driver.run / "store.sqlite"
    assert load_run(run).status == "stopped", "a killed run is not shown as running forever"
    before = {m.digest: m.step_seconds_samples for m in _every_measurement_once(store_path)}
    done = _run_cli(["--resume", str(run), "--no-progress"])
    assert done.returncode == 0, done.stderr[-2000:]
    after = {m.digest: m.step_seconds_samples for m in _every_measurement_once(store_path)}
    with RunStore(store_path, readonly=True) as s:
        remeasured = set(s.read(meta.REMEASURED)) | set(s.read(meta.CONFIRMED) or [])
        assert s.read(meta.STATUS) == "finished"
    for digest, samples in before.items():
        assert after[digest][:len(samples)] == samples, "samples measured before the kill were lost"
        if digest not in remeasured:
            assert after[digest] == samples, "a plan measured before the kill was measured again"

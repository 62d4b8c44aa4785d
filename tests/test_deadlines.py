"""No silent waits: a call past its deadline ends the run in one line naming the stage and where the Evaluator
was; meanwhile the search says what it waits on (search/engine/deadlines.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from search.engine.deadlines import STEP_FLOOR, DeadlineError, Deadlines
from search.records import meta
from search.records.config import SearchConfig
from search.records.store import STORE_NAME, RunStore

ROOT = Path(__file__).resolve().parents[1]
MODELS = "tests/data/memory_models.py"


def test_deadlines_scale_with_the_first_step_and_the_micro_batch() -> None:
    d = Deadlines(step_timeout=100.0, repeats=3)
    assert d.build() == 200.0 and d.step() == 100.0  # before a step is measured: --step-timeout a step
    d.first_step = 0.01
    assert d.step() == STEP_FLOOR and d.step(scale=4) == 4 * STEP_FLOOR
    d.first_step = 3.0
    assert d.step() == 60.0 and d.measurement() == 6 * 60.0
    d.first_step = 30.0
    assert d.step() == 100.0  # never above --step-timeout
    with pytest.raises(Exception, match="--step-timeout must be a positive"):
        SearchConfig(step_timeout=0).validate()


def test_a_wait_past_its_deadline_names_the_stage_and_where(ray_session, capsys) -> None:
    slow = ray_session.remote(lambda: time.sleep(30)).remote()
    d = Deadlines(step_timeout=1.0, repeats=1)
    start = time.monotonic()
    with pytest.raises(DeadlineError) as e:
        d.wait(ray_session, [slow], 1.5, "the test's call", lambda: "in sleep (test.py:1)")
    assert 1.5 <= time.monotonic() - start < 10
    assert str(e.value).startswith("the test's call did not return within 2 s in sleep (test.py:1);")
    assert "--step-timeout" in str(e.value) and "\n" not in str(e.value)
    ray_session.cancel(slow, force=True)


def _hang(tmp_path: Path, factory: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "search.run", "--workload", f"{MODELS}:{factory}", "--step-timeout",
                           "5", "--out", str(tmp_path), "--name", "h", "--no-progress", "--agents", "1",
                           "--timesteps", "64"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize("factory, where", [
    ("sleeps_in_factory", "in sleeps_in_factory (memory_models.py:"),
    ("sleeps_in_forward", "in the forward of module blocks.1, at forward (memory_models.py:"),
])
def test_a_factory_or_forward_that_never_returns_ends_the_run_in_one_line(tmp_path: Path, factory: str,
                                                                         where: str) -> None:
    done, seconds = _hang(tmp_path, factory)
    assert done.returncode == 3, done.stderr[-2000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and "building the workload" in ours[0] and "did not return within 10 s" in ours[0], ours
    assert where in ours[0], ours[0]
    assert any(line.startswith("waiting on evaluator_0: building the workload") for line in done.stderr.splitlines())
    assert seconds < 120 and "Traceback" not in done.stderr
    with RunStore(tmp_path / "h" / STORE_NAME, readonly=True) as s:
        assert s.read(meta.STATUS) == "failed: " + ours[0].removeprefix("error: ")
    again = subprocess.run([sys.executable, "-m", "search.run", "--resume", str(tmp_path / "h"), "--no-progress"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 3 and where in again.stderr  # a resume does not wait forever either

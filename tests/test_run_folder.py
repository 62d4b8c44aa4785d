"""A run folder tells the truth: permissions checked before anything is written, the lock taken before
config.json, --resume's flags honoured or refused in one line, a missing frontier.json rebuilt, export reading
the run's status, and a workload file's import error found before Ray starts."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from env.data.errors import CkptSearchError
from search.records import meta
from search.records.config import SearchConfig
from search.records.runs import make_run_dir, resumed_config
from search.records.store import STORE_NAME, RunStore
from tests.fixtures_runs import cached_run

ROOT = Path(__file__).resolve().parents[1]
RUN = [sys.executable, "-m", "search.run"]


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``path`` made unwritable for everyone, root too (``chattr +i``); skipped where the file system or the user
    cannot."""
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and an ext4-like file system)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / run.name
    shutil.copytree(run, dst)
    return dst


def test_of_two_runs_started_into_one_folder_config_json_describes_the_one_that_searches(tmp_path: Path) -> None:
    first = SearchConfig(workload="mlp", seed=2, out=str(tmp_path), name="race").validate()
    second = SearchConfig(workload="gpt/tiny", seed=1, out=str(tmp_path), name="race").validate()
    _, run_dir, lock = make_run_dir(first)
    try:
        with pytest.raises(CkptSearchError, match="is being searched by a live driver"):
            make_run_dir(second)
        saved = json.loads((run_dir / "config.json").read_text())
        assert (saved["workload"], saved["seed"]) == ("mlp", 2)
    finally:
        lock.release()


def test_a_read_only_store_is_one_line_naming_it_and_leaves_no_side_files(tmp_path: Path) -> None:
    run = _copy(cached_run(status="interrupted"), tmp_path)
    store = run / STORE_NAME
    with immutable(store):
        done = subprocess.run([*RUN, "--resume", str(run), "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == (f"error: file '{store}' is not writable by this user; make it writable "
                                            "(chmod u+w, or chattr -i where it is immutable) and run again; nothing "
                                            "was written to the run"), done.stderr
    assert not (run / f"{STORE_NAME}-wal").exists() and not (run / f"{STORE_NAME}-shm").exists()


def test_a_read_only_run_folder_is_said_as_such_not_as_a_corrupt_store(tmp_path: Path) -> None:
    run = _copy(cached_run(status="interrupted"), tmp_path)
    before = sorted(p.name for p in run.iterdir())
    with immutable(run):
        with pytest.raises(CkptSearchError) as e:
            make_run_dir(SearchConfig(resume=str(run)))
        with pytest.raises(CkptSearchError) as new:
            make_run_dir(SearchConfig(workload="mlp", out=str(run), name="inside"))
    assert str(e.value).startswith(f"run folder '{run}' is not writable") and "corrupt" not in str(e.value)
    assert str(new.value).startswith(f"cannot make run folder '{run / 'inside'}' (Operation not permitted)")
    assert sorted(p.name for p in run.iterdir()) == before


def test_resume_honours_what_it_can_and_refuses_the_rest_in_one_line() -> None:
    saved = SearchConfig(workload="gpt/tiny", memory_cap=[1.5], timesteps=256, resume="runs/r").validate()
    asked = SearchConfig(memory_cap=[2.5], timesteps=512, seed=3, progress=False)
    with pytest.raises(CkptSearchError) as e:
        resumed_config(saved, asked, {"memory_cap", "timesteps", "seed", "progress", "resume"})
    assert "--seed cannot change on a resumed run" in str(e.value) and "--memory-cap" not in str(e.value).split(
        "cannot change")[0]
    got = resumed_config(saved, asked, {"memory_cap", "timesteps", "progress", "resume"})
    assert (got.memory_cap, got.timesteps, got.progress, got.workload) == ([2.5], 512, False, "gpt/tiny")
    with pytest.raises(CkptSearchError, match="--timesteps cannot change"):  # fewer: the agents trained more already
        resumed_config(saved, SearchConfig(timesteps=128), {"timesteps"})
    plain = SearchConfig(workload="gpt/tiny", resume="runs/r").validate()  # not a throughput run: no cap to change
    with pytest.raises(CkptSearchError, match="--memory-cap cannot change"):
        resumed_config(plain, asked, {"memory_cap"})


def test_a_folder_search_run_made_without_a_store_is_not_called_foreign(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(SearchConfig().to_json())
    with pytest.raises(CkptSearchError, match="it holds no run yet"):
        make_run_dir(SearchConfig(resume=str(tmp_path)))


def test_a_finished_run_missing_its_frontier_rebuilds_it_from_the_store(tmp_path: Path) -> None:
    from search.run import finished_run
    from search.records.frontier_file import load_frontier

    run = _copy(cached_run(), tmp_path)
    before = load_frontier(run)
    (run / "frontier.json").unlink()
    said = finished_run(run)
    assert said is not None and "frontier.json was missing: rebuilt from the store" in said
    assert load_frontier(run).points and (run / "report.md").is_file()
    assert load_frontier(run).fingerprint == before.fingerprint


def test_export_reads_the_runs_status(tmp_path: Path) -> None:
    from search.export import export

    run = _copy(cached_run(status="interrupted"), tmp_path)
    with pytest.raises(CkptSearchError) as e:
        export(run)
    assert str(e.value) == (f"run '{run}' is interrupted; its frontier.json holds only what was measured before it "
                            "stopped: export that with --allow-partial, or continue it with python -m search.run "
                            f"--resume {run}")
    done = export(run, allow_partial=True)
    assert done.note == f"note: a partial frontier: run '{run}' is interrupted; continue it with python -m search.run --resume {run}"
    (run / "frontier.json").unlink()
    with RunStore(run / STORE_NAME) as store:
        store.write(meta.STATUS, "failed: the model raised RuntimeError: boom")
    with pytest.raises(CkptSearchError) as e:
        export(run, allow_partial=True)
    assert str(e.value).startswith(f"run '{run}' is failed: the model raised RuntimeError: boom; it has no "
                                   "frontier.json yet: continue it with python -m search.run --resume")


def test_a_workload_file_that_fails_to_import_is_found_before_ray_and_before_a_run_folder(tmp_path: Path) -> None:
    model = tmp_path / "bad_model.py"
    model.write_text("import torch\nimport not_a_module_anywhere\n\ndef make():\n    pass\n")
    done = subprocess.run([*RUN, "--workload", f"{model}:make", "--out", str(tmp_path / "runs")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "failed to import: ModuleNotFoundError: No module named 'not_a_module_anywhere'" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_apply_plan_says_what_does_not_match(recwarn) -> None:
    import torch.nn as nn

    from env.data.plan import Plan, fingerprint
    from search import apply_plan

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    units = ["0", "1"]
    plan = Plan(actions={"0": "recompute", "1": "keep", "9": "recompute"}, fingerprint=fingerprint(model, units))
    apply_plan(model, plan, strict=False).remove()
    said = str(recwarn.pop().message)
    assert said.startswith("the plan names units this Sequential lacks: applied 2 of 3 units, skipped 1")
    with pytest.raises(CkptSearchError, match="the plan has no actions"):
        apply_plan(model, Plan(actions={}, fingerprint=fingerprint(model, units)))

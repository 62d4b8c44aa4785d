"""Start ``python -m search.run`` in the background from the dashboard, detached from it.

The search outlives the Streamlit session (its own process group; closing the browser or
the dashboard does not stop it). Its output goes to ``<out>/<name>/search.log``; the run
folder appears at once, so the dashboard can follow it from its first line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dashboard.data import LOG_NAME
from env.errors import CkptSearchError
from env.workloads import WorkloadSpec, builtin_options
from search.runs import run_id

ROOT = Path(__file__).resolve().parent.parent  # where `python -m search.run` resolves


@dataclass(frozen=True)
class Started:
    run_dir: Path
    pid: int
    command: list[str]


def search_command(workload: str, agents: int, timesteps: int, out: str | Path, name: str) -> list[str]:
    """The command line of a background search (checked: a bad input fails here, in one line)."""
    spec = WorkloadSpec.parse(workload)
    if spec.is_builtin:
        builtin_options(spec)  # an unknown name, preset or option fails here, in one line
    if agents < 1 or timesteps < 1:
        raise CkptSearchError(f"agents={agents}, timesteps={timesteps}: both must be at least 1")
    return [sys.executable, "-m", "search.run", "--workload", workload, "--agents", str(agents),
            "--timesteps", str(timesteps), "--out", str(out), "--name", name, "--no-progress"]


def start_search(workload: str, agents: int, timesteps: int, out: str | Path, name: str | None = None) -> Started:
    """Launch the search detached; returns its run folder and process id."""
    name = name or run_id(workload)
    run_dir = Path(out) / name
    if run_dir.exists():
        raise CkptSearchError(f"run folder '{run_dir}' already exists; choose another run name")
    cmd = search_command(workload, agents, timesteps, Path(out).resolve(), name)
    run_dir.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(run_dir / LOG_NAME, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Started(run_dir, proc.pid, cmd)

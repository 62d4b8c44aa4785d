"""Start ``python -m search.run`` in the background from the dashboard, detached from it.

The search outlives the Streamlit session (its own process group; closing the browser or
the dashboard does not stop it). Its output goes to ``<out>/<name>/search.log``; the run
folder appears at once, so the dashboard can follow it from its first line.

A search runs the Python file a workload names, so who may start one matters: ``LaunchPolicy``
allows it on a dashboard bound to loopback only; bound to anything else (Streamlit's default
is every interface) the form is off unless the operator passes ``--allow-launch`` and a
``--workloads-dir``, and then only built-in workloads and files inside that folder run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dashboard.data import LOG_NAME
from env.data.errors import CkptSearchError
from env.workloads.spec import WorkloadSpec, builtin_options
from search.records.runs import run_id

ROOT = Path(__file__).resolve().parent.parent  # where `python -m search.run` resolves


LOOPBACK = ("127.", "localhost", "::1")


@dataclass(frozen=True)
class LaunchPolicy:
    """Whether this dashboard may start searches, and which workloads."""

    enabled: bool
    reason: str  # shown where the form would be when it is off
    workloads_dir: Path | None = None  # None: any workload (loopback); else built-ins and files inside it

    @classmethod
    def for_server(cls, address: str | None, allow_launch: bool = False,
                   workloads_dir: str | Path | None = None) -> "LaunchPolicy":
        if address and address.startswith(LOOPBACK):
            return cls(True, "")
        where = address or "every interface (Streamlit's default)"
        if not allow_launch:
            return cls(False, f"Starting searches is off: this dashboard listens on {where}, and a search runs the "
                              "Python file its workload names. Bind it to 127.0.0.1, or restart it with "
                              "--allow-launch --workloads-dir DIR to allow built-ins and the files in DIR.")
        if not workloads_dir or not Path(workloads_dir).is_dir():
            return cls(False, f"Starting searches is off: --allow-launch needs --workloads-dir, an existing folder "
                              f"of workload files (got {workloads_dir!r}).")
        return cls(True, "", Path(workloads_dir).resolve())

    def check(self, workload: str) -> None:
        """Refuse, in one line, a workload this policy does not allow."""
        if not self.enabled:
            raise CkptSearchError(self.reason)
        spec = WorkloadSpec.parse(workload)
        if self.workloads_dir is None or spec.is_builtin:
            return
        where = spec.target.rpartition(":")[0]
        path = Path(where).resolve() if where.endswith(".py") else None
        if path is None or not path.is_relative_to(self.workloads_dir):
            raise CkptSearchError(f"workload '{workload}' is not a built-in or a file in {self.workloads_dir}; "
                                  "this dashboard starts only those (ask its operator to add the file there)")


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


def start_search(workload: str, agents: int, timesteps: int, out: str | Path, name: str | None = None,
                 policy: LaunchPolicy = LaunchPolicy(True, "")) -> Started:
    """Launch the search detached (if ``policy`` allows the workload); returns its run folder and process id."""
    policy.check(workload)
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

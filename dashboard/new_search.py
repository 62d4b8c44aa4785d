"""Start ``python -m search.run`` in the background from the dashboard, and stop it.

The search runs in its own process group, so closing the browser does not stop it; the Stop
button (``stop_search``) and the dashboard's own exit do: SIGTERM to the group (the search drains
into its store and ends ``interrupted``, resumable), SIGKILL after a grace period, and the process
reaped, so no search or zombie outlives the dashboard that started it. Its output goes to
``<out>/<name>/search.log``; the run folder appears at once, so the dashboard can follow it from
its first line.

The command is the flags of a ``SearchConfig`` (``search.records.config.changed_flags``), checked as the
CLI checks it (``parse_config`` on the very arguments it will run with, and the workload's options by
``env.workloads.spec.builtin_options``), so the form refuses what ``python -m search.run`` would, in the
same one line.

A search runs the Python file a workload names, so who may start one matters: ``LaunchPolicy``
allows it on a dashboard bound to loopback only; bound to anything else (Streamlit's default
is every interface) the form is off unless the operator passes ``--allow-launch`` and a
``--workloads-dir``, and then only built-in workloads and files inside that folder run.

A workload is checked before anything starts (``resolve_workload``): a built-in's name and
options, a file's existence and the factory it names (read with ``ast``, not run), a module's
package. A relative file path is taken from where the dashboard was started and passed on
absolute, so the search loads the file the user named.
"""

from __future__ import annotations

import ast
import atexit
import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dashboard.data import LOG_NAME
from env.data.errors import CkptSearchError, WorkloadError
from env.workloads.spec import WorkloadSpec, builtin_options
from search.records.config import SearchConfig, changed_flags, parse_config
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
class Options:
    """What the form sets beyond the workload; defaults are the CLI's (left off the command)."""

    agents: int = 2
    timesteps: int = 512
    memory_cap: Sequence[float] = ()  # MiB; a throughput search when given
    device: str = "auto"
    evaluators: int = 0  # one per --measure-threads cores, at most 2 (the CLI's 0)
    precision: str = "32"  # Lightning's names (--precision); "32" is the CLI's default


@dataclass(frozen=True)
class Started:
    run_dir: Path
    pid: int
    command: list[str]


LAUNCHED: dict[int, subprocess.Popen] = {}  # pid -> the search this dashboard process started
STOP_GRACE_S = 20.0  # SIGTERM, then this long for the search to drain into its store, then SIGKILL


def top_level_names(path: Path) -> set[str]:
    """Names a Python file defines at its top level (functions, classes, assignments, imports), without running it."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except SyntaxError as e:
        raise WorkloadError(f"workload file '{path}' has a syntax error on line {e.lineno}: {e.msg}; fix the file") from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def resolve_workload(workload: str, cwd: Path | None = None) -> str:
    """The workload as the search will load it, checked before anything starts (one line when bad):
    a built-in's name, preset and options; a file's existence and factory (its path made absolute);
    a module's top-level package."""
    spec = WorkloadSpec.parse(workload)
    if spec.is_builtin:
        builtin_options(spec)  # an unknown name, preset or option fails here, in one line
        return workload
    where, _, func = spec.target.rpartition(":")
    if not where or not func:
        raise WorkloadError(f"workload '{workload}' must look like path/to/file.py:factory or package.module:factory")
    if not (where.endswith(".py") or "/" in where):
        if importlib.util.find_spec(where.split(".")[0]) is None:  # the package only: importing runs its code
            raise WorkloadError(f"no module '{where.split('.')[0]}' for workload '{workload}'; check the name, "
                                "or give path/to/file.py:factory")
        return workload
    path = ((cwd or Path.cwd()) / where).resolve()
    if not path.is_file():
        raise WorkloadError(f"workload file '{where}' does not exist (looked for {path}); check the path")
    names = top_level_names(path)
    if func not in names and "__getattr__" not in names and "*" not in names:
        public = sorted(n for n in names if not n.startswith("_"))
        raise WorkloadError(f"'{where}' defines no '{func}'; define {func}() there returning (module, inputs), or name "
                            f"one of: {', '.join(public) or '(none)'}")
    return str(WorkloadSpec(f"{path}:{func}", spec.preset, spec.options))


def search_command(workload: str, agents: int, timesteps: int, out: str | Path, name: str,
                   options: Options | None = None) -> list[str]:
    """The command line of a background search: the flags of the ``SearchConfig`` the form sets (those that
    differ from the CLI's defaults), checked as the CLI checks them (a bad input fails here, in one line)."""
    o = options or Options(agents, timesteps)
    cfg = SearchConfig(workload=resolve_workload(workload), agents=agents, timesteps=timesteps, out=str(out),
                       name=name, progress=False, memory_cap=list(o.memory_cap), device=o.device,
                       evaluators=o.evaluators, precision=o.precision)
    argv = changed_flags(cfg)
    parse_config(argv)  # the CLI's own checks, on the arguments it will get
    return [sys.executable, "-m", "search.run", *argv]


def start_search(workload: str, agents: int, timesteps: int, out: str | Path, name: str | None = None,
                 policy: LaunchPolicy = LaunchPolicy(True, ""), options: Options | None = None) -> Started:
    """Launch the search in its own process group (if ``policy`` allows the workload); returns its run folder and
    process id. It is stopped with the dashboard (``stop_all``), or by ``stop_search``."""
    policy.check(workload)
    name = name or run_id(workload)
    run_dir = Path(out) / name
    if run_dir.exists():
        raise CkptSearchError(f"run folder '{run_dir}' already exists; choose another run name")
    cmd = search_command(workload, agents, timesteps, Path(out).resolve(), name, options)
    run_dir.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(run_dir / LOG_NAME, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    LAUNCHED[proc.pid] = proc
    return Started(run_dir, proc.pid, cmd)


def is_running(pid: int) -> bool:
    """Whether a search this dashboard started is still running (an ended one is reaped here)."""
    proc = LAUNCHED.get(pid)
    return proc is not None and proc.poll() is None


def stop_search(pid: int, grace_s: float = STOP_GRACE_S) -> str:
    """Stop a search this dashboard started and its Ray processes (its process group): SIGTERM, which the
    search drains into its store (status ``interrupted``), then SIGKILL after ``grace_s``; the process is
    reaped. Returns what happened, in words."""
    proc = LAUNCHED.get(pid)
    if proc is None or proc.poll() is not None:
        return "it had already ended"
    os.killpg(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
        how = "stopped (SIGTERM): its store says interrupted; --resume continues it"
    except subprocess.TimeoutExpired:
        os.killpg(pid, signal.SIGKILL)
        proc.wait(timeout=10)
        how = f"killed (SIGKILL) after {grace_s:g} s without ending on SIGTERM"
    _kill_group(pid)
    return how


def _kill_group(pid: int) -> None:
    """Whatever of the group outlived its leader (Ray's workers): SIGKILL, until none is left (10 s at most)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.2)


@atexit.register
def stop_all() -> None:
    """The dashboard is stopping: no search it started outlives it."""
    for pid in list(LAUNCHED):
        if is_running(pid):
            stop_search(pid, grace_s=5.0)

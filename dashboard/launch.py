"""``ckpt-dashboard``: open the Streamlit dashboard on the run folders under a directory.

    ckpt-dashboard                      # runs/ on http://127.0.0.1:8501
    ckpt-dashboard --runs out --port 8600 --address 0.0.0.0

It is ``streamlit run dashboard/app.py -- --runs DIR`` with the server bound to 127.0.0.1
unless ``--address`` says otherwise (the dashboard can start searches: keep it local).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Sequence

APP = Path(__file__).resolve().parent / "app.py"
RUNS_ENV = "CKPT_DASHBOARD_RUNS"  # the app's runs folder when no --runs is given (tests set it)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ckpt-dashboard", description="Show ckpt-search runs (newest first) in a browser.")
    p.add_argument("--runs", default="runs", help="folder that holds run folders (default: runs)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8501, help="port (default: 8501)")
    p.add_argument("--headless", action="store_true", help="do not open a browser window")
    p.add_argument("--allow-launch", action="store_true",
                   help="let a dashboard bound to a non-loopback --address start searches (off by default: a search "
                        "runs the Python file its workload names); needs --workloads-dir")
    p.add_argument("--workloads-dir", default=None,
                   help="with --allow-launch: the only folder whose workload files may be run (built-ins always may)")
    return p


def streamlit_command(args: argparse.Namespace) -> list[str]:
    """The ``streamlit run`` command line for parsed arguments."""
    return ([sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", args.address,
             "--server.port", str(args.port), "--server.headless", str(bool(args.headless)).lower(),
             "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer", "--",
             "--runs", str(Path(args.runs).resolve())]
            + (["--allow-launch"] if args.allow_launch else [])
            + (["--workloads-dir", str(Path(args.workloads_dir).resolve())] if args.workloads_dir else []))


def free_port() -> int:
    """A TCP port nothing listens on right now (for tests and screenshots)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(runs: str | Path, port: int, address: str = "127.0.0.1", timeout_s: float = 60.0) -> subprocess.Popen:
    """Start a headless dashboard server and wait until it answers its health check."""
    args = build_parser().parse_args(["--runs", str(runs), "--port", str(port), "--address", address, "--headless"])
    log = tempfile.TemporaryFile()  # a pipe nobody reads would fill and stall the server
    proc = subprocess.Popen(streamlit_command(args), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://{address}:{port}/_stcore/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            err = log.read().decode(errors="replace")[-500:]
            raise RuntimeError(f"dashboard server exited with code {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"dashboard server did not answer {url} within {timeout_s:.0f} s; is port {port} free?")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not Path(args.runs).is_dir():
        print(f"note: '{args.runs}' does not exist yet; the dashboard will show it empty "
              f"until python -m search.run --out {args.runs} writes a run there", file=sys.stderr)
    try:
        return subprocess.call(streamlit_command(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``ckpt-dashboard``: open the Streamlit dashboard on the run folders under a directory.

    ckpt-dashboard                      # runs/ on http://127.0.0.1:8501
    ckpt-dashboard --runs out --port 8600 --address 0.0.0.0

It is ``streamlit run dashboard/app.py -- --runs DIR`` with the server bound to 127.0.0.1
unless ``--address`` says otherwise (the dashboard can start searches: keep it local).
Streamlit always runs headless here: a non-headless Streamlit asks for an e-mail address on
its first start and exits when stdin is closed. This launcher opens the browser itself once
the server answers, where a desktop exists to show it (``--headless``: never).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import webbrowser
from pathlib import Path
from typing import IO, Sequence

APP = Path(__file__).resolve().parent / "app.py"
RUNS_ENV = "CKPT_DASHBOARD_RUNS"  # the app's runs folder when no --runs is given (tests set it)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ckpt-dashboard", description="Show ckpt-search runs (newest first) in a browser.")
    p.add_argument("--runs", default="runs", help="folder that holds run folders (default: runs)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8501, help="port (default: 8501)")
    p.add_argument("--headless", action="store_true", help="do not open a browser window (none opens without a desktop)")
    p.add_argument("--allow-launch", action="store_true",
                   help="let a dashboard bound to a non-loopback --address start searches (off by default: a search "
                        "runs the Python file its workload names); needs --workloads-dir")
    p.add_argument("--workloads-dir", default=None,
                   help="with --allow-launch: the only folder whose workload files may be run (built-ins always may)")
    return p


def streamlit_command(args: argparse.Namespace) -> list[str]:
    """The ``streamlit run`` command line for parsed arguments."""
    return ([sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", args.address,
             "--server.port", str(args.port), "--server.headless", "true",
             "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer", "--",
             "--runs", str(Path(args.runs).resolve())]
            + (["--allow-launch"] if args.allow_launch else [])
            + (["--workloads-dir", str(Path(args.workloads_dir).resolve())] if args.workloads_dir else []))


def free_port() -> int:
    """A TCP port nothing listens on right now (for tests and screenshots)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(proc: subprocess.Popen, url: str, timeout_s: float, log: IO[bytes] | None = None) -> None:
    """Return once ``url`` answers 200; raise (with the server's last output) if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = ""
            if log is not None:
                log.seek(0)
                err = ": " + log.read().decode(errors="replace")[-500:]
            raise RuntimeError(f"dashboard server exited with code {proc.returncode}{err}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"dashboard server did not answer {url} within {timeout_s:.0f} s; is the port free?")


def start_server(runs: str | Path, port: int, address: str = "127.0.0.1", timeout_s: float = 60.0) -> subprocess.Popen:
    """Start a headless dashboard server and wait until it answers its health check."""
    args = build_parser().parse_args(["--runs", str(runs), "--port", str(port), "--address", address, "--headless"])
    log = tempfile.TemporaryFile()  # a pipe nobody reads would fill and stall the server
    proc = subprocess.Popen(streamlit_command(args), stdout=log, stderr=subprocess.STDOUT)
    try:
        serving(proc, f"http://{address}:{port}/_stcore/health", timeout_s, log)
    except RuntimeError:
        proc.kill()
        raise
    return proc


def has_desktop() -> bool:
    """Whether a browser window can be shown: macOS, Windows, or an X11/Wayland session."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def open_when_serving(proc: subprocess.Popen, address: str, port: int) -> None:
    """Open the dashboard in the user's browser (``webbrowser``: honours $BROWSER) once it answers."""
    host = "127.0.0.1" if address in ("0.0.0.0", "::") else address
    host = f"[{host}]" if ":" in host else host
    try:
        serving(proc, f"http://{host}:{port}/_stcore/health", timeout_s=120)
    except RuntimeError:
        return  # the server's own output says why
    webbrowser.open(f"http://{host}:{port}/")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not Path(args.runs).is_dir():
        print(f"note: '{args.runs}' does not exist yet; the dashboard will show it empty "
              f"until python -m search.run --out {args.runs} writes a run there", file=sys.stderr)
    proc = subprocess.Popen(streamlit_command(args), stdin=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())  # stopping the launcher stops its server
    if not args.headless and has_desktop():
        threading.Thread(target=open_when_serving, args=(proc, args.address, args.port), daemon=True).start()
    try:
        return proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the server too (same process group): let it stop
        proc.wait()
        return 130


if __name__ == "__main__":
    sys.exit(main())

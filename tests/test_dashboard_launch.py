"""``ckpt-dashboard`` as a user starts it: no --headless, stdin closed; it serves, and opens a browser
where a desktop exists (``$BROWSER``, which Python's webbrowser honours, stands in for the user's)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dashboard.launch import build_parser, free_port, streamlit_command

ROOT = Path(__file__).resolve().parent.parent


def _launcher() -> list[str]:
    script = Path(sys.executable).with_name("ckpt-dashboard")  # the installed entry point, beside this python
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dashboard.launch"]


def test_streamlit_runs_headless_whatever_the_flag() -> None:
    for argv in ([], ["--headless"]):
        cmd = streamlit_command(build_parser().parse_args(argv))
        assert cmd[cmd.index("--server.headless") + 1] == "true"  # no first-run e-mail prompt


@pytest.mark.slow
def test_ckpt_dashboard_without_headless_serves_and_opens_the_browser(tmp_path: Path) -> None:
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" >> {opened}\n')
    browser.chmod(browser.stat().st_mode | stat.S_IEXEC)
    port = free_port()
    env = dict(os.environ, DISPLAY=":0", BROWSER=f"{browser} %s", PYTHONPATH=str(ROOT))
    env.pop("WAYLAND_DISPLAY", None)
    (tmp_path / "runs").mkdir()
    proc = subprocess.Popen([*_launcher(), "--runs", str(tmp_path / "runs"), "--port", str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=tmp_path, start_new_session=True)
    try:
        deadline, status = time.monotonic() + 40, None
        while status != 200 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")[-1500:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    status = r.status
            except OSError:
                time.sleep(0.5)
        assert status == 200, "ckpt-dashboard did not serve within 40 s"
        while not opened.exists() and time.monotonic() < deadline + 10:
            time.sleep(0.2)
        assert opened.read_text().split() == [f"http://127.0.0.1:{port}/"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)

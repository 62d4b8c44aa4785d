"""The installed packages are the lock's (constraints.txt): what a fresh set-up installs is what was tested."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

LOCK = Path(__file__).resolve().parents[1] / "constraints.txt"


def _locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt line {line!r} is not 'name==version'; regenerate it with scripts/lock.sh"
            pins[_canonical(name)] = version
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _public(version: str) -> str:
    """The version without its local label (torch's ``+cpu``), as ``==`` compares it."""
    return version.split("+", 1)[0]


def test_the_lock_pins_every_dependency_and_torch() -> None:
    pins = _locked()
    for name in ("torch", "numpy", "ray", "streamlit", "stable-baselines3", "gymnasium", "transformers"):
        assert name in pins, f"{name} is not in constraints.txt; regenerate it with scripts/lock.sh"


def test_every_installed_dependency_is_at_the_locked_version() -> None:
    own_torch = os.environ.get("CKPT_OWN_TORCH") == "1"
    wrong = []
    for name, version in _locked().items():
        if name == "torch" and own_torch:
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # a dependency of an extra or platform this environment does not install
        if _public(installed) != version:
            wrong.append(f"{name} {installed} (locked {version})")
    if wrong:
        pytest.fail(f"installed versions differ from constraints.txt: {', '.join(wrong)}; "
                    "run bash scripts/setup.sh, or bash scripts/lock.sh to lock new versions")

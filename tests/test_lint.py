"""The code has no undefined names, unused imports or syntax errors (ruff's F and E9 rules), and its
imports keep the layering ``pyproject.toml``'s import-linter contracts declare."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_no_errors():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed; pip install -e '.[test]'")
    done = subprocess.run([ruff, "check", "--select", "F,E9", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_core_above_the_measurement_is_torch_free():
    """Cost model, exact solver, archive, store, frontier file and the dashboard's data and figures
    read only plain records: importing them must not load torch."""
    code = ("import env.cost.cost_model, env.cost.peak_walk, env.cost.correction, env.data.codec, agents.exact, search.engine.archive, "
            "search.records.store, search.records.frontier_file, search.engine.ledger, dashboard.data, dashboard.figures; "
            "import sys; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_the_imports_keep_the_layering():
    """Every import-linter contract in pyproject.toml holds: no arrow runs back up, no cycle between layers."""
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(lint).exists():
        pytest.fail("lint-imports is not installed; bash scripts/setup.sh installs it (the test extra)")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "BROKEN" not in done.stdout and "Contracts: 0 kept" not in done.stdout

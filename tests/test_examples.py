"""The training scripts in examples/ run as a user runs them: one auto_checkpoint call, then training."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as `python examples/<name>.py` puts its folder first
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_plain_loop_trains_with_the_plan(tmp_path, monkeypatch, capsys):
    losses = example("train_loop", monkeypatch).main(["--batch-size", "256", "--budget", "0.9", "--steps", "3",
                                                      "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    assert "auto_checkpoint: " in out and "gradients checked" in out and "trained 3 steps with" in out
    assert "recompute" in out.splitlines()[-1] or "selective" in out.splitlines()[-1]  # a plan, not all keep


@pytest.mark.slow
def test_transformers_trainer_trains_with_the_plan(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    loss = example("hf_trainer", monkeypatch).main(["--layers", "2", "--seq-len", "64", "--batch-size", "4",
                                                    "--budget", "0.8", "--steps", "3", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert math.isfinite(loss) and "gradients checked" in out and "trained 3 steps with" in out
    assert "recompute" in out.splitlines()[-1] or "selective" in out.splitlines()[-1]
    assert "examples" not in sys.modules  # nothing left importable by accident

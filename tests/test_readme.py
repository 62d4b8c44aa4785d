"""The README tells a newcomer the truth: its commands, its example model, its links and its layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BEGIN, END = "<!-- numbers:", "<!-- numbers: end -->"


def _prose() -> str:
    """The README without its generated numbers block."""
    return README[:README.index(BEGIN)] + README[README.index(END) + len(END):]


def test_the_two_commands_and_a_short_read() -> None:
    assert "bash scripts/setup.sh && .venv/bin/python -m search.run\n" in README
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -x -q\n" in README
    words = len(_prose().split())
    assert words <= 1500, f"the README's prose has {words} words; the details belong in docs/"


def test_every_local_link_and_image_exists() -> None:
    targets = re.findall(r"\]\(([^)#]+)\)", README) + re.findall(r'<img src="([^"]+)"', README)
    local = [t for t in targets if not t.startswith("http")]
    assert "docs/frontier.png" in local and "docs/measurement.md" in local
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_the_layout_names_files_that_exist() -> None:
    layout = _prose().split("## Layout", 1)[1]
    block = layout.split("```", 2)[1]
    missing, folder = [], ""
    for line in block.splitlines():
        head = line.split()[0] if line.strip() and not line.startswith(" ") else ""
        folder = head if head.endswith("/") else folder
        for name in re.findall(r"[\w/]+\.(?:py|md)", line):
            path = ROOT / (name if "/" in name else folder + name)
            if not path.exists():
                missing.append(str(path.relative_to(ROOT)))
    assert missing == []


@pytest.mark.slow
def test_the_own_model_example_is_a_workload(tmp_path: Path) -> None:
    from env.units.find import find_units
    from env.workloads.workload import load_workload

    code = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if b.startswith("# my_model.py"))
    (tmp_path / "my_model.py").write_text(code)
    w = load_workload(f"{tmp_path / 'my_model.py'}:make?batch_size=8")
    loss = w.loss()
    assert loss.dim() == 0 and loss.requires_grad and w.inputs[0].shape[0] == 8
    assert find_units(w.model) == [f"blocks.{i}" for i in range(8)]

"""SearchConfig is the CLI: every field a flag with its docstring as help, every bad value one line, a config
file read through the same parser, and the dashboard's command made of the same flags."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from env.data.errors import CkptSearchError
from env.data.types import RewardMode
from search.records.config import SearchConfig, changed_flags, field_doc, given_flags, parse_config

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_field_as_its_flag_with_its_docstring() -> None:
    done = subprocess.run([sys.executable, "-m", "search.run", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.replace("\u2502", " ").split())
    for f in dataclasses.fields(SearchConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in text, flag
        assert " ".join(field_doc(f.name).split()[:6]) in text, f"{flag}'s help is not its docstring"
    assert "--no-progress" in text and "--compile, --no-compile" in text  # a switch is --x/--no-x, as before
    assert "{none,eager,all}" in text and "{measured,model,hybrid}" in text  # choices by value


def test_flags_keep_their_names_and_types() -> None:
    cfg = parse_config(["--units", "blocks.*", "lm_loss", "--no-progress", "--compile", "--reward", "measured",
                        "--memory-cap", "60", "120.5", "--micro-batches", "1", "4", "--peer-budgets", "0", "0.5",
                        "--reference-every", "0", "--batch-dim", "0", "--precision", "bf16-mixed"])
    assert cfg.units == ["blocks.*", "lm_loss"] and cfg.progress is False and cfg.compile is True
    assert cfg.reward is RewardMode.MEASURED and cfg.memory_cap == [60.0, 120.5] and cfg.micro_batches == [1, 4]
    assert cfg.peer_budgets == [0.0, 0.5] and cfg.reference_every == 0.0 and cfg.batch_dim == 0
    assert cfg.workload == "gpt/small?precision=bf16-mixed"  # folded into the spec, as before
    assert parse_config([]) == SearchConfig().validate()


@pytest.mark.parametrize("argv, says", [
    (["--agents", "x"], "Error parsing --agents: invalid literal for int() with base 10: 'x'"),
    (["--bogus", "1"], "Unrecognized options: --bogus, 1"),
    (["--reward", "nope"], "invalid choice 'nope' for argument '--reward'. Expected one of ('measured', 'model', "
                           "'hybrid')"),
    (["--precision", "64"], "invalid choice '64' for argument '--precision'"),
    (["--memory-cap", "a"], "Error parsing --memory-cap"),
    (["--agents"], "Missing value for argument '--agents'"),
    (["--agents", "0"], "--agents must be at least 1, got 0"),
    (["--devices", "-1"], "--devices must be 0 (every GPU) or more, got -1"),
    (["--batch-dim", "-2"], "--batch-dim must be -1 (none) or more, got -2"),
    (["--units"], "--units needs at least one"),
    (["--actions", "recompute"], "--actions recompute lacks 'keep'"),
    (["--peer-budgets", "1.5"], "--peer-budgets 1.5 is outside 0.0-1.0"),
    (["--step-timeout", "nan"], "--step-timeout must be a positive number of seconds"),
])
def test_every_bad_value_is_one_line_naming_it(argv: list[str], says: str) -> None:
    with pytest.raises(CkptSearchError) as e:
        parse_config(argv)
    assert "\n" not in str(e.value) and says in str(e.value), str(e.value)


def test_a_config_file_is_read_through_the_same_parser_and_flags_override_it(tmp_path: Path) -> None:
    saved = SearchConfig(workload="gpt/tiny", agents=2, memory_cap=[60.0], progress=False, compile=True).validate()
    path = tmp_path / "config.json"
    path.write_text(saved.to_json())
    again = parse_config(["--config", str(path)])
    assert dataclasses.replace(again, config="") == saved
    over = parse_config(["--config", str(path), "--agents", "3", "--progress"])
    assert over.agents == 3 and over.progress is True and over.memory_cap == [60.0] and over.compile is True
    path.write_text(json.dumps({"agents": "many"}))
    with pytest.raises(CkptSearchError) as e:
        parse_config(["--config", str(path)])
    assert "\n" not in str(e.value) and str(e.value).startswith(f"config file '{path}': Error parsing --agents")
    path.write_text(json.dumps({"agent": 2}))
    with pytest.raises(CkptSearchError, match=r"unknown keys \['agent'\]"):
        parse_config(["--config", str(path)])


def test_changed_flags_give_the_config_back_and_given_flags_name_what_the_command_line_set() -> None:
    cfg = SearchConfig(workload="gpt/tiny", memory_cap=[60.0, 0.1], progress=False, reference_every=2.5,
                       units=["blocks"], name="r")
    argv = changed_flags(cfg)
    assert argv == ["--workload", "gpt/tiny", "--units", "blocks", "--reference-every", "2.5", "--memory-cap", "60",
                    "0.1", "--name", "r", "--no-progress"]
    assert parse_config(argv) == dataclasses.replace(cfg).validate()
    assert given_flags(argv) == {"workload", "units", "reference_every", "memory_cap", "name", "progress"}
    assert given_flags(["--memory_cap=5", "--no-compile", "5"]) == {"memory_cap", "compile"}

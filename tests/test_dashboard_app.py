"""The dashboard's pages through streamlit.testing.v1.AppTest: budget slider, plan pick, export, errors."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from dashboard.data import load_run, select_plan
from dashboard.launch import RUNS_ENV
from dashboard.new_search import LaunchPolicy, search_command, start_search
from env.data.errors import CkptSearchError
from env.data.plan import Plan
from env.data.types import MIB
from search.records import meta
from search.records.store import STORE_NAME, RunStore
from tests.fixtures_runs import cached_run

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")


def _app(runs: Path, monkeypatch: pytest.MonkeyPatch, address: str = "127.0.0.1", args: tuple[str, ...] = ()) -> AppTest:
    """The app as ``streamlit run`` would serve it bound to ``address`` (app arguments ``args``)."""
    monkeypatch.setenv(RUNS_ENV, str(runs))
    monkeypatch.setattr(sys, "argv", ["app.py", *args])
    st_config.set_option("server.address", address)
    return AppTest.from_file(APP, default_timeout=60).run()


def _no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _exported(at: AppTest) -> Plan:
    return Plan.from_json(at.code[0].value)


@pytest.fixture(scope="module")
def run_dir() -> Path:
    return cached_run("gpt/tiny")


@pytest.mark.slow
def test_budget_slider_and_pick_select_and_export(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = load_run(run_dir)
    at = _app(run_dir.parent, monkeypatch)
    _no_exception(at)
    top = max(run.frontier.peak_bytes.max(), run.baseline_peak_bytes)  # the slider starts at its top
    fastest = select_plan(run.frontier, top).digest
    assert _exported(at).digest == fastest and fastest in at.success[0].value
    smallest = run.frontier.iloc[0]
    at.slider(key="budget_mib").set_value(smallest.peak_bytes / MIB).run()  # the tightest budget
    _no_exception(at)
    plan = _exported(at)
    assert plan.digest == smallest.digest and plan.fingerprint == run.fingerprint
    assert [a.value for a in plan.action_list(run.units)] == list(smallest.actions)
    at.selectbox(key="plan_pick").set_value(run.rules["all"]).run()  # any measured plan, here a rule
    plan = _exported(at)
    assert plan.digest == run.rules["all"] and {a.value for a in plan.actions.values()} == {"recompute"}
    assert "recompute 4" in at.success[0].value and "recompute 4" in at.subheader[0].value
    labels = [b.label for b in at.get("download_button")]
    assert labels == ["Download plan JSON", "Download Python snippet (torch only)"]
    snippet = at.code[1].value
    assert "def apply_checkpoint_plan" in snippet and run.fingerprint in snippet
    compile(snippet, "snippet", "exec")


@pytest.mark.slow
def test_pricing_and_live_pages(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    live = tmp_path / "runs" / "live-run"
    shutil.copytree(run_dir, live)
    with RunStore(live / STORE_NAME) as s:
        s.write(meta.STATUS, "running")
    at = _app(live.parent, monkeypatch)
    _no_exception(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["status"] == "running" and int(metrics["measured"]) == len(load_run(live).evaluations)
    assert len(at.get("progress")) == 2
    at.number_input(key="gpu_gb").set_value(0.004).run()
    _no_exception(at)
    assert not at.error
    priced = next(d.value for d in at.dataframe if "fits" in d.value.columns)
    assert priced.fits.all() and (priced.gpus * priced.accumulation * priced.micro_batch >= 1024).all()


def test_empty_folder_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(tmp_path, monkeypatch)
    _no_exception(at)
    assert "No runs under" in at.info[0].value
    assert at.get("form")  # the new-search form is offered


def test_broken_store_and_run_without_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "b-broken").mkdir()
    (tmp_path / "b-broken" / STORE_NAME).write_bytes(b"garbage" * 1000)
    at = _app(tmp_path, monkeypatch)
    _no_exception(at)
    assert "corrupt" in at.error[0].value
    (tmp_path / "a-starting").mkdir()
    (tmp_path / "a-starting" / "search.log").write_text("profiling\n")
    at.run()
    at.selectbox(key="run_choice").set_value("a-starting").run()
    _no_exception(at)
    assert "no results yet" in at.info[0].value and not at.error


def test_new_search_command_and_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cmd = search_command("gpt/tiny", 2, 64, tmp_path, "r1")
    assert cmd[1:3] == ["-m", "search.run"]
    assert cmd[3:] == ["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "64", "--out", str(tmp_path),
                       "--name", "r1", "--no-progress"]
    with pytest.raises(CkptSearchError, match="unknown workload 'nope'"):
        start_search("nope", 1, 1, tmp_path)
    assert not any(tmp_path.iterdir())  # nothing started, no folder made
    at = _app(tmp_path, monkeypatch)
    at.text_input[0].set_value("gpt/huge")
    at.button[0].click().run()
    _no_exception(at)
    assert "unknown preset 'huge'" in at.error[0].value


def test_launch_binds_locally_unless_told() -> None:
    from dashboard.launch import build_parser, streamlit_command

    cmd = streamlit_command(build_parser().parse_args([]))
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--") + 1:] == ["--runs", str(Path("runs").resolve())]
    wide = streamlit_command(build_parser().parse_args(["--address", "0.0.0.0", "--port", "8600"]))
    assert wide[wide.index("--server.address") + 1] == "0.0.0.0" and wide[wide.index("--server.port") + 1] == "8600"


def test_a_dashboard_bound_beyond_loopback_shows_no_launch_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(tmp_path, monkeypatch, address="0.0.0.0")
    _no_exception(at)
    assert not at.button and not at.text_input, "no new-search form"
    assert any("Starting searches is off" in i.value for i in at.info)
    allowed = tmp_path / "workloads"
    allowed.mkdir()
    at = _app(tmp_path, monkeypatch, address="0.0.0.0", args=("--allow-launch", "--workloads-dir", str(allowed)))
    _no_exception(at)
    assert at.text_input, "the operator allowed launching"
    at.text_input[0].set_value(f"{tmp_path / 'elsewhere.py'}:make")
    at.button[0].click().run()
    assert "is not a built-in or a file in" in at.error[0].value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["workloads"], "nothing was started"


def test_launch_policy() -> None:
    assert LaunchPolicy.for_server("127.0.0.1").enabled and LaunchPolicy.for_server("localhost").enabled
    for address in ("0.0.0.0", "10.1.2.3", None, ""):
        off = LaunchPolicy.for_server(address)
        assert not off.enabled and "--allow-launch --workloads-dir" in off.reason
    assert not LaunchPolicy.for_server("0.0.0.0", allow_launch=True).enabled  # no folder named
    folder = Path(__file__).resolve().parent.parent / "bench"
    policy = LaunchPolicy.for_server("0.0.0.0", allow_launch=True, workloads_dir=folder)
    policy.check("gpt/tiny")
    policy.check(f"{folder / 'user_model.py'}:make")
    for bad in ("tests/fixtures_runs.py:build_run", "os.path:join"):
        with pytest.raises(CkptSearchError, match="is not a built-in or a file in"):
            policy.check(bad)

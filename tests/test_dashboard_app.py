"""The dashboard's pages through streamlit.testing.v1.AppTest: budget slider, plan pick, export, errors."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from dashboard import selection
from dashboard.data import load_run
from dashboard.launch import RUNS_ENV
from dashboard.new_search import LaunchPolicy, Options, resolve_workload, search_command, start_search
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


def _opening_tab(at: AppTest) -> str:
    """The label of the tab the page opens on."""
    container = at.get("tab_container")[0]
    return at.tabs[container.proto.tab_container.default_tab_index].label


def _open(at: AppTest, page: str) -> AppTest:
    """Switch to a page (tab): only the open one runs."""
    at.session_state["page"] = page
    return at.run()


def _exported(at: AppTest) -> Plan:
    """The plan JSON the Plan page exports for the selection (the app is left on the Frontier page)."""
    _open(at, "Plan")
    plan = Plan.from_json(next(c.value for c in at.code if c.language == "json"))
    _open(at, "Frontier")
    return plan


@pytest.fixture(scope="module")
def run_dir() -> Path:
    return cached_run("gpt/tiny")


@pytest.mark.slow
def test_budget_slider_and_pick_select_and_export(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = load_run(run_dir)
    at = _app(run_dir.parent, monkeypatch)
    _no_exception(at)
    assert _opening_tab(at) == "Frontier"
    start = selection.start_plan(run)  # opens on a plan that saves memory, not on the no-checkpointing one
    assert start != run.rules["none"] and _exported(at).digest == start and start in at.success[0].value
    assert at.slider(key="budget_mib").value == pytest.approx(run.frontier.set_index("digest").peak_bytes[start] / MIB)
    low, high = selection.budget_range(run)
    at.slider(key="budget_mib").set_value(high).run()  # the loosest budget: the fastest plan of all
    assert _exported(at).digest == run.frontier.sort_values("step_seconds").digest.iloc[0]
    assert "the fastest frontier plan within the budget" in at.success[0].value
    smallest = run.frontier.iloc[0]
    at.slider(key="budget_mib").set_value(smallest.peak_bytes / MIB).run()  # the tightest budget
    _no_exception(at)
    plan = _exported(at)
    assert plan.digest == smallest.digest and plan.fingerprint == run.fingerprint
    assert [a.value for a in plan.action_list(run.units)] == list(smallest.actions)
    name = next(n for n in ("all", "all_selective") if run.rules[n] != smallest.digest)  # not the selected plan
    rule = run.evaluations.set_index("digest").loc[run.rules[name]]
    at.selectbox(key="plan_pick").set_value(run.rules[name]).run()  # any measured plan, here a rule
    plan = _exported(at)
    action = {"all": "recompute", "all_selective": "selective"}[name]
    assert plan.digest == run.rules[name] and {a.value for a in plan.actions.values()} == {action}
    assert f"{rule.summary}** ({run.rules[name]}), picked from the list" in at.success[0].value
    assert at.slider(key="budget_mib").value == pytest.approx(max(rule.peak_bytes / MIB, low))  # the slider follows
    _open(at, "Plan")
    assert rule.summary in at.subheader[0].value
    labels = [b.label for b in at.get("download_button")]
    assert labels == ["Download plan JSON", "Download Python snippet (torch only)"]
    snippet = next(c.value for c in at.code if "def apply_checkpoint_plan" in c.value)
    assert run.fingerprint in snippet
    compile(snippet, "snippet", "exec")
    assert "How to apply" in "".join(m.value for m in at.markdown)
    assert f"This plan is rule `{name}`" in "".join(m.value for m in at.markdown)  # not "nearest rule: another"
    code = next(c.value for c in at.code if c.language == "python" and "handle.remove()" in c.value)
    assert code.startswith("from search import apply_plan\n") and f"plan-{run.rules[name]}.json" in code


@pytest.mark.slow
def test_numbers_are_readable(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(_app(run_dir.parent, monkeypatch), "Plan")
    _no_exception(at)
    metrics = {m.label: m for m in at.metric}
    peak = metrics["peak memory"]
    assert peak.value.endswith("MiB") and len(peak.value.split()[0].replace(".", "").lstrip("0")) <= 4
    assert peak.delta.startswith("-")  # the start plan saves memory: shown as less, coloured as good
    _open(at, "Frontier").selectbox(key="plan_pick").set_value(load_run(run_dir).rules["none"]).run()
    _open(at, "Plan")
    assert {m.label: m for m in at.metric}["peak memory"].delta == "±0.0% vs baseline"  # no arrow on nothing
    columns = [c for d in at.dataframe for c in d.value.columns]
    assert not [c for c in columns if "_" in c], columns  # readable headers, not peak_rel or extra_seconds
    assert "nan" not in at.caption[0].value and "MiB" in at.caption[0].value


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
    assert _opening_tab(at) == "Live"  # a running run opens on its live page
    _open(at, "Price of memory").number_input(key="gpu_gb").set_value(0.004).run()
    _no_exception(at)
    assert not at.error
    priced = next(d.value for d in at.dataframe if "micro-batch" in d.value.columns)
    assert (priced.GPUs * priced.accumulation * priced["micro-batch"] >= 1024).all()
    largest = priced["measured at"].map(lambda b: max(int(x) for x in b.split(", ")))
    assert (priced.extrapolated == (priced["micro-batch"] > largest)).all()  # beyond the measured sizes: marked
    assert (priced["micro-batch"] <= 2 * largest).all() and (priced.capped == (priced["fit allows"] > 2 * largest)).all()
    assert any("CPU times" in w.value and "GPU-hours" in w.value for w in at.warning)


PAGES = ["Frontier", "Plan", "Price of memory", "Live", "New search", "Throughput"]


def unreadable(at: AppTest) -> list[str]:
    """What a page shows that a user cannot read: "None" or an empty cell, or a raw column name (snake_case)."""
    found = []
    for d in at.dataframe:
        df = d.value
        found += [f"column {c}" for c in df.columns if "_" in str(c)]
        found += [f"empty cells in {c}" for c in df.columns if df[c].isna().any()]
        found += [f"None in {c}" for c in df.columns if df[c].astype(str).isin(["None", "nan", "<NA>"]).any()]
    for kind in ("markdown", "caption", "success", "info", "warning", "error", "subheader"):
        found += [f"{kind}: {e.value[:80]}" for e in getattr(at, kind) if "None" in str(e.value)]
    found += [f"metric {m.label}" for m in at.metric if "None" in str(m.value)]
    return found


def every_page_readable(at: AppTest) -> None:
    for page in PAGES:
        _open(at, page)
        _no_exception(at)
        assert not unreadable(at), (page, unreadable(at))


@pytest.mark.slow
def test_no_page_shows_none_or_raw_column_names(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(run_dir.parent, monkeypatch)
    every_page_readable(at)
    _open(at, "Frontier")
    table = next(d.value for d in at.dataframe if "status" in d.value.columns)
    peers = table.loc[table.kind == "peer"]
    assert len(peers) == 2 and peers.status.str.contains("within noise|beyond both spreads").all()
    assert peers.status.str.contains("the same plan as rule segments_2").any()
    assert any("both spreads" in c.value for c in at.caption)  # the noise rule, said on the page


def test_empty_folder_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(tmp_path, monkeypatch)
    _no_exception(at)
    assert "No runs under" in at.info[0].value
    assert at.text_input and any(b.label == "Start search" for b in at.button)  # the new-search form is offered


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
    for bad, says in (("gpt?n_layer=0", "n_layer=0 of workload 'gpt' must be at least 1"),
                      ("gpt?n_layer=-3", "n_layer=-3 of workload 'gpt' must be at least 1"),
                      ("cnn?batch_size=0", "batch_size=0 of workload 'cnn' must be at least 1"),
                      ("gpt/tiny?dropout=1.5", r"dropout=1.5 of workload 'gpt' must be in \[0, 1\)")):
        with pytest.raises(CkptSearchError, match=says):  # the CLI's check (env.workloads.spec), the form's too
            start_search(bad, 1, 1, tmp_path)
    with pytest.raises(CkptSearchError, match="--memory-cap -5"):  # the CLI's own parse_config on the arguments
        search_command("gpt/tiny", 1, 1, tmp_path, "r2", Options(1, 1, memory_cap=(-5.0,)))
    bf16 = search_command("gpt/tiny", 1, 1, tmp_path, "r3", Options(1, 1, precision="bf16-mixed"))
    assert bf16[bf16.index("--precision") + 1] == "bf16-mixed" and "--precision" not in cmd
    assert not any(tmp_path.iterdir())  # nothing started, no folder made
    at = _app(tmp_path, monkeypatch)
    at.selectbox(key="precision").set_value("bf16-mixed").run()  # the form's precision reaches the command shown
    assert "--precision bf16-mixed" in at.code[0].value
    at.text_input[0].set_value("gpt/tiny?precision=16-mixed").run()  # the flag given over the spec wins, as in the CLI
    shown = at.code[0].value
    assert not at.error and "--workload 'gpt/tiny?precision=16-mixed' --precision bf16-mixed --agents" in shown
    at.selectbox(key="precision").set_value("32")
    at.text_input[0].set_value("gpt/huge").run()
    _no_exception(at)
    assert "unknown preset 'huge'" in at.error[0].value


def test_a_workload_file_is_checked_before_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(2, 1), (torch.ones(1, 2),)\n")
    assert resolve_workload("mine.py:make", cwd=tmp_path) == f"{tmp_path / 'mine.py'}:make"  # absolute: where the user is
    for bad, says in (("missing.py:make", "does not exist"), ("mine.py:build", "defines no 'build'; define build()"),
                      ("nosuchpackage.models:make", "no module 'nosuchpackage'")):
        with pytest.raises(CkptSearchError, match=says) as e:
            resolve_workload(bad, cwd=tmp_path)
        assert "\n" not in str(e.value)
    (tmp_path / "broken.py").write_text("def make(:\n")
    with pytest.raises(CkptSearchError, match="syntax error on line 1"):
        resolve_workload("broken.py:make", cwd=tmp_path)
    runs = tmp_path / "runs"
    runs.mkdir()
    at = _app(runs, monkeypatch)
    at.text_input[0].set_value(str(tmp_path / "missing.py") + ":make")
    at.button[0].click().run()
    _no_exception(at)
    assert "does not exist" in at.error[0].value and not any(runs.iterdir()), "refused before anything started"


@pytest.mark.slow
def test_a_search_started_from_the_form_becomes_the_shown_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Submitting the form after the sidebar's run picker exists must not touch the picker's state in the
    same run of the script (StreamlitAPIException); the new run is shown from the next one."""
    runs = tmp_path / "runs"
    shutil.copytree(cached_run("gpt/tiny"), runs / "a-finished")
    at = _open(_app(runs, monkeypatch), "New search")
    tab = at.tabs[4]
    tab.text_input[0].set_value("gpt/tiny")
    tab.number_input[1].set_value(8)
    tab.button[0].click().run()
    started = [p for p in runs.iterdir() if p.name != "a-finished"]
    try:
        _no_exception(at)
        assert len(started) == 1 and at.selectbox(key="run_choice").value == started[0].name
        assert "waiting for the search to write its store" in at.caption[0].value or _opening_tab(at) == "Live"
    finally:
        stop_search(int(at.session_state["started"].split()[2].rstrip(":")))  # "started pid N: command"


def stop_search(pid: int) -> None:
    """Kill a search started from the dashboard with its Ray processes (its own process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def test_a_failed_run_shows_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    early = tmp_path / "b-failed-early"  # stopped before it wrote a store
    early.mkdir()
    (early / "search.log").write_text("starting\nerror: workload file 'x.py' does not exist; check the path\n")
    at = _app(tmp_path, monkeypatch)
    _no_exception(at)
    assert "x.py' does not exist" in at.error[0].value and not at.info
    assert "failed" in at.selectbox(key="run_choice").format_func("b-failed-early")


@pytest.mark.slow
def test_a_run_that_failed_after_its_store_shows_the_log_error(run_dir: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    failed = tmp_path / "runs" / "failed-run"
    shutil.copytree(run_dir, failed)
    with RunStore(failed / STORE_NAME) as s:
        s.set_meta("status", "failed")
    (failed / "search.log").write_text("profiling\nerror: factory make() raised ValueError: bad shape; fix the factory\n")
    at = _app(failed.parent, monkeypatch)
    _no_exception(at)
    assert "factory make() raised ValueError: bad shape" in at.error[0].value
    assert not any("profiling the model" in i.value for i in at.info)


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

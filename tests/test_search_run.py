"""The search service end to end: real workloads, real Ray, a real SQLite store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from pathlib import Path

import pytest

from agents.ppo import AgentConfig
from search.engine.phases.deciding import CONFIRMING_MEASUREMENTS, DECIDING_MEASUREMENTS
from search.records.peer_verdicts import VERDICT_MEASUREMENTS
from search.engine.phases.rounds import ANSWER_ROUNDS
from search.records import meta
from search.records.config import parse_config
from search.records.ranking import measurements_of
from search.records.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
TINY = ["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "256", "--chunk-timesteps", "128",
        "--max-measurements", "14", "--repeats", "2", "--no-progress", "--no-batch-scaling", "--evaluators", "1"]


def _run_cli(args: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search.run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.mark.slow
def test_tiny_search_writes_a_measured_frontier(tmp_path, ray_session, capsys):
    from search.run import main

    assert main([*TINY, "--out", str(tmp_path), "--name", "t1", "--batch-scaling", "--reference-every", "0.001"]) == 0
    run_dir = tmp_path / "t1"
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(run_dir)
    front = json.loads((run_dir / "frontier.json").read_text())
    assert "## Where the time went" in (run_dir / "report.md").read_text()
    assert front["points"], "the frontier has points"
    for p in front["points"]:
        assert p["measured"] is True and p["peak_bytes"] > 0 and p["step_seconds"] > 0
        assert set(p["plan"]) == set(front["units"])
    peaks = [p["peak_bytes"] for p in front["points"]]
    times = [p["step_seconds"] for p in front["points"]]
    assert peaks == sorted(peaks) and times == sorted(times, reverse=True)  # a frontier: less memory, more time
    rule = front["readable"]  # no point shown has a plan beside it, within the tolerance, faster beyond the noise
    for a in front["points"]:
        assert not any(b["peak_bytes"] <= a["peak_bytes"] + rule["memory_tolerance_bytes"]
                       and b["step_seconds"] < a["step_seconds"] * (1 - rule["timing_noise"]) for b in front["points"])
    with RunStore(run_dir, readonly=True) as s:
        assert s.read(meta.STATUS) == "finished"
        assert 0 < s.count(measured_only=True) <= 14
        assert s.count() > s.count(measured_only=True)  # agents' predicted plans are recorded too
        assert {p["agent"] for p in s.progress()} == {"agent_0", "agent_1"}
        rollout = AgentConfig().episodes_per_rollout * len(front["units"])  # PPO trains whole rollouts only
        assert all(256 - rollout < p["timesteps"] <= 256 for p in s.progress())
        phases, busy = s.read(meta.PHASE_SECONDS), s.read(meta.EVALUATOR_SECONDS)  # where the wall time went
        assert {"Ray start", "profile", "rules", "training", "measuring", "deciding passes", "report"} <= set(phases)
        assert all(v >= 0 for v in phases.values()) and busy["plans"] > 0 and busy["reference_measurements"] >= 2
        apart = [v["record"] for v in s.read(meta.PEERS).values() if not v.get("plan")]  # peers measured as such
        assert busy["plan_measurements"] + busy["reference_measurements"] == sum(
            m.n_measurements for m in [*s.measured(), *apart])
        # the store's frontier is shown or left out; a plan shown beside it is a confirmed one shown in place of
        # a plan not confirmed
        unconfirmed = json.loads((run_dir / "report.json").read_text())["left_out"]["unconfirmed"]
        assert s.snapshots() and 0 <= len(front["points"]) + len(rule["left_out"]) - s.snapshots()[-1][
            "frontier_size"] <= unconfirmed
        assert set(s.read(meta.RULES)) >= {"none", "all", "every_2", "sqrt_n"}
        # every rule measured once; again in the deciding passes, and if on the frontier, in the confirming ones
        remeasured, confirmed = s.read(meta.REMEASURED), s.read(meta.CONFIRMED) or []
        assert all(s.get(d).measurement.n_measurements == 1 + remeasured.count(d) + confirmed.count(d)
                   for d in s.read(meta.RULES).values() if d != s.read(meta.BASELINE_DIGEST))
        assert s.read(meta.BASELINE_DIGEST) in remeasured
        # measurements were left after training (7-10 of 14 are spent): the agents answered the last ones
        answers, spent = s.read(meta.ANSWER_ROUNDS), s.count(measured_only=True)
        assert answers or spent >= 14, "the agents never saw the last round's measurements"
        assert answers is None or answers[-1]["proposed"] == 0 or len(answers) == ANSWER_ROUNDS or spent >= 14
        assert answers is None or all(0 <= a["measured"] <= a["proposed"] for a in answers)
        # every sample carries the reference measured before it; the baseline was measured again as the reference
        base = s.get(s.read(meta.BASELINE_DIGEST)).measurement
        assert all(m.is_paired for m in s.measured()) and base.n_measurements >= 3
        # and once more after everything else, so the final passes' plans have a reference after them too
        last: dict[str, int] = {}
        for who, n, _ in (part for m in s.measured() for part in measurements_of(m) or []):
            last[who] = max(last.get(who, 0), n)
        who, n, _ = measurements_of(base)[-1]
        assert last[who] == n
        # the deciding passes: every plan that decides the frontier measured once side by side; then every
        # frontier plan confirmed, and reported on its confirming measurements alone (the baseline on all of its)
        assert s.read(meta.DECIDED_FROM) and all(remeasured.count(d) == DECIDING_MEASUREMENTS for d in remeasured
                                                 if not d.startswith("peer:"))  # a peer: again beside a moved answer
        assert sum(s.read(meta.DECIDING_PASSES), []) == remeasured
        since = s.read(meta.CONFIRMED_FROM)
        by_plan = {tuple(m.actions): m for m in s.measured()}
        assert len(front["points"]) > 1 and since
        for p in front["points"]:
            m = by_plan[tuple(p["plan"][u] for u in front["units"])]
            late = [n for who, n, _ in measurements_of(m) if n >= since.get(who, 0)]
            if m.digest == base.digest:
                assert p["n_measurements"] == m.n_measurements
            else:  # more where it answers a peer the passes told apart from it (the verdict rounds)
                assert p["n_measurements"] == len(late) == confirmed.count(m.digest)
                assert CONFIRMING_MEASUREMENTS <= p["n_measurements"] <= VERDICT_MEASUREMENTS
        # the peers: one that is a plan of ours is that plan, measured as a plan (never as itself); the others are
        # measured as themselves in the deciding and confirming passes, each right after the plan that answers it
        peers, verdicts = s.read(meta.PEERS), {v["peer"]: v for v in front["peers"]}
        assert set(verdicts) == set(peers) >= {"checkpoint-sequential-2", "torchtitan-op-sac"}
        assert verdicts["checkpoint-sequential-2"]["plan"] == s.read(meta.RULES)["segments_2"]
        assert verdicts["checkpoint-sequential-2"]["verdict"] != "faster"  # a plan of ours cannot beat our frontier
        op = peers["torchtitan-op-sac"]["record"]
        assert op.n_measurements == 1 + remeasured.count(op.digest) + confirmed.count(op.digest)
        assert remeasured.count(op.digest) >= DECIDING_MEASUREMENTS and confirmed.count(op.digest) >= 2
        # the answer its verdict names (as ranked after the passes) was measured in the same confirming passes
        answer = verdicts["torchtitan-op-sac"]["ours"]["digest"]
        assert confirmed.count(answer) >= CONFIRMING_MEASUREMENTS
        for v in front["peers"]:  # a verdict of faster or slower rests on the verdict rounds' measurements
            if v["verdict"] in ("faster", "slower"):
                assert min(v["measured"]["n_measurements"], v["ours"]["n_measurements"]) >= VERDICT_MEASUREMENTS
        # batch scaling: frontier plans at half the batch, each one row of the store at that micro-batch
        scaling = s.measured_at_micro_batches()
        assert scaling and {b for b, _ in scaling} == {1} and s.read(meta.BATCH_SIZE) == 2
        assert all(m.n_measurements == 1 and m.sources == ["batch-scaling"] for _, m in scaling)
        fastest = min(front["points"], key=lambda p: p["step_seconds"])  # no checkpointing is priced too
        assert by_plan[tuple(fastest["plan"][u] for u in front["units"])].digest in {m.digest for _, m in scaling}
    from dashboard.data import load_run

    priced = load_run(run_dir).batch_scaling  # the price page: each plan at half the batch and at its own
    assert scaling and all([p["batch_size"] for p in priced[m.digest]] == [1, 2] for _, m in scaling)
    assert "each taken relative to the baseline measured beside it" in (run_dir / "report.md").read_text()
    assert list((run_dir / "plans").glob("budget_*MB.json"))
    assert (run_dir / "tb").is_dir()
    # config.json repeats the run
    cfg = parse_config(["--config", str(run_dir / "config.json")])
    assert cfg.workload == "gpt/tiny" and cfg.agents == 2


def _killed_once(run_dir: Path, cfg, ray, victim, processes: list | None = None) -> tuple[dict, object]:
    """Fault injection: a search through the driver (``processes``: its agents' processes, started before) in which
    the actor process ``victim(status)`` names is killed after the first round; its report and its ledger."""
    from search.engine.driver import Driver, prepare
    from search.engine.evaluator_pool import EvaluatorPool
    from search.engine.ledger import Ledger
    from search.engine.progress import RoundStatus
    from search.engine.report import write_outputs

    killed = []

    def kill_once(status: RoundStatus) -> None:
        if not killed:
            ray.kill(victim(status), no_restart=True)
            killed.append(1)

    run_dir.mkdir()
    with RunStore(run_dir / "store.sqlite") as store:
        store.write(meta.CONFIG, json.loads(cfg.to_json()))
        pool = EvaluatorPool(cfg)
        ledger = Ledger(prepare(store, pool), store)
        Driver(cfg, run_dir, ledger, pool, on_round=kill_once, agent_processes=processes).run()
        report = write_outputs(cfg, run_dir, ledger)
    assert killed
    return report, ledger


@pytest.mark.slow
def test_killed_agent_run_finishes_and_says_so(tmp_path, ray_session):
    from search.records.config import SearchConfig

    cfg = SearchConfig(workload="gpt/tiny", agents=2, timesteps=384, chunk_timesteps=128, max_measurements=12,
                       repeats=2, progress=False, batch_scaling=False).validate()
    run_dir = tmp_path / "killed"
    report, ledger = _killed_once(run_dir, cfg, ray_session,  # agent_1's actor process
                                  lambda status: next(s.handle for s in status.agents if s.name == "agent_1"))
    assert any("agent_1 died" in e for e in report["events"])
    assert "agent_1 died" in (run_dir / "report.md").read_text()
    agents = {a["agent"]: a for a in report["agents"]}
    rollout = AgentConfig().episodes_per_rollout * len(ledger.codec.units)  # PPO trains whole rollouts only
    assert agents["agent_1"]["restarts"] == 1 and 384 - rollout < agents["agent_1"]["timesteps"] <= 384
    assert agents["agent_0"]["status"] == "finished"


@pytest.mark.slow
def test_a_process_hosting_two_agents_dies_and_both_restart_in_what_it_held(tmp_path, ray_session):
    """Four agents in two processes (two cores): one process killed after the first round takes two agents with
    it; each restarts in a process of its own, on one agent's share of the cores, so both fit in the share the
    dead process held, and the run finishes."""
    from search.engine.agent_pool import start_processes
    from search.records.config import SearchConfig

    cfg = SearchConfig(workload="gpt/tiny", agents=4, timesteps=256, chunk_timesteps=128, max_measurements=12,
                       repeats=2, progress=False, batch_scaling=False, evaluators=1).validate()
    processes = start_processes(cfg)
    assert len(processes) == 2
    report, _ = _killed_once(tmp_path / "hosted", cfg, ray_session, lambda status: processes[1],  # agents 1 and 3
                             processes)
    agents = {a["agent"]: a for a in report["agents"]}
    assert {n: a["restarts"] for n, a in agents.items()} == {
        "agent_0": 0, "agent_1": 1, "agent_2": 0, "agent_3": 1}
    assert all(a["status"] == "finished" for a in agents.values())


@pytest.mark.slow
@pytest.mark.parametrize("hosted", [False, True], ids=["a-process-each", "one-process"])
def test_same_seed_same_search_on_a_fixed_profile(tmp_path, ray_session, monkeypatch, hosted):
    """--reward model from a fixed profile (tests/data): the proposals, in order, and the measured
    peaks are the pinned ones (same seed, same search). The pin held across the search's redesign
    into a driver plus a ledger; it was taken again when the agents became budget-conditioned, and when
    the env's observation gained the open chain region's entries (the agents' plans changed, the rules not). When
    gpt's final norm and head became the loss unit ``lm_loss``, the profile's fingerprint and the digests were
    rewritten for the renamed parameters (the plans, their order and the peaks unchanged), and the units are given
    as the profile's (``--units blocks``). When torchtitan's layer SAC joined the eager peers, its every-2-layers
    plan, a plan of ours, joined the proposals after the rules' (the rules' plans, their order and peaks unchanged).
    ``hosted``: both agents in one process (``AgentProcess``, each on its own random state) propose the same."""
    from search.engine import agent_pool
    from search.run import main

    if hosted:
        monkeypatch.setattr(agent_pool, "processes_for", lambda ray, cfg: 1)

    pinned = json.loads((DATA / "search_gpt_tiny_model_seed0.json").read_text())
    args = ["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "512", "--chunk-timesteps", "256",
            "--max-measurements", "12", "--repeats", "1", "--no-progress", "--no-batch-scaling", "--reward", "model",
            "--seed", "0", "--out", str(tmp_path), "--name", "pin", "--units", "blocks",  # the profile's units
            "--evaluators", "1"]
    run = tmp_path / "pin"
    run.mkdir()
    with RunStore(run / "store.sqlite") as s:
        s.write(meta.CONFIG, json.loads(parse_config(args).to_json()))
        s.write(meta.PROFILE, json.loads((DATA / "gpt_tiny_profile.json").read_text()))
    assert main(["--resume", str(run), "--no-progress"]) == 0
    with RunStore(run, readonly=True) as s:
        proposals = [[p.digest, p.actions, p.source] for p in s.plans()]
        peaks = {m.digest: m.peak_bytes for m in s.measured()}
        rules = set(s.read(meta.RULES).values())
    assert proposals == pinned["proposals"]
    common = set(peaks) & set(pinned["peaks"])
    assert rules <= common  # which other plans are measured depends on measured times
    assert {d: peaks[d] for d in common} == {d: pinned["peaks"][d] for d in common}


@pytest.mark.slow
def test_ctrl_c_then_resume_loses_and_repeats_nothing(tmp_path):
    # the 4th measurement falls among the rules (gpt/tiny has 7), so the agents' start and training are still
    # ahead when the interrupt lands, however busy the machine
    args = ["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "1024", "--chunk-timesteps", "256",
            "--max-measurements", "16", "--repeats", "2", "--no-progress", "--no-batch-scaling", "--reward", "hybrid",
            "--out", str(tmp_path), "--name", "r"]
    proc = subprocess.Popen([sys.executable, "-m", "search.run", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    store_path = tmp_path / "r" / "store.sqlite"
    deadline = time.time() + 480  # Ray's start alone took 35 s once in the suite under load (3-5 s alone)
    n = 0
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.25)
        if store_path.exists():
            try:
                n = sqlite3.connect(f"file:{store_path}?mode=ro", uri=True).execute(
                    "SELECT COUNT(*) FROM evaluations WHERE measured = 1").fetchone()[0]
            except sqlite3.OperationalError:
                continue
            if n >= 4:
                break
    assert n >= 4, "the run measured plans before the interrupt"
    assert proc.poll() is None, "the run finished before it could be interrupted; give it more timesteps"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err
    assert _left_in_session(proc.pid) == [], "a process the run started outlived it"  # when the driver ended
    with RunStore(store_path, readonly=True) as s:
        assert s.read(meta.STATUS) == "interrupted"
        before = {m.digest: m.step_seconds_samples for m in s.measured()}
    assert len(before) >= 4
    done = _run_cli(["--resume", str(tmp_path / "r"), "--no-progress"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "has been marked dead" not in done.stderr  # the raylet's news of the instance the driver ends
    with RunStore(store_path, readonly=True) as s:
        after = {m.digest: m.step_seconds_samples for m in s.measured()}
        assert s.read(meta.STATUS) == "finished"
        # the deciding passes over frontier points, near misses, the baseline; the confirming passes over the frontier
        again = s.read(meta.REMEASURED) + (s.read(meta.CONFIRMED) or [])
        base = s.read(meta.BASELINE_DIGEST)
        assert base in again
    for digest, samples in before.items():
        assert len(set(samples)) == len(samples), "a measurement was recorded twice"
        assert after[digest][:len(samples)] == samples, "samples measured before the interrupt were lost"
        if digest == base:  # the final pass, and the resumed Evaluator's reference before its first plan
            assert len(after[digest]) >= len(samples) + 4 and len(after[digest]) % 2 == 0
        elif digest in again:  # each pass that took it adds one more measurement (of two samples)
            assert len(after[digest]) == len(samples) + 2 * again.count(digest)
        else:
            assert after[digest] == samples, "a plan measured before the interrupt was measured again"
    assert len(after) <= 16


def _left_in_session(sid: int) -> list[str]:
    """The live processes of session ``sid`` (a run started in a session of its own): the local Ray instance's
    GCS, raylet, workers and agents, unless the run ended them (``search.engine.ray_session.end_local_processes``;
    Ray's dashboard and runtime-env agents outlived every run by minutes before it)."""
    import psutil

    left = []
    for p in psutil.process_iter(["pid", "name", "status"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(p.info["name"])
        except (ProcessLookupError, PermissionError):
            continue
    return left


def test_corrupt_store_is_refused_and_left_untouched(tmp_path):
    run_dir = tmp_path / "bad"
    run_dir.mkdir()
    garbage = b"this is not a sqlite database" * 100
    (run_dir / "store.sqlite").write_bytes(garbage)
    done = _run_cli(["--resume", str(run_dir), "--no-progress"])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "corrupt" in lines[0] and "start a new run" in lines[0]
    assert (run_dir / "store.sqlite").read_bytes() == garbage


def test_bad_flags_are_one_line_errors(tmp_path):
    done = _run_cli(["--workload", "nope", "--out", str(tmp_path), "--no-progress"])
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "unknown workload 'nope'" in done.stderr
    done = _run_cli(["--agents", "0", "--out", str(tmp_path)])
    assert done.returncode == 2 and "--agents must be at least 1" in done.stderr






















def test_run_ids_are_readable() -> None:
    from search.records.runs import run_id

    at = time.mktime((2026, 12, 1, 12, 0, 0, 0, 0, -1))
    assert run_id("models/unet.py:build", at) == "unet-build-20261201-120000"
    assert run_id("pkg.models:make?width=64", at) == "models-make-20261201-120000"
    assert run_id("gpt/tiny?n_layer=2", at) == "gpt-tiny-n_layer-2-20261201-120000"


def test_a_bad_option_value_is_one_line(tmp_path):
    done = _run_cli(["--workload", "gpt?n_layer=abc", "--out", str(tmp_path)])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "n_layer" in done.stderr and "abc" in done.stderr
    assert not any(tmp_path.iterdir()), "no run folder for a bad spec"


@pytest.mark.slow
def test_overlapped_measurement_records_every_plan_once(tmp_path, ray_session):
    """--overlap on (what GPU Evaluators do): agents train while the round's plans are measured in a
    thread; the run finishes, each measurement is recorded once, the report says which mode ran."""
    from search.run import main

    assert main([*TINY, "--overlap", "on", "--out", str(tmp_path), "--name", "ov"]) == 0
    records = _every_measurement_once(tmp_path / "ov" / "store.sqlite")
    assert 0 < len(records) <= 14
    assert "overlapped: agents train while" in (tmp_path / "ov" / "report.md").read_text()


@pytest.mark.slow
def test_measured_reward_records_what_the_agents_measured(tmp_path, ray_session):
    """--reward measured: each agent measures its new plans through an Evaluator itself; the driver
    drains them into the store, credited to the agent that measured them, each once."""
    from search.run import main

    assert main([*TINY, "--reward", "measured", "--timesteps", "128",
                 "--out", str(tmp_path), "--name", "m"]) == 0
    records = _every_measurement_once(tmp_path / "m" / "store.sqlite")
    assert any(s.startswith("agent_") for m in records for s in m.sources), "the agents' own measurements are in"
    assert json.loads((tmp_path / "m" / "frontier.json").read_text())["points"]


def test_the_measurement_budget_grows_with_the_units_and_a_negative_one_is_refused():
    from env.data.errors import CkptSearchError
    from search.records.config import parse_config

    assert parse_config([]).measurement_budget(6) == 23 and parse_config([]).measurement_budget(48) == 44
    assert parse_config(["--max-measurements", "12"]).measurement_budget(96) == 12  # given: a cap as it is
    with pytest.raises(CkptSearchError) as e:
        parse_config(["--max-measurements", "-1"])
    assert "\n" not in str(e.value) and "--max-measurements must be 0 (sized by the units) or more" in str(e.value)
    with pytest.raises(CkptSearchError) as e:
        parse_config(["--reference-every", "-5"])
    assert "\n" not in str(e.value) and "--reference-every must be 0 (raw times) or more seconds" in str(e.value)

def _every_measurement_once(store_path: Path) -> list:
    with RunStore(store_path, readonly=True) as s:
        records = s.measured()
    ids = [i for m in records for i in m.measurement_ids]
    assert len(ids) == len(set(ids)), "a measurement was recorded twice"
    for m in records:
        assert len(m.measurement_ids) == len(m.evaluators) >= 1
    return records

"""Faults the search outlives or names: a configuration that kills an FSDP group twice is not fitting, as on one
Evaluator; an allocation that fails on a rank is the group's not-fitting record; a micro-batch above one that did
not fit is recorded as not fitting without a step (tests/data/memory_models.py holds the models); an agent that
never answers and a Ray cluster that never answers each end the run in one line (search/engine/deadlines.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from env.data.errors import CkptSearchError
from env.data.types import PlanSource
from env.runtime.apply import plan_for
from env.workloads.workload import load_workload
from search.records import meta
from search.records.config import SearchConfig
from search.records.store import STORE_NAME, RunStore
from tests.profiles import synthetic_profile

ROOT = Path(__file__).resolve().parents[1]
MODELS = "tests/data/memory_models.py"
UNITS = [f"blocks.{i}" for i in range(4)]
KEEP = ("keep",) * 4


def _recompute(block: int) -> tuple[str, ...]:
    return tuple("recompute" if i == block else "keep" for i in range(4))


def test_a_group_record_is_out_of_memory_where_one_rank_ran_out_and_says_the_bytes_it_asked_for() -> None:
    from env.data.measured import MeasuredPlan
    from env.data.ranks import merge_ranks

    def rank(peak: int, samples: list[float], oom: bool = False, asked: int | None = None) -> MeasuredPlan:
        return MeasuredPlan(workload="w", batch_shape="0:4x1x32", digest="d", actions=["keep"] * 4, sources=["s"],
                            peak_bytes=peak, live_before_bytes=10, step_seconds_samples=samples, clock="thread-cpu",
                            device="cpu (1 threads)", torch_version="t", oom=oom, requested_bytes=asked)

    merged = merge_ranks([rank(100, [0.1, 0.2]), rank(1 << 40, [], oom=True, asked=1 << 52)])
    assert merged.oom and merged.step_seconds_samples == [] and merged.peak_bytes == 1 << 40
    assert merged.requested_bytes == 1 << 52  # rank 1's failed allocation, though rank 0 stepped
    assert merge_ranks([rank(100, [0.1]), rank(120, [0.3])]).requested_bytes is None


@pytest.mark.slow
def test_an_fsdp_group_killed_twice_by_a_plan_records_it_as_not_fitting_and_a_rank_out_of_memory_too(
        ray_session) -> None:
    """Two gloo ranks of ``recompute_fails``: block 1 recomputed fails its allocation on both ranks (the group's
    record is not fitting, no death), block 2 recomputed kills a rank's process (the group is restarted, and
    after its second death the plan is recorded as not fitting); the group measures on after both."""
    from search.engine.batch_book import Job
    from search.engine.evaluator_pool import EvaluatorPool

    cfg = SearchConfig(workload=f"{MODELS}:recompute_fails", units=UNITS, actions=["keep", "recompute"], repeats=1,
                       device="cpu", fsdp=2).validate()
    pool = EvaluatorPool(cfg)
    source = PlanSource.rule("test")
    jobs = [Job(KEEP, source=source), Job(_recompute(1), source=source), Job(_recompute(2), source=source),
            Job(KEEP, source=source, again=True)]
    kept, short, killed, again = pool.measure(jobs, lambda m: m)
    assert not kept.oom and kept.step_seconds_samples and kept.clock == "thread-cpu, slowest of 2 ranks"
    assert short.oom and short.requested_bytes == 1 << 52 and short.step_seconds_samples == []
    assert killed.oom and killed.requested_bytes is None and killed.step_seconds_samples == []
    assert killed.device.endswith("FSDP2 x2 ranks") and killed.digest != kept.digest
    deaths = [e for e in pool.events if "died" in e]
    assert len(deaths) == 2 and all("RankDiedError" in e and "plan (" in e for e in deaths), pool.events
    assert deaths[-1].endswith("recorded as not fitting, as an out-of-memory kill"), pool.events
    assert pool.slots[0].alive and pool.slots[0].restarts == 2
    assert not again.oom and again.step_seconds_samples and again.digest == kept.digest  # the group measures on


@pytest.mark.slow
def test_a_rank_out_of_memory_that_leaves_the_other_waiting_stops_the_group_and_twice_is_not_fitting(
        ray_session) -> None:
    """Block 1 recomputed fails its allocation on rank 1 alone, while rank 0 waits for it in a collective: the
    group stops its ranks after its grace (``rank_grace_s``: the test session sets it short) instead of waiting for gloo's timeout, is restarted as after a
    death, and after the second time the plan is recorded as not fitting."""
    from env.measure.fsdp import GROUP_TIMEOUT_S
    from search.engine.batch_book import Job
    from search.engine.evaluator_pool import EvaluatorPool
    from search.engine.fsdp.group import rank_grace_s

    cfg = SearchConfig(workload=f"{MODELS}:recompute_fails_on_one_rank", units=UNITS, actions=["keep", "recompute"],
                       repeats=1, device="cpu", fsdp=2).validate()
    pool = EvaluatorPool(cfg)
    start = time.monotonic()
    (short,) = pool.measure([Job(_recompute(1), source=PlanSource.rule("test"))], lambda m: m)
    assert 2 * rank_grace_s() <= time.monotonic() - start < GROUP_TIMEOUT_S  # gloo's own timeout was never waited
    assert short.oom and short.requested_bytes is None and short.step_seconds_samples == []
    deaths = [e for e in pool.events if "died" in e]
    assert len(deaths) == 2 and all("rank 1 of 2 ran out of memory and ranks [0] were left waiting" in e
                                    for e in deaths), pool.events
    assert deaths[-1].endswith("recorded as not fitting, as an out-of-memory kill")


def _digest(actions: tuple[str, ...]) -> str:
    w = load_workload(f"{MODELS}:blocks", device="cpu")  # the same modules as every memory model: the same digest
    return plan_for(w.model, UNITS, list(actions)).digest


@pytest.mark.slow
@pytest.mark.parametrize("factory, deaths, asked", [("killed_above", 2, None), ("too_big_above", 0, 1 << 52)])
def test_micro_batches_above_one_that_did_not_fit_are_recorded_as_not_fitting_without_a_step(
        tmp_path: Path, ray_session, factory: str, deaths: int, asked: int | None) -> None:
    """Above 8 samples a step of the model fails its allocation, or kills its process: asked for 64, 16, 4 and 32
    samples, the search measures 4, finds 16 not fitting (after two deaths where it kills) and records 32 and 64
    as not fitting without trying them: no more deaths, and no allocation asked for there."""
    from search.engine.batch_book import BatchTerms, Job
    from search.engine.evaluator_pool import EvaluatorPool
    from search.engine.ledger import Ledger
    from search.engine.measurer import Measurer
    from search.engine.phases.prepare import prepare

    cfg = SearchConfig(workload=f"{MODELS}:{factory}?fits=8", units=UNITS, actions=["keep", "recompute"], repeats=1,
                       device="cpu", evaluators=1).validate()  # one Evaluator: the deaths counted are its
    pool = EvaluatorPool(cfg)
    with RunStore(tmp_path / STORE_NAME) as store:
        measurer = Measurer(Ledger(prepare(store, pool), store), pool, overlap=False)
        measurer.batch_terms = BatchTerms(base=4)
        assert {measurer.digest_at(Job(p, 4)) for p in (KEEP, _recompute(0))} == {_digest(KEEP),
                                                                                      _digest(_recompute(0))}
        sizes = [64, 16, 4, 32]
        got = dict(zip(sizes, measurer.measure_at([Job(KEEP, b, "x") for b in sizes])))
        assert not got[4].oom and got[4].step_seconds_samples
        assert got[16].oom and got[16].requested_bytes == asked
        for b in (32, 64):
            assert got[b].oom and got[b].requested_bytes is None and got[b].step_seconds_samples == []
            assert measurer.smaller_not_fitting(Job(KEEP, b, "x")) == 16
        assert len([e for e in pool.events if "died" in e]) == deaths, pool.events
        assert all("micro-batch 16" in e for e in pool.events if "died" in e)
        # another plan's sizes are its own: recompute at 16 is tried (and does not fit), not skipped for keep's
        assert measurer.smaller_not_fitting(Job(_recompute(0), 16, "x")) is None
        (other,) = measurer.measure_at([Job(_recompute(0), 16, "x")])
        assert other.oom and other.requested_bytes == asked
    assert len([e for e in pool.events if "died" in e]) == 2 * deaths


@pytest.mark.slow
def test_an_agent_call_that_never_returns_ends_in_one_line_naming_the_agent(tmp_path: Path, ray_session,
                                                                           capsys) -> None:
    """The real PPO agent started as a search starts it, its ``train`` waiting forever
    (tests/data/stuck_agents.py): a round of 8 PPO steps is given --step-timeout (2 s) and 0.25 s a step."""
    from search.engine.agent_pool import AgentPool
    from search.engine.deadlines import DeadlineError
    from search.engine.ledger import Ledger, SearchSetup
    from tests.data.stuck_agents import StuckAgent

    cfg = SearchConfig(agents=1, timesteps=64, chunk_timesteps=8, step_timeout=2).validate()
    with RunStore(tmp_path / STORE_NAME) as store:
        agents = AgentPool(cfg, Ledger(SearchSetup.from_profile(synthetic_profile(4, 2, seed=0)), store), tmp_path,
                           agent=StuckAgent)
        agents.start([1000])  # its start (the actor, its policy) answers: only training never does
        start = time.monotonic()
        with pytest.raises(DeadlineError) as e:
            agents.train_round()
        seconds = time.monotonic() - start
    ray_session.kill(agents.slots[0].handle)
    line = str(e.value)
    assert line.startswith("the agents' calls (agent_0): a round of 8 PPO steps did not return within 4 s "
                           "(agent_0 had not answered);"), line
    assert "--step-timeout" in line and "--chunk-timesteps" in line and "\n" not in line
    assert 4 <= seconds < 30
    assert "waiting on the agents' calls (agent_0): a round of 8 PPO steps" in capsys.readouterr().err


@pytest.mark.slow
def test_joining_a_ray_cluster_that_never_answers_ends_the_run_in_one_line(tmp_path: Path) -> None:
    """``--address`` of a port nothing listens on: Ray retries it without end; the search waits ``RAY_JOIN``
    seconds (6 here, set before the run starts), says what it waits on, then fails in one line (exit 3, as every
    deadline), its status saying why."""
    from env.measure.fsdp import free_port

    address = f"127.0.0.1:{free_port()}"
    run = ("import search.engine.deadlines as d; d.RAY_JOIN = 6.0; import search.run as r; "
           f"r._exit(r.main(['--address', '{address}', '--out', r'{tmp_path}', '--name', 'j', '--no-progress']))")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", run], cwd=ROOT, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    assert done.returncode == 3, done.stderr[-2000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and ours[0].startswith(f"error: Ray's start, joining the cluster at --address {address} "
                                                 "did not return within 6 s; no Ray cluster answered there"), ours
    assert "leave --address out" in ours[0] and "Traceback" not in done.stderr
    assert any(line.startswith(f"waiting on Ray's start, joining the cluster at --address {address}")
               for line in done.stderr.splitlines())
    assert seconds < 60
    with RunStore(tmp_path / "j" / STORE_NAME, readonly=True) as s:
        assert s.read(meta.STATUS) == "failed: " + ours[0].removeprefix("error: ")


@pytest.mark.parametrize("value", ["soon", "0", "-5"])
def test_a_rank_grace_that_is_not_a_positive_number_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from search.engine.fsdp.group import RANK_GRACE_ENV, group_count, rank_grace_s

    monkeypatch.setenv(RANK_GRACE_ENV, "2.5")
    assert rank_grace_s() == 2.5
    monkeypatch.setenv(RANK_GRACE_ENV, value)
    with pytest.raises(CkptSearchError, match=f"{RANK_GRACE_ENV}='{value}' is not a positive number") as e:
        group_count(2, "cpu", 0, 1, 1, [{"Alive": True, "Resources": {"CPU": 2.0}}])
    assert "\n" not in str(e.value)

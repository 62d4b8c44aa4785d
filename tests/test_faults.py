"""Faults the search outlives or names: a configuration that kills an FSDP group twice is not fitting, as on one
Evaluator; an allocation that fails on a rank is the group's not-fitting record; a micro-batch above one that did
not fit is recorded as not fitting without a step (tests/data/memory_models.py holds the models)."""

from __future__ import annotations

from pathlib import Path

import pytest

from env.data.types import PlanSource
from env.runtime.apply import plan_for
from env.workloads.workload import load_workload
from search.records.config import SearchConfig
from search.records.store import STORE_NAME, RunStore

MODELS = "tests/data/memory_models.py"
UNITS = [f"blocks.{i}" for i in range(4)]
KEEP = ("keep",) * 4


def _recompute(block: int) -> tuple[str, ...]:
    return tuple("recompute" if i == block else "keep" for i in range(4))


@pytest.mark.slow
def test_an_fsdp_group_killed_twice_by_a_plan_records_it_as_not_fitting_and_a_rank_out_of_memory_too(
        ray_session) -> None:
    """Two gloo ranks of ``recompute_fails``: block 1 recomputed fails its allocation on both ranks (the group's
    record is not fitting, no death), block 2 recomputed kills a rank's process (the group is restarted, and
    after its second death the plan is recorded as not fitting); the group measures on after both."""
    from search.engine.evaluator_pool import EvaluatorPool

    cfg = SearchConfig(workload=f"{MODELS}:recompute_fails", units=UNITS, actions=["keep", "recompute"], repeats=1,
                       device="cpu", fsdp=2).validate()
    pool = EvaluatorPool(cfg)
    source = PlanSource.rule("test")
    jobs = [(KEEP, source, False), (_recompute(1), source, False), (_recompute(2), source, False), (KEEP, source, True)]
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
    from search.engine.evaluator_pool import EvaluatorPool
    from search.engine.throughput.batch_book import BatchBook, BatchJob, BatchMeasurer

    cfg = SearchConfig(workload=f"{MODELS}:{factory}?fits=8", units=UNITS, actions=["keep", "recompute"], repeats=1,
                       device="cpu").validate()
    pool = EvaluatorPool(cfg)
    digests = {KEEP: _digest(KEEP), _recompute(0): _digest(_recompute(0))}
    with RunStore(tmp_path / STORE_NAME) as store:
        measurer = BatchMeasurer(pool, BatchBook(store), None, lambda names: digests[tuple(names)], base=4)
        sizes = [64, 16, 4, 32]
        got = dict(zip(sizes, measurer.measure([BatchJob(KEEP, b, "x") for b in sizes])))
        assert not got[4].oom and got[4].step_seconds_samples
        assert got[16].oom and got[16].requested_bytes == asked
        for b in (32, 64):
            assert got[b].oom and got[b].requested_bytes is None and got[b].step_seconds_samples == []
            assert measurer.smaller_not_fitting(BatchJob(KEEP, b, "x")) == 16
        assert len([e for e in pool.events if "died" in e]) == deaths, pool.events
        assert all("micro-batch 16" in e for e in pool.events if "died" in e)
        # another plan's sizes are its own: recompute at 16 is tried (and does not fit), not skipped for keep's
        assert measurer.smaller_not_fitting(BatchJob(_recompute(0), 16, "x")) is None
        (other,) = measurer.measure([BatchJob(_recompute(0), 16, "x")])
        assert other.oom and other.requested_bytes == asked
    assert len([e for e in pool.events if "died" in e]) == 2 * deaths

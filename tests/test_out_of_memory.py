"""Not fitting is a result: a step whose allocation fails, or whose process the kernel kills, is recorded as
not fitting and the search goes on (tests/data/memory_models.py holds the models)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from env.data.plan import Action
from env.measure.micro_batch import AtMicroBatch
from env.measure.timeline import is_oom, requested_bytes
from env.workloads.workload import load_workload
from search.records import meta
from search.records.store import STORE_NAME, RunStore

MODELS = "tests/data/memory_models.py"
UNITS = [f"blocks.{i}" for i in range(4)]


def _at(factory: str) -> AtMicroBatch:
    w = load_workload(f"{MODELS}:{factory}", device="cpu")
    return AtMicroBatch(w, UNITS, [Action.KEEP, Action.RECOMPUTE], repeats=1)


def test_failed_allocations_are_out_of_memory_and_say_the_bytes_they_asked_for() -> None:
    with pytest.raises(RuntimeError) as cpu:
        torch.empty(1 << 52, dtype=torch.uint8)  # the CPU allocator's own error
    assert is_oom(cpu.value) and requested_bytes(cpu.value) == 1 << 52
    assert is_oom(MemoryError())
    cuda = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)")
    assert is_oom(cuda) and requested_bytes(cuda) == 2 << 30
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) and requested_bytes(ValueError()) is None


def test_a_step_the_cpu_allocator_refuses_is_a_not_fitting_record_and_the_next_size_still_measures() -> None:
    at = _at("too_big_above?fits=8")
    big = at.measure(["keep"] * 4, 16, None, "throughput:lowest", "m1")
    assert big.oom and big.requested_bytes == 1 << 52 and big.step_seconds_samples == []
    assert big.batch_shape.startswith("0:16x")
    small = at.measure(["keep"] * 4, 8, None, "throughput:lowest", "m2")  # the failed step left nothing behind
    assert not small.oom and small.peak_bytes > 0 and len(small.step_seconds_samples) == 1
    assert at.profile(16, None) is None  # a profile that does not fit is no profile, not the model's error


def test_inputs_that_cannot_be_allocated_at_a_micro_batch_do_not_fit_either() -> None:
    at = _at("inputs_too_big_above?fits=8")
    m = at.measure(["keep"] * 4, 16, None, "throughput:lowest", "m5")
    assert m.oom and m.requested_bytes == 1 << 52 and m.batch_shape == "16 samples (its inputs did not fit)"
    assert at.profile(16, None) is None and not at.measure(["keep"] * 4, 8, None, "", "m6").oom


def test_a_configuration_that_killed_its_evaluator_is_recorded_without_a_step() -> None:
    at = _at("killed_above?fits=8")  # a step above 8 samples would kill this process: none is run
    m = at.not_fitting(["recompute"] * 4, 32, None, "rule:all", "m3")
    assert m.oom and m.batch_shape.startswith("0:32x") and m.sources == ["rule:all"] and m.requested_bytes is None
    assert m.digest == at.measure(["recompute"] * 4, 4, None, "", "m4").digest  # the plan's own digest


@pytest.mark.slow
def test_an_evaluator_killed_on_a_micro_batch_is_restarted_and_the_size_recorded_as_not_fitting(tmp_path: Path,
                                                                                              ray_session) -> None:
    """The kernel's out-of-memory killer, as a forward that SIGKILLs its own process above 8 samples: the
    Evaluator is restarted after each death, the micro-batch it died on twice is recorded as not fitting, the
    events say so, and a size that fits is measured as usual meanwhile."""
    from search.engine.batch_book import BatchTerms, Job
    from search.engine.evaluator_pool import EvaluatorPool
    from search.engine.ledger import Ledger
    from search.engine.measurer import Measurer
    from search.engine.phases.prepare import prepare
    from search.records.config import SearchConfig

    cfg = SearchConfig(workload=f"{MODELS}:killed_above?fits=8", units=UNITS, actions=["keep", "recompute"],
                       repeats=1, device="cpu", evaluators=1).validate()  # one Evaluator: the deaths counted are its
    pool = EvaluatorPool(cfg)
    with RunStore(tmp_path / STORE_NAME) as store:
        measurer = Measurer(Ledger(prepare(store, pool), store), pool, overlap=False)
        measurer.batch_terms = BatchTerms(base=4)
        keep = ("keep",) * 4
        fits, killed = measurer.side_by_side([Job(keep, 4, "x"), Job(keep, 16, "x")], record=False)
    assert not fits.oom and fits.step_seconds_samples and killed.oom and killed.step_seconds_samples == []
    kills = [e for e in pool.events if "at micro-batch 16" in e]
    assert len(kills) == 2 and kills[-1].endswith("recorded as not fitting, as an out-of-memory kill"), pool.events
    assert pool.slots[0].alive and sum(s.restarts for s in pool.slots) == 2
    assert ray_session.get(pool.first.info.remote())["units"] == UNITS  # restarted, and measuring


@pytest.mark.slow
def test_a_throughput_search_whose_ladder_climbs_past_what_the_allocator_gives_finishes(tmp_path: Path,
                                                                                       ray_session) -> None:
    """The ladder climbs past 12 samples, where every step's allocation fails: the search finishes (exit 0),
    answers every cap, and the store and the report hold the sizes that did not fit."""
    from search.run import main

    caps = ["--memory-cap", "4", "8"]
    args = ["--workload", f"{MODELS}:too_big_above?fits=12&width=64&seq=64", *caps, "--agents", "1",
            "--timesteps", "128", "--chunk-timesteps", "128", "--max-measurements", "8", "--repeats", "1",
            "--no-progress", "--no-batch-scaling", "--peers", "none", "--throughput-timesteps", "0",
            "--out", str(tmp_path), "--name", "t"]
    assert main(args) == 0
    run = tmp_path / "t"
    with RunStore(run / STORE_NAME, readonly=True) as store:
        curve = store.read(meta.THROUGHPUT)
        book = [{"micro_batch": b, "record": m} for b, m in store.measured_at_micro_batches()]
        assert store.read(meta.STATUS) == "finished"
    assert curve is not None and all(row.answer is not None for row in curve.caps)
    assert all(row.answer.micro_batch <= 12 for row in curve.caps)
    failed = {r["micro_batch"] for r in book if r["record"].oom}
    assert failed and min(failed) > 12
    # a size tried asked the allocator for what it cannot give; one above a size of its plan that did not fit is
    # recorded as not fitting without a step (search.engine.measurer.Measurer.smaller_not_fitting),
    # unless another Evaluator took it before that size's record came back
    short = {(r["micro_batch"], r["record"].digest) for r in book if r["record"].oom}
    for r in (r for r in book if r["record"].oom):
        below = any(d == r["record"].digest and b < r["micro_batch"] for b, d in short)
        assert r["record"].requested_bytes in ((None, 1 << 52) if below else (1 << 52,)), (r["micro_batch"], r["record"])
    assert "Measured as not fitting this device" in (run / "report.md").read_text()

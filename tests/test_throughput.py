"""Throughput: workloads at any micro-batch, the per-unit fit in the micro-batch, the ladder and the peers'
largest micro-batch, the curve in frontier.json and the export of an answer with its micro-batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from env.cost.batch_fit import BatchFit
from env.cost.cost_model import CostModel
from env.data.errors import CkptSearchError, MeasurementError, WorkloadError
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan import Action, Plan
from env.data.types import MIB
from env.measure.measurement import measure
from env.measure.profiler import profile
from env.runtime.apply import plan_for
from env.units.choice import resolve_units
from env.workloads.batching import batching_for, resize_inputs, tokens_per_sample
from env.workloads.workload import load_workload
from search.engine.evaluator_pool import (
    SEARCH_EVALUATORS_MOST,
    THROUGHPUT_EVALUATORS_MOST,
    cpu_evaluators,
    throughput_evaluators,
)
from search.engine.phases.throughput import FIT_SPAN, fit_batch
from search.engine.throughput.caps import ThroughputError, find_ladder, resolve_caps
from search.engine.throughput.peers import Contender, FitSearch, largest_fitting, largest_under
from search.export import export
from search.records.config import SearchConfig
from search.records.frontier_file import FrontierError, FrontierFile, load_frontier, write_frontier
from search.records.throughput import CapRow, ThroughputCurve, ThroughputPoint, accumulation_steps, counted_peak
from search.training.apply import apply_plan
from tests.data import batch_factories

DATA = Path(__file__).resolve().parent / "data"
FACTORIES = DATA / "batch_factories.py"
PROFILE = ModelProfile.model_validate(json.loads((DATA / "gpt_tiny_profile.json").read_text()))


# -- workloads at any micro-batch -------------------------------------------------------------------------------

def test_a_builtin_changes_its_batch_through_batch_size_and_keeps_its_model():
    w = load_workload("gpt/tiny")
    batches = batching_for(w)
    assert batches.base == 2 and "batch_size" in batches.how
    model, weights, before = w.model, w.model.wte.weight.clone(), w.inputs
    with batches.use(5) as at5:
        assert at5 is w and at5.model is model and [t.shape for t in at5.inputs] == [(5, 16), (5, 16)]
        assert at5.batch_shape == "0:5x16,1:5x16"
        at5.loss().backward()
    assert w.inputs is before and torch.equal(w.model.wte.weight, weights)
    assert batches.inputs(5) is batches.inputs(5)  # made once
    assert tokens_per_sample(w) == 16 and tokens_per_sample(load_workload("gpt/tiny?tokens=8")) == 8
    assert tokens_per_sample(load_workload("cnn/tiny")) is None


def test_a_factory_with_batch_size_is_called_with_it():
    w = load_workload(f"{FACTORIES}:with_batch_size")
    batches = batching_for(w)
    assert batches.base == 3 and "batch_size parameter" in batches.how
    del batch_factories.CALLS[:]
    x, scale = batches.inputs(7)
    assert x.shape == (7, 8) and float(scale) == 2.0
    assert batching_for(load_workload(f"{FACTORIES}:with_batch_size?batch_size=5")).base == 5


def test_batch_first_inputs_are_sliced_or_tiled_along_batch_dim():
    w = load_workload(f"{FACTORIES}:batch_first")
    batches = batching_for(w, batch_dim=0)
    assert batches.base == 4
    x, scale = w.inputs
    fewer, _ = batches.inputs(2)
    more, scale6 = batches.inputs(6)
    assert torch.equal(fewer, x[:2]) and torch.equal(more[:4], x) and torch.equal(more[4:], x[:2])
    assert scale6 is scale  # not a batch of samples: left as it is
    with batches.use(6) as at6:
        assert float(at6.loss().detach()) > 0
    assert resize_inputs({"a": x}, 3, 0, 4)["a"].shape == (3, 8)


def test_a_factory_that_cannot_change_its_batch_is_refused_in_one_line():
    w = load_workload(f"{FACTORIES}:batch_first")
    with pytest.raises(WorkloadError) as e:
        batching_for(w)
    msg = str(e.value)
    assert "\n" not in msg and "takes no batch_size" in msg and "batch_size=..." in msg and "--batch-dim 0" in msg
    with pytest.raises(WorkloadError, match="no input tensor with that dimension"):
        batching_for(w, batch_dim=3)


# -- the fit in the micro-batch ----------------------------------------------------------------------------------

def _scaled(profile: ModelProfile, factor: float, seconds_factor: float | None = None) -> ModelProfile:
    """``profile`` with every byte count and time grown as a batch ``factor`` times larger would, on a line
    (its times ``seconds_factor`` times when given)."""
    data = profile.model_dump(mode="json")

    def grow(seg: dict) -> None:
        seg.update(delta_bytes=int(seg["delta_bytes"] * factor), rise_bytes=int(seg["rise_bytes"] * factor),
                   seconds=seg["seconds"] * (factor if seconds_factor is None else seconds_factor))

    for seg in [data["pre"], data["post"], data["tail"]] + [c[k] for cs in data["costs"].values() for c in cs
                                                             for k in ("fwd", "bwd")]:
        grow(seg)
    return ModelProfile.model_validate(data)


def test_the_fit_goes_through_its_profiles_and_refuses_another_model():
    at2, at6 = PROFILE, _scaled(PROFILE, 3.0)
    fit = BatchFit({2: at2, 6: at6})
    assert fit.profile_at(2) is at2 and fit.batches == [2, 6]
    at4 = fit.profile_at(4)  # halfway on every line
    for a in PROFILE.actions:
        for i in range(len(PROFILE.units)):
            want = (at2.cost(i, a).kept_bytes + at6.cost(i, a).kept_bytes) / 2
            assert at4.cost(i, a).kept_bytes == pytest.approx(want, abs=1)
    keep = [PROFILE.actions.index(Action.KEEP)] * len(PROFILE.units)
    assert CostModel(at4).peak_bytes(keep) == pytest.approx(
        (CostModel(at2).peak_bytes(keep) + CostModel(at6).peak_bytes(keep)) / 2, rel=1e-3)
    with pytest.raises(MeasurementError, match="2 or more batch sizes"):
        BatchFit({2: at2})
    other = at6.model_copy(update={"fingerprint": "another"})
    with pytest.raises(MeasurementError, match="other units, actions or model"):
        BatchFit({2: at2, 6: other})


def test_the_fits_second_profile_is_a_few_times_the_own_batch_not_the_ladders_top():
    """A profile at micro-batch 81 of hf/llama ran for 26 CPU-minutes; the fit's far profile is taken at the
    smallest ladder size at least FIT_SPAN times the own batch, the top only when the ladder ends before."""
    assert FIT_SPAN == 4
    assert fit_batch([1, 2, 8, 16, 32, 46], 4) == 16  # gpt/small: the ladder went to 46
    assert fit_batch([1, 2, 8, 16, 32, 64, 81], 1) == 8
    assert fit_batch([1, 2, 8], 4) == 8 and fit_batch([1, 2], 4) == 2  # a short ladder: its top
    assert fit_batch([], 4) == 2 and fit_batch([], 1) == 2  # all keep ran nowhere else: below the own batch


def test_the_fits_second_profile_is_chosen_before_the_ladder_as_fit_batch_would_choose_on_it():
    """The profile runs while the ladder is found, so its size comes from the lowest plan's peaks at two sizes:
    the smallest power of two at least FIT_SPAN times the own batch, unless the line through those peaks puts the
    ladder's top below half of it; then that top, as fit_batch takes a short ladder's top."""
    from search.engine.phases.throughput import early_fit_batch
    from search.engine.throughput.caps import ThroughputSetup

    def setup(cap_mib: float, base: int) -> ThroughputSetup:
        return ThroughputSetup([cap_mib * MIB], [], base, "x", None, 0, None, (1,))

    lowest = {1: _record(10 + 3), 4: _record(10 + 12)}  # 10 MiB plus 3 MiB a sample: the top is (cap - 10) / 3
    assert early_fit_batch(setup(10 + 3 * 46, 4), lowest, 4096) == 16  # as gpt/small: the ladder went to 46
    assert early_fit_batch(setup(10 + 3 * 30, 8), lowest, 4096) == 32  # a top at 30: not below half of 32
    assert early_fit_batch(setup(10 + 3 * 12, 8), lowest, 4096) == 12  # a top at 12, below half of 32: the top
    assert early_fit_batch(setup(10 + 3 * 46, 4), lowest, 12) == 12  # no more than the global batch
    assert early_fit_batch(setup(10 + 3 * 4, 4), lowest, 4096) == 2  # a top at the own batch: half of it
    flat = {1: _record(13), 4: _record(13)}
    assert early_fit_batch(setup(20, 4), flat, 4096) == 16  # peaks that do not grow foresee no top


def test_a_quotes_rounds_put_the_largest_micro_batches_in_the_middle_so_no_round_ends_on_them():
    """Rounds go in order and then reversed; with the largest in the middle, both end on small ones."""
    from search.engine.throughput.quote import middle_out

    order = middle_out([(b, i) for i, b in enumerate([8, 1, 46, 2, 16, 4])], key=lambda x: x[0])
    assert [b for b, _ in order] == [1, 4, 16, 46, 8, 2]
    assert order[-1][0] <= 2 and order[0][0] <= 2  # in order and reversed alike
    assert middle_out([], key=int) == [] and middle_out([3], key=int) == [3]
    assert [i for _, i in middle_out([(1, 0), (1, 1), (1, 2)], key=lambda x: x[0])] == [0, 2, 1]


def test_a_fitted_time_keeps_a_fixed_cost_and_a_cost_per_sample_at_zero_or_above():
    """Profiles at 4 and 16 timed on a drifting machine, the one at 16 more than 4 times slower: the free line
    through them would price micro-batch 1 at nothing (it crosses 0 at 1.6). The fitted time at 1 is the least-
    squares line through 0's (0.31 of the time at 4), and no micro-batch costs less per sample than a larger one."""
    at4 = PROFILE
    at16 = _scaled(PROFILE, 4.0, seconds_factor=5.0)  # bytes 4x the ones at 4, seconds 5x: superlinear
    fit = BatchFit({4: at4, 16: at16})
    keep = [PROFILE.actions.index(Action.KEEP)] * len(PROFILE.units)
    t4, t16 = CostModel(at4).predict(keep).step_seconds, CostModel(at16).predict(keep).step_seconds
    assert t16 > 4 * t4
    free_intercept = t4 - 4 * (t16 - t4) / 12
    assert free_intercept < 0  # the line through both points is below 0 at micro-batch 1
    t1 = CostModel(fit.profile_at(1)).predict(keep).step_seconds
    assert t1 == pytest.approx(t4 * (4 + 16 * 5) / (16 + 256), rel=0.02)  # least squares through 0
    per_sample = [CostModel(fit.profile_at(b)).predict(keep).step_seconds / b for b in (1, 2, 3, 5, 8, 12)]
    assert all(a >= b - 1e-12 for a, b in zip(per_sample, per_sample[1:]))
    # a line that has a fixed cost and a cost per sample is the free one, through both profiles
    fair = BatchFit({4: at4, 16: _scaled(PROFILE, 4.0, seconds_factor=3.0)})
    t1_fair = CostModel(fair.profile_at(1)).predict(keep).step_seconds
    assert t1_fair == pytest.approx(t4 - 3 * (3 * t4 - t4) / 12, rel=0.02)


FIT_PEAK_TOLERANCE = 0.03  # the fit's peak at a batch it was not fitted on, against the peak measured there


@pytest.mark.slow
def test_the_per_unit_fit_predicts_a_batch_it_was_not_fitted_on():
    """Fitted on micro-batches 1 and 8 of gpt/tiny, the profile at 4 predicts each unit's kept bytes and the
    measured peaks of the uniform plans within 3%."""
    w = load_workload("gpt/tiny")
    units = resolve_units(w, ["auto"], 32).units
    batches = batching_for(w)
    profiles = {}
    for b in (1, 4, 8):
        with batches.use(b):
            profiles[b] = profile(w, units, repeats=1, baseline=False, check=False)
    fit = BatchFit({1: profiles[1], 8: profiles[8]})
    predicted, measured_profile = fit.profile_at(4), profiles[4]
    for i in range(len(units)):
        want = measured_profile.cost(i, Action.KEEP).kept_bytes
        assert predicted.cost(i, Action.KEEP).kept_bytes == pytest.approx(want, rel=FIT_PEAK_TOLERANCE)
    order = measured_profile.units
    for action in (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE):
        with batches.use(4):
            m = measure(w, plan_for(w.model, order, [action] * len(order)), order, repeats=1)
        check = fit.check_at(4, [predicted.actions.index(action)] * len(order), action.value, m.peak_bytes,
                             m.step_seconds)
        assert not check.fitted and abs(check.peak_error) <= FIT_PEAK_TOLERANCE, check


# -- caps, ladder, largest micro-batch ---------------------------------------------------------------------------

def _record(peak_mib: float, seconds: float = 0.01, digest: str = "d", oom: bool = False) -> MeasuredPlan:
    return MeasuredPlan(workload="w", batch_shape="x", digest=digest, actions=[], peak_bytes=int(peak_mib * MIB),
                        live_before_bytes=0, step_seconds_samples=[] if oom else [seconds], clock="wall", device="cpu",
                        torch_version="t", oom=oom)


def test_the_ladder_doubles_then_finds_the_largest_that_fits():
    measured: list[int] = []

    def lowest(b: int) -> MeasuredPlan:  # 10 MiB plus 3 MiB a sample
        measured.append(b)
        return _record(10 + 3 * b)

    ladder = find_ladder(lowest, [40 * MIB], lambda p, b: p, 4096, "the plan")
    assert ladder == [1, 2, 4, 8, 10]  # 10 + 3 * 10 = 40 fits, 11 does not
    assert measured == [1, 2, 4, 8, 11, 10]  # after 8, right above where the line through 4 and 8 leaves the cap
    assert find_ladder(lowest, [40 * MIB], lambda p, b: p, 6, "the plan") == [1, 2, 4, 6]  # a global batch of 6


def test_a_cap_no_plan_fits_is_one_line_naming_the_lowest_measured_peak():
    with pytest.raises(ThroughputError) as e:
        find_ladder(lambda b: _record(10 + 3 * b), [5 * MIB, 40 * MIB], lambda p, b: p, 4096, "the lowest plan")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("memory cap 5.0 MiB: no plan fits; the lowest measured peak is 13.0 MiB")
    assert "micro-batch 1" in msg and "at least 13.0 MiB" in msg
    with pytest.raises(ThroughputError, match="needs --memory-cap MB"):
        resolve_caps([], None)
    assert resolve_caps([], 80 * 2**30) == [72 * 2**30]  # the device's memory less 10%
    assert resolve_caps([60, 30.5], None) == [int(30.5 * MIB), 60 * MIB]


def test_a_search_measures_on_one_cpu_evaluator_per_core_at_most_two():
    """--evaluators 0 (the default): both cores of this machine measure; a larger machine two, where the passes
    were measured (docs/measurement.md); a measurement of all cores, one; --evaluators N, N."""
    def node(cpus: int, alive: bool = True) -> dict:
        return {"Alive": alive, "Resources": {"CPU": cpus}}

    assert SearchConfig().evaluators == 0
    assert cpu_evaluators(SearchConfig(), [node(2)]) == 2
    assert cpu_evaluators(SearchConfig(), [node(1)]) == 1
    assert cpu_evaluators(SearchConfig(), [node(16), node(16)]) == SEARCH_EVALUATORS_MOST == 2
    assert cpu_evaluators(SearchConfig(measure_threads=2), [node(2)]) == 1
    assert cpu_evaluators(SearchConfig(measure_threads=0), [node(8)]) == 1  # a measurement takes all of a node
    assert cpu_evaluators(SearchConfig(), [node(0)]) == 1  # no CPU offered to Ray: still one
    assert cpu_evaluators(SearchConfig(evaluators=3), [node(2)]) == 3
    assert cpu_evaluators(SearchConfig(compile=True), [node(2)]) == 1  # each Evaluator compiles on its own
    assert cpu_evaluators(SearchConfig(compile=True, evaluators=2), [node(2)]) == 2
    with pytest.raises(CkptSearchError, match=r"--evaluators must be 0 \(one per --measure-threads cores, at most 2\) "
                                              r"or more, got -1"):
        SearchConfig(evaluators=-1).validate()


def test_the_throughput_phases_measure_on_one_evaluator_per_core_at_most_four():
    def node(cpus: int, alive: bool = True) -> dict:
        return {"Alive": alive, "Resources": {"CPU": cpus}}

    cfg = SearchConfig(memory_cap=[60])
    assert throughput_evaluators(cfg, [node(2)]) == 2  # this machine: both cores measure
    assert throughput_evaluators(cfg, [node(2), node(16, alive=False)]) == 2
    assert throughput_evaluators(cfg, [node(16)]) == THROUGHPUT_EVALUATORS_MOST
    assert throughput_evaluators(SearchConfig(memory_cap=[60], measure_threads=2), [node(2)]) == 1
    assert throughput_evaluators(SearchConfig(memory_cap=[60], measure_threads=0), [node(8), node(8)]) == 2  # a node
    assert throughput_evaluators(SearchConfig(memory_cap=[60], evaluators=3), [node(2)]) == 3  # never fewer
    assert throughput_evaluators(SearchConfig(memory_cap=[60], throughput_evaluators=1), [node(16)]) == 1
    with pytest.raises(CkptSearchError, match=r"--throughput-evaluators must be 0 \(one per --measure-threads cores\) or more, got -1"):
        SearchConfig(memory_cap=[60], throughput_evaluators=-1).validate()


def test_each_contender_is_quoted_at_the_largest_micro_batch_it_fits():
    slopes = {"rule:a": 2.0, "peer:b": 5.0}  # MiB a sample over 4 MiB; a rule has the model's prior, a peer anchors
    measured: list[tuple[str, int]] = []

    def measure_jobs(jobs):
        measured.extend((j.source, j.micro_batch) for j in jobs)
        return [_record(4 + slopes[j.source] * j.micro_batch, digest=j.source) for j in jobs]

    from env.measure.peers import checkpoint_sequential_peer
    rule = Contender("rule:a", "a rule", (0, 0))
    peer = Contender("peer:b", "a peer", None, checkpoint_sequential_peer(2, "blocks").model_copy(update={"name": "b"}))
    searches = [FitSearch(c, cap * MIB) for c in (rule, peer) for cap in (30, 100)]
    prior = lambda c: (lambda b: int((4 + 1.9 * b) * MIB)) if c.plan else None  # noqa: E731  5% off
    largest_fitting(searches, measure_jobs, lambda p: ("keep",) * len(p), lambda p, b: p, prior, range(1, 4097),
                    [2, 8])
    got = {(s.contender.name, s.cap // MIB): s.fits[0] for s in searches}
    assert got == {("rule:a", 30): 13, ("rule:a", 100): 48, ("peer:b", 30): 5, ("peer:b", 100): 19}
    assert all(s.tries <= 5 for s in searches)
    assert sum(1 for name, _ in measured if name == "rule:a") <= 6  # a line after the first two measurements
    given = [FitSearch(c, 30 * MIB) for c in (rule, peer)]  # --micro-batches 4 8 12: only those
    largest_fitting(given, measure_jobs, lambda p: ("keep",) * len(p), lambda p, b: p, prior, [4, 8, 12], [4, 12])
    assert [s.fits[0] for s in given] == [12, 4]
    assert largest_under(lambda b: b * 10, 35, range(1, 101)) == 3
    assert largest_under(lambda b: b, 0, range(1, 9)) is None
    assert largest_under(lambda b: b * 10, 95, [2, 4, 8, 16]) == 8


# -- the curve, frontier.json and the export ---------------------------------------------------------------------

UNITS = ["blocks.0", "blocks.1"]


def _point(name: str, b: int, peak_mib: float, seconds: float, plan: dict | None = None) -> ThroughputPoint:
    m = _record(peak_mib, seconds, digest=name).model_copy(update={"actions": list((plan or {}).values())})
    return ThroughputPoint.of(m, "ours" if plan else name, name, b, 64, int(1 * MIB), 128, UNITS if plan else None)


def _curve() -> ThroughputCurve:
    ours_small = _point("recompute 2", 8, 30, 0.2, {"blocks.0": "recompute", "blocks.1": "recompute"})
    ours_large = _point("keep 2", 16, 70, 0.3, {"blocks.0": "keep", "blocks.1": "keep"})
    return ThroughputCurve(
        caps=[CapRow(cap_bytes=40 * MIB, answer=ours_small, selected=ours_small,
                     quote=[ours_small, _point("peer:x", 4, 35, 0.15)], unfit={"peer:y": "does not fit at 1"}),
              CapRow(cap_bytes=80 * MIB, answer=ours_large, quote=[ours_large])],
        micro_batches=[1, 2, 4, 8, 16], default_micro_batch=4, global_batch=64, tokens_per_sample=128,
        gradient_bytes=MIB, batching="the batch_size option", profiled_batches=[4, 16], quote_rounds=2,
        frontiers={8: [ours_small]})


def test_points_count_accumulation_and_tokens():
    p = _point("recompute 2", 8, 30, 0.2, {"blocks.0": "recompute", "blocks.1": "recompute"})
    assert p.accumulation == 8 and p.counted_peak_bytes == 31 * MIB  # 64 / 8 steps: the gradients stay live
    assert p.samples_per_second == pytest.approx(40.0) and p.tokens_per_second == pytest.approx(40.0 * 128)
    assert accumulation_steps(64, 64) == 1 and counted_peak(5, 64, 64, 100) == 5
    assert accumulation_steps(3, None) == 1 and accumulation_steps(10, 64) == 7


def test_the_throughput_curve_round_trips_through_frontier_json(tmp_path: Path):
    curve = _curve()
    frontier = FrontierFile(workload="gpt/tiny", batch_shape="0:4x16", device="cpu", clock="wall", fingerprint="fp",
                            units=UNITS, baseline={"peak_bytes": 1, "step_seconds": 1.0}, points=[], throughput=curve)
    write_frontier(tmp_path, frontier)
    back = load_frontier(tmp_path)
    assert back.throughput == curve and back.throughput.frontiers[8][0].micro_batch == 8
    assert back.throughput.best_within(71 * MIB).micro_batch == 16  # 70 MiB and the gradients (1 MiB) fit 71
    assert back.throughput.best_within(int(70.9 * MIB)).micro_batch == 8
    assert back.throughput.best_within(30 * MIB) is None
    older = json.loads((tmp_path / "frontier.json").read_text())
    del older["throughput"]
    (tmp_path / "frontier.json").write_text(json.dumps(older))
    assert load_frontier(tmp_path).throughput is None  # a frontier file of a run without it still reads


def test_export_memory_cap_writes_the_micro_batch_and_apply_plan_reads_it(tmp_path: Path):
    w = load_workload("gpt/tiny")
    units = resolve_units(w, ["auto"], 32).units
    from env.data.plan import fingerprint

    curve = _curve()
    for row in curve.caps:
        for p in [row.answer, *row.quote]:
            if p.plan:
                p.plan = {u: Action.RECOMPUTE for u in units}
    frontier = FrontierFile(workload="gpt/tiny", batch_shape="0:2x16", device="cpu", clock="wall",
                            fingerprint=fingerprint(w.model, units), units=list(units),
                            baseline={"peak_bytes": 1, "step_seconds": 1.0}, points=[], throughput=curve)
    write_frontier(tmp_path, frontier)
    done = export(tmp_path, memory_cap_mb=50, out=tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["micro_batch"] == 8 and data["accumulation_steps"] == 8 and data["global_batch"] == 64
    assert data["measured"]["samples_per_second"] == pytest.approx(40.0) and done.point.micro_batch == 8
    handle = apply_plan(w.model, tmp_path / "plan.json")
    assert set(handle.plan.actions.values()) == {Action.RECOMPUTE} and isinstance(handle.plan, Plan)
    handle.remove()
    with pytest.raises(FrontierError) as e:
        export(tmp_path, memory_cap_mb=10)
    assert "\n" not in str(e.value) and "lowest answer's peak is 31.00 MiB" in str(e.value)
    with pytest.raises(CkptSearchError, match="not both"):
        export(tmp_path, budget_mb=50, memory_cap_mb=50)


def test_the_price_page_reads_measured_micro_batches_where_they_exist():
    from dashboard.pricing import Cluster, price_plan, with_measured

    points = [{"batch_size": 1, "peak_bytes": 10**9, "step_seconds": 0.1},
              {"batch_size": 2, "peak_bytes": 2 * 10**9, "step_seconds": 0.2}]
    cluster = Cluster(gpu_memory_gb=4.5, price_per_gpu_hour=1.0, global_batch=4, steps=10, max_gpus=1)
    fitted = price_plan("d", "keep 2", points, cluster)
    assert (fitted.micro_batch, fitted.accumulation, fitted.measured) == (4, 1, False)  # the line: 4 fit in 4.5 GB
    too_big = _record(5 * 10**9 / MIB, 0.35, digest="d")  # measured at 4: 5 GB, it does not fit after all
    priced = price_plan("d", "keep 2", with_measured({"d": points}, [(4, too_big)])["d"], cluster)
    assert (priced.micro_batch, priced.accumulation, priced.measured) == (2, 2, True)
    assert priced.step_seconds == pytest.approx(2 * 0.2)  # two measured steps of micro-batch 2


# -- the alternative design: one env (and agent) conditioned on the micro-batch ----------------------------------

def _batch_env(seed: int):
    from env.cost.headroom import lowest_and_keep_peak
    from env.gym.batch_env import MicroBatchEnv
    from env.gym.checkpoint_env import CheckpointEnv

    fit = BatchFit({2: PROFILE, 8: _scaled(PROFILE, 4.0)})
    envs = {}
    for b in (2, 4, 8):
        low, keep = lowest_and_keep_peak(fit.profile_at(b))
        envs[b] = CheckpointEnv(fit.profile_at(b), (low, keep), "model")
    env = MicroBatchEnv(envs)
    env.reset(seed=seed)
    return env


def test_the_micro_batch_env_is_seeded_and_carries_the_micro_batch():
    a, b = _batch_env(3), _batch_env(3)
    inner = a.envs[2].observation_space.shape[0]
    assert a.observation_space.shape == (inner + 2,) and a.action_space == a.envs[2].action_space
    for episode in range(6):
        oa, ia = a.reset()
        ob, ib = b.reset()
        assert ia == ib and np.array_equal(oa, ob) and ia["micro_batch"] in (2, 4, 8)
        assert oa[-1] == pytest.approx(ia["micro_batch"] / 8)
        assert oa[-2] == pytest.approx(np.log2(ia["micro_batch"]) / 3)
        done = False
        while not done:
            act = int(np.flatnonzero(a.action_masks())[0])
            oa, ra, done, _, info = a.step(act)
            ob, rb, _, _, _ = b.step(act)
            assert ra == rb and np.array_equal(oa, ob)
        assert info["micro_batch"] == ia["micro_batch"] and info["budget_bytes"] == ia["budget_bytes"]
    obs, info = a.reset(options={"micro_batch": 8, "budget_bytes": 10**9})
    assert info["micro_batch"] == 8 and a.env is a.envs[8] and info["budget_bytes"] == 10**9
    with pytest.raises(ValueError, match="micro_batch=3 is not one of"):
        a.reset(options={"micro_batch": 3})



@pytest.mark.slow
def test_both_agent_designs_find_the_model_optimal_plan_and_micro_batch_after_cloning():
    from agents.batch_agents import MicroBatchAgents
    from agents.batch_conditioned import MicroBatchConditionedAgent
    from agents.throughput import exact_frontiers, model_optimal, ranked
    from env.cost.headroom import lowest_and_keep_peak

    fit = BatchFit({2: PROFILE, 8: _scaled(PROFILE, 4.0)})
    ladder = [2, 4, 8]
    low, keep = lowest_and_keep_peak(fit.profile_at(4))
    caps = [low, (low + keep) // 2, keep]
    budgets = {b: caps for b in ladder}
    profiles = {b: fit.profile_at(b) for b in ladder}
    same = lambda peak, b: peak  # noqa: E731
    frontiers = exact_frontiers(fit.cost_model, ladder)
    for agent in (MicroBatchAgents(profiles, budgets, seed=1), MicroBatchConditionedAgent(profiles, budgets, seed=1)):
        agent.train(0)  # cloning only
        plans = [p for ps in agent.plans(budgets).values() for p in ps]
        for cap in caps:
            best = model_optimal(frontiers, cap, same)
            got = ranked(plans, fit.cost_model, ladder, cap, same)
            assert best is not None and got and got[0].samples_per_second == pytest.approx(best.samples_per_second,
                                                                                           rel=0.01)


def _model(setup=None, seconds_factor: float | None = None):
    """A fitted model of gpt/tiny (4 units: keep, recompute, selective) from its profile at 2 and one 4 times larger
    (its times ``seconds_factor`` times those at 2 when given: below 4, a step has a fixed cost)."""
    from search.engine.throughput.caps import ThroughputSetup
    from search.engine.throughput.plans import ThroughputModel

    setup = setup or ThroughputSetup([10 * MIB], [1, 2, 4, 8], 2, "x", None, 0, None, (1, 1, 1, 1))
    return ThroughputModel(BatchFit({2: PROFILE, 8: _scaled(PROFILE, 4.0, seconds_factor)}), setup)


def test_the_answer_weighs_every_near_rule_at_its_largest_fitting_micro_batch():
    """A rule is a plan of the space: each one the fitted model prices within NEAR of the fastest, at the
    largest micro-batch it fits, joins the deciding finalists, so the answer is never a plan measured slower,
    side by side, than a rule that fits. Finding that micro-batch measures peaks only, so the fitted model
    prices them; the deciding rounds measure them."""
    from search.engine.phases.throughput import NEAR, near_rules

    model = _model()

    def searched(name: str, plan, micro_batch: int | None, oom: bool = False) -> FitSearch:
        s = FitSearch(Contender(name, name, plan=plan), cap=10 * MIB)
        if micro_batch is not None:
            s.fits = (micro_batch, _record(1.0, digest=name, oom=oom).model_copy(update={"step_seconds_samples": []}))
        return s

    def rate(s: FitSearch) -> float:
        return s.fits[0] / model.predicted_seconds(s.contender.plan, s.fits[0])

    searches = [searched("rule:none", (0, 0, 0, 0), 4), searched("rule:all", (1, 1, 1, 1), 4),
                searched("rule:every_2", (1, 0, 1, 0), 4), searched("rule:oom", (0, 0, 0, 0), 64, oom=True),
                searched("rule:unfit", (0, 1, 0, 1), None)]
    assert rate(searches[0]) > rate(searches[2]) > rate(searches[1])  # recomputing costs time at equal batch
    peer = FitSearch(Contender("peer:fast", "a peer", peer=None), cap=10 * MIB)
    peer.fits = (99, _record(1.0, 0.01, digest="peer:fast"))  # not a plan of the space: never an answer
    near = [s.contender.name for s in searches[:3] if rate(s) >= NEAR * rate(searches[0])]
    assert 0 < len(near) < 3  # the slowest rule is out: the test tells near from far
    got = near_rules([*searches, peer], model)
    assert [(b, m.digest) for b, m in got] == [(4, n) for n in near]  # fastest first, no peer, nothing unfit
    assert near_rules(searches[1:], model)[0][1].digest == "rule:every_2"
    assert near_rules([peer], model) == [] and near_rules([], model) == []


def _measurer(store: Any, pool: Any = None) -> Any:
    """The run's measurer over a ledger of a synthetic profile and ``store``: what the throughput phases read and
    record; ``pool``: what stands in for the Evaluators (none: nothing is measured)."""
    from search.engine.ledger import Ledger, SearchSetup
    from search.engine.measurer import Measurer
    from tests.profiles import synthetic_profile

    ledger = Ledger(SearchSetup.from_profile(synthetic_profile(4, 2, seed=0)), store)
    return Measurer(ledger, pool, overlap=False)


def test_the_finalists_are_the_best_measured_and_every_near_one_with_the_near_rules(tmp_path: Path):
    """The book's samples were taken minutes apart: besides its DECIDING best, every (plan, micro-batch) within
    NEAR of the best's samples per second is measured again side by side (DECIDING_MOST in all), and the near
    rules at their largest fitting micro-batch; what does not fit the cap, peers and out-of-memory records never."""
    from search.engine.phases.throughput import DECIDING, DECIDING_MOST, NEAR, ThroughputRun, finalists, near_rules
    from search.engine.throughput.caps import ThroughputSetup
    from search.records.store import RunStore

    assert DECIDING == 3 and DECIDING_MOST == 6 and NEAR == 0.85
    cap = 100 * MIB
    setup = ThroughputSetup([cap], [1, 2, 4, 8], 4, "x", None, 0, None, (1,))
    with RunStore(tmp_path / "store.sqlite") as store:
        run = ThroughputRun(setup, _measurer(store))
        book = run.book

        def measured(digest: str, micro_batch: int, rate: float, peak_mib: float = 50.0, oom: bool = False) -> None:
            book.record({"micro_batch": micro_batch, "record": _record(peak_mib, micro_batch / rate, digest, oom)})

        measured("best", 8, 40.0)
        for k, rate in enumerate([39.0, 38.0, 35.0, 34.5, 34.1, 34.05]):  # 3 best, then 4 within 0.85 of 40 (34)
            measured(f"p{k}", 4, rate)
        measured("slow", 2, 33.0)  # below 0.85 of the best: out
        measured("slower-rule", 1, 20.0)
        measured("big", 8, 90.0, peak_mib=120.0)  # does not fit
        measured("peer:fast", 8, 99.0)
        measured("oom", 8, 99.0, oom=True)
        model = _model(setup)
        got = [(b, m.digest) for b, m in finalists(run, cap, [], model)]
        assert got == [(8, "best"), (4, "p0"), (4, "p1"), (4, "p2"), (4, "p3"), (4, "p4")]

        rule = FitSearch(Contender("rule:every_4", "every 4th", plan=(1, 0, 0, 0)), cap)
        rule.fits = (1, book.records[(1, "slower-rule")])
        assert near_rules([rule], model) == [rule.fits]
        with_rule = [(b, m.digest) for b, m in finalists(run, cap, [rule], model)]
        assert with_rule == got + [(1, "slower-rule")]
        assert finalists(run, 10 * MIB, [], model) == []  # nothing measured fits


def test_where_the_run_off_cannot_tell_two_apart_the_fit_decides():
    """Within either's spread per sample, the run-off's order is noise: the one the fitted model prices faster
    is the answer (all keep against a plan that recomputes a unit, at the same micro-batch); beyond it, the
    measurements decide."""
    from search.engine.phases.throughput import the_faster

    model = _model()

    def answer(actions: list[str], ms: list[float]) -> tuple[int, MeasuredPlan]:
        m = _record(50.0, digest="-".join(actions)).model_copy(
            update={"actions": actions, "step_seconds_samples": [t / 1e3 for t in ms]})
        return 4, m

    keep = answer(["keep"] * 4, [131, 106, 102, 135, 124, 115])  # median 119.5 ms, spread 27 ms
    recompute_one = answer(["keep", "recompute", "keep", "keep"], [108, 117, 141, 111, 111, 119])  # 114 ms
    assert model.predicted_rate(keep) > model.predicted_rate(recompute_one)
    assert the_faster([recompute_one, keep], model) is keep
    clearly = answer(["keep", "recompute", "keep", "keep"], [80, 81, 79, 80, 82, 80])  # 33% faster, beyond both
    assert the_faster([keep, clearly], model) is clearly
    three = [keep, recompute_one, clearly]
    assert the_faster(three, model) is clearly and the_faster([keep], model) is keep


def test_the_answer_is_the_faster_of_the_deciding_rounds_first_two_in_a_run_off(tmp_path: Path):
    """The first of the deciding rounds is the finalist whose measurements read luckiest: the first two are
    measured again, in RUNOFF_ROUNDS rounds of their own, and the answer is the faster on those alone."""
    from search.engine.phases.throughput import DECIDING_ROUNDS, RUNOFF_ROUNDS, ThroughputRun, decide, finalists
    from search.engine.throughput.caps import ThroughputSetup
    from search.records.store import RunStore

    cap = 100 * MIB
    # samples per second at micro-batch 4: in the book, in the deciding rounds, in the run-off
    rates = {"lucky": (40.0, 50.0, 40.0), "steady": (39.0, 45.0, 44.0), "third": (38.0, 30.0, 99.0)}

    def record(digest: str, rate: float) -> MeasuredPlan:
        return _record(50.0, 4 / rate, digest).model_copy(update={"actions": [digest]})

    class Scripted:  # the Evaluators' part (``EvaluatorPool.run_jobs``): each round's measurements as scripted
        rounds: list[list[str]] = []

        def run_jobs(self, jobs, call, on_result, deadline=None):
            self.rounds.append([job.item[0] for job in jobs])
            late = 1 if len(self.rounds) <= DECIDING_ROUNDS else 2
            return [on_result({"micro_batch": job.micro_batch, "record": record(job.item[0], rates[job.item[0]][late])
                               .model_copy(update={"measurement_ids": [f"evaluator_0-s:{len(self.rounds)}{k}"]})})
                    for k, job in enumerate(jobs)]

    setup = ThroughputSetup([cap], [1, 2, 4, 8], 4, "x", None, 0, None, (1,))
    pool = Scripted()
    with RunStore(tmp_path / "store.sqlite") as store:
        measurer = _measurer(store, pool=pool)
        book = measurer.ledger.batches
        for digest, (rate, _, _) in rates.items():
            book.record({"micro_batch": 4, "record": record(digest, rate)})
        run, model = ThroughputRun(setup, measurer), _model(setup)
        answers = decide(run, {cap: finalists(run, cap, [], model)}, model)
        # every measurement of the rounds went into the book as it arrived, and from there into the store
        stored = {m.digest: m for b, m in store.measured_at_micro_batches() if b == 4}
    assert len(pool.rounds) == DECIDING_ROUNDS + RUNOFF_ROUNDS
    assert all(sorted(r) == ["lucky", "steady", "third"] for r in pool.rounds[:DECIDING_ROUNDS])
    assert all(sorted(r) == ["lucky", "steady"] for r in pool.rounds[DECIDING_ROUNDS:])
    b, m = answers[cap]
    assert (b, m.digest) == (4, "steady") and 4 / m.step_seconds == pytest.approx(44.0)
    assert len(m.measurement_ids) == RUNOFF_ROUNDS  # ranked on the run-off's measurements alone
    assert {d: len(r.measurement_ids) for d, r in stored.items()} == {
        "lucky": DECIDING_ROUNDS + RUNOFF_ROUNDS, "steady": DECIDING_ROUNDS + RUNOFF_ROUNDS, "third": DECIDING_ROUNDS}
    assert {d: len(r.step_seconds_samples) for d, r in stored.items()} == {
        "lucky": 1 + DECIDING_ROUNDS + RUNOFF_ROUNDS, "steady": 1 + DECIDING_ROUNDS + RUNOFF_ROUNDS,
        "third": 1 + DECIDING_ROUNDS}


def test_a_plan_the_probe_measured_first_is_credited_to_whoever_proposed_it(tmp_path: Path) -> None:
    """On hf/llama the ladder's probe measured all keep at micro-batch 2 before the agent and the exact solver
    proposed it: the lowest cap's row showed neither proposer's best. Credited, it stands for both, in the store."""
    from search.engine.batch_book import BatchBook
    from search.engine.throughput.quote import proposed_by
    from search.records.store import RunStore

    probe = _record(40, digest="keep").model_copy(update={"sources": ["throughput:probe"]})
    with RunStore(tmp_path / "store.sqlite") as store:
        book = BatchBook(store)
        book.record({"micro_batch": 2, "record": probe})
        assert not proposed_by(book.get(2, "keep"), "agent") and not proposed_by(book.get(2, "keep"), "exact")
        book.credit({(2, "keep"): "exact+agent:micro-batch-conditioned"})
        book.credit({(2, "keep"): "exact+agent:micro-batch-conditioned"})  # once
        book.credit({(2, "keep"): ""})  # a plan no proposer named: nothing
    with RunStore(tmp_path / "store.sqlite") as store:
        m = BatchBook(store).get(2, "keep")
    assert m.sources == ["throughput:probe", "exact+agent:micro-batch-conditioned"]
    assert proposed_by(m, "agent") and proposed_by(m, "exact") and m.step_seconds_samples == probe.step_seconds_samples


# -- prices that follow measurements -----------------------------------------------------------------------------

def test_a_predicted_step_time_is_scaled_by_the_steps_timed_at_the_nearest_micro_batch():
    """All keep timed at 2 (twice the fit's time) and at 8 (half of it): predicted there, it is the measured time;
    between them each micro-batch follows the nearest timed one in ratio (4: as near to both, the smaller), and a
    peak measured alone at 3 moves the peaks there, never the times. The ranking prices with the same times."""
    model = _model()
    keep = (PROFILE.actions.index(Action.KEEP),) * len(PROFILE.units)
    fit = {b: model.fit_seconds(keep, b) for b in model.batches}
    assert model.predicted_seconds(keep, 3) == fit[3]  # nothing measured: the fit alone
    measured = {2: 2.0 * fit[2], 8: 0.5 * fit[8]}
    for b, seconds in measured.items():
        model.check(b, keep, "all keep", _record(1.0, seconds))
    peak_alone = _record(1.0).model_copy(update={"step_seconds_samples": []})  # its steps not timed
    model.check(3, keep, "all keep", peak_alone)
    for b, seconds in measured.items():
        assert model.predicted_seconds(keep, b) == pytest.approx(seconds, rel=1e-12)
        assert model.predicted_rate((b, _record(1.0).model_copy(update={"actions": ["keep"] * 4}))) == \
            pytest.approx(b / seconds, rel=1e-12)
    follows = {1: 2, 3: 2, 4: 2, 5: 8, 6: 8, 7: 8}
    for b, nearest in follows.items():
        assert model.predicted_seconds(keep, b) == pytest.approx(fit[b] * measured[nearest] / fit[nearest], rel=1e-12)
        assert model.fit_seconds(keep, b) == fit[b]  # the fit itself is untouched
    assert model.predicted_peak(keep, 3) == pytest.approx(MIB, abs=1)  # the peak measured there, alone
    ranked_keep = {c.micro_batch: c.step_seconds for c in model.candidates([keep], 10 * MIB)}
    assert ranked_keep and all(s == pytest.approx(model.predicted_seconds(keep, b), rel=1e-12)
                               for b, s in ranked_keep.items())
    # several plans timed at one micro-batch: the mean of their ratios, one factor for every plan there
    recompute = (PROFILE.actions.index(Action.RECOMPUTE),) * len(PROFILE.units)
    model.check(8, recompute, "candidate", _record(1.0, 1.5 * model.fit_seconds(recompute, 8)))
    assert model.predicted_seconds(recompute, 7) == pytest.approx(model.fit_seconds(recompute, 7) * (0.5 + 1.5) / 2,
                                                                  rel=1e-12)


def test_the_model_optimal_is_solved_at_every_micro_batch_priced_not_only_the_ladders():
    """Under a cap whose best (plan, micro-batch) lies between the ladder's sizes, ``model_optimal`` finds it as a
    solve at every priced micro-batch does, with its time scaled as every price is, and its plan is one of the
    exact solver's plans the search measures; the ladder's sizes alone give a slower one."""
    from dataclasses import replace

    from agents.throughput import exact_frontiers, model_optimal

    model = _model(seconds_factor=3.0)  # a fixed cost per step: a larger micro-batch trains faster
    keep = (PROFILE.actions.index(Action.KEEP),) * len(PROFILE.units)
    timed_at_8 = _record(model.cost_model(8).peak_bytes(keep) / MIB, 0.8 * model.fit_seconds(keep, 8))
    model.check(8, keep, "all keep", timed_at_8)  # the times at 5-8 scaled by 0.8, the peaks as fitted

    def scaled(fronts: dict) -> dict:
        return {b: [p.__class__(p.plan, p.peak_bytes, p.step_seconds * model.times.at(b)) for p in front]
                for b, front in fronts.items()}

    every, ladder = scaled(exact_frontiers(model.cost_model, model.batches)), scaled(exact_frontiers(
        model.cost_model, model.setup.ladder))
    between = []
    for cap in np.linspace(model.lowest_peak(1), model.lowest_peak(max(model.batches)), 40).astype(int):
        want, old = model_optimal(every, cap, model.counted), model_optimal(ladder, cap, model.counted)
        got = model.model_optimal(cap)
        assert (got is None) == (want is None)
        if want is None:
            continue
        assert (got.micro_batch, got.samples_per_second) == (want.micro_batch, pytest.approx(want.samples_per_second))
        assert got.step_seconds == pytest.approx(model.predicted_seconds(got.plan, got.micro_batch))
        assert got.peak_bytes <= cap
        if want.micro_batch not in model.setup.ladder:
            between.append(cap)
            assert old is None or old.samples_per_second < want.samples_per_second
    assert len(between) >= 5  # caps whose optimum lies off the ladder: the test tells the two apart
    solo = _model(replace(model.setup, caps=between[:1]), seconds_factor=3.0)  # the search's pool: the ladder's plans and the optimum's
    solo.check(8, keep, "all keep", timed_at_8)
    assert model.model_optimal(between[0]).plan in solo.exact_plans()


def test_the_report_prices_only_the_answers_the_search_priced():
    """A run recorded before the predictions (or a cap nothing fits) has no row in "Predicted against measured";
    an answer priced at 0.25 s against a quoted 0.2 s at micro-batch 8 reads 32.0 beside 40.0, 0.80x."""
    from search.engine.throughput.report import predicted_markdown, throughput_markdown

    curve = _curve()
    assert predicted_markdown(curve) == [] and "Predicted against measured" not in "\n".join(throughput_markdown(curve))
    curve.caps[0] = curve.caps[0].model_copy(update={"fit_seconds": 0.16, "predicted_seconds": 0.25})
    lines = predicted_markdown(curve)
    assert lines[0] == "### Predicted against measured"
    assert [line for line in lines if line.startswith("| 40.0")] == ["| 40.0 | recompute 2 | 8 | 50.0 | 32.0 | 40.0 | 0.80x |"]
    assert not any(line.startswith("| 80.0") for line in lines)

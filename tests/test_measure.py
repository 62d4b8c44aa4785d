"""Measurement: a CPU peak that repeats exactly, its parts, and the step-time record."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

from env.data.errors import MeasurementError
from env.data.measured import MeasuredPlan
from env.data.plan import Action
from env.measure.measurement import measure, warm_up
from env.measure.profiler import profile
from env.measure.timeline import UnitMarkers, train_step
from env.runtime.apply import plan_for
from env.units.find import find_units
from env.workloads.workload import Workload, load_workload
from tests.test_workloads import one_line_error

MIXED = [Action.RECOMPUTE, Action.KEEP, Action.SELECTIVE, Action.KEEP]


@pytest.fixture(scope="module")
def gpt() -> tuple[Workload, list[str]]:
    w = load_workload("gpt/tiny")
    return w, find_units(w.model)


def test_the_cpu_peak_of_a_plan_is_identical_over_five_measurements(gpt) -> None:
    w, units = gpt
    plan = plan_for(w.model, units, MIXED)
    runs = [measure(w, plan, units, repeats=3) for _ in range(5)]
    assert len({m.peak_bytes for m in runs}) == 1, [m.peak_bytes for m in runs]
    assert len({m.live_before_bytes for m in runs}) == 1
    assert all(len(m.step_seconds_samples) == 3 and m.step_seconds > 0 for m in runs)
    assert not any("forward" in m.__dict__ for m in w.model.modules())  # the plan is removed


def test_a_plan_measured_again_on_cpu_takes_its_known_peak_without_profiling_again(gpt) -> None:
    w, units = gpt
    plan = plan_for(w.model, units, MIXED)
    first = measure(w, plan, units, repeats=1)
    # a known peak no step could read: the second measurement shows it took the peak it was lent
    lent = first.model_copy(update={"peak_bytes": first.peak_bytes + 12345})
    again = measure(w, plan, units, repeats=2, known=lent)
    assert (again.peak_bytes, again.live_before_bytes) == (first.peak_bytes + 12345, first.live_before_bytes)
    assert len(again.step_seconds_samples) == 2
    fresh = measure(w, plan, units, repeats=1)  # what a profiled step reads, as the other test asserts
    assert fresh.peak_bytes == first.peak_bytes
    oom = first.model_copy(update={"oom": True})
    assert measure(w, plan, units, repeats=1, known=oom).peak_bytes == first.peak_bytes  # nothing to lend


def test_a_peer_measured_again_on_cpu_takes_its_known_peak_as_a_plan_does(gpt) -> None:
    """checkpoint_sequential in eager steps allocates alike every step: measured again, it reads the peak it
    read before; lent a peak (the throughput search lends the one measured at that micro-batch), it takes it."""
    from env.measure.peers import checkpoint_sequential_peer, find_chain, measure_peer

    w, _ = gpt
    peer = checkpoint_sequential_peer(2, find_chain(w))
    first, second = (measure_peer(w, peer, repeats=1, warmup=2) for _ in range(2))
    assert first.peak_bytes == second.peak_bytes and first.live_before_bytes == second.live_before_bytes
    lent = first.model_copy(update={"peak_bytes": first.peak_bytes + 12345})
    again = measure_peer(w, peer, repeats=2, warmup=2, known=lent)
    assert again.peak_bytes == first.peak_bytes + 12345 and len(again.step_seconds_samples) == 2


def test_a_measurement_whose_peak_is_above_stop_above_times_no_step(gpt) -> None:
    """A throughput search asks where a configuration stops fitting its largest cap: above it, the peak is all
    it needs, and no step is timed (the record's time is infinite); at or under it, the steps are timed."""
    from env.measure.peers import checkpoint_sequential_peer, find_chain, measure_peer

    w, units = gpt
    plan = plan_for(w.model, units, MIXED)
    timed = measure(w, plan, units, repeats=2)
    above = measure(w, plan, units, repeats=2, stop_above=timed.peak_bytes - 1)
    assert above.peak_bytes == timed.peak_bytes and above.step_seconds_samples == [] and not above.oom
    assert above.step_seconds == float("inf")
    assert len(measure(w, plan, units, repeats=2, stop_above=timed.peak_bytes).step_seconds_samples) == 2
    lent = measure(w, plan, units, repeats=1, known=above, stop_above=above.peak_bytes - 1)  # a lent peak too
    assert lent.peak_bytes == timed.peak_bytes and lent.step_seconds_samples == []
    peer = measure_peer(w, checkpoint_sequential_peer(2, find_chain(w)), repeats=2, stop_above=1)
    assert peer.peak_bytes > 1 and peer.step_seconds_samples == []


def test_a_peak_alone_at_a_micro_batch_runs_no_warm_up_step_on_cpu_and_reads_the_same_bytes() -> None:
    """Once the optimizer's state exists, the memory step reads the same bytes with a warm-up step before it or
    without: a throughput search finds micro-batches by peaks alone and runs none there (eager, on CPU). Before
    any step, a warm-up step still runs, as the optimizer's state must exist."""
    from env.measure.micro_batch import WARMUP, AtMicroBatch
    from env.measure.peers import checkpoint_sequential_peer, compile_budget_peer, find_chain, measure_peer

    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    at = AtMicroBatch(w, units, [Action.KEEP, Action.RECOMPUTE], 1)
    names = [a.value for a in MIXED]
    peer = checkpoint_sequential_peer(2, find_chain(w))
    assert at.warmup_for(names, -1) == 0 and at.warmup_for(peer, -1) == 0
    assert at.warmup_for(names, None) == at.warmup_for(names, 10**9) == WARMUP  # steps to time: warmed up
    assert at.warmup_for(compile_budget_peer(0.5), -1) == WARMUP  # compiled in its warm-up
    assert not w.optimizer.state
    first = at.measure(names, 3, None, "", "m0", stop_above=-1)  # no state yet: one step before the memory step
    assert w.optimizer.state and first.step_seconds_samples == []
    for item in (names, peer):
        with at.batches(None).use(5) as w5:
            plan = plan_for(w5.model, units, MIXED) if item is names else None
            warmed = (measure(w5, plan, units, repeats=1, warmup=1, stop_above=-1) if plan is not None else
                      measure_peer(w5, item, repeats=1, warmup=1, stop_above=-1))
        cold = at.measure(item, 5, None, "", "m1", stop_above=-1)
        assert (cold.peak_bytes, cold.live_before_bytes) == (warmed.peak_bytes, warmed.live_before_bytes)


def test_peak_parts_and_savings(gpt) -> None:
    w, units = gpt
    n = len(units)
    keep = measure(w, plan_for(w.model, units, [Action.KEEP] * n), units, repeats=1)
    recompute = measure(w, plan_for(w.model, units, [Action.RECOMPUTE] * n), units, repeats=1)
    param_bytes = sum(p.numel() * p.element_size() for p in w.model.parameters())
    # parameters + AdamW's exp_avg and exp_avg_sq + inputs are live before the step
    assert keep.live_before_bytes >= 3 * param_bytes
    assert keep.activation_bytes == keep.peak_bytes - keep.live_before_bytes > param_bytes  # grads at least
    assert recompute.live_before_bytes == keep.live_before_bytes
    assert recompute.peak_bytes < keep.peak_bytes
    assert keep.device.startswith("cpu (") and keep.torch_version == torch.__version__
    assert keep.workload == "gpt/tiny" and keep.batch_shape == "0:2x16,1:2x16"


def _record(samples: list[float], digest: str = "d", mid: str = "", clock: str = "wall",
            source: str = "") -> MeasuredPlan:
    return MeasuredPlan(workload="w", batch_shape="b", digest=digest, actions=["keep"], peak_bytes=10,
                        live_before_bytes=4, step_seconds_samples=samples, device="cpu", torch_version="x",
                        clock=clock, measurement_ids=[mid] if mid else [], sources=[source] if source else [])


def test_median_spread_and_merging_repeats() -> None:
    m = _record([0.5, 0.1, 0.2, 0.3, 0.4])
    assert m.step_seconds == 0.3 and m.activation_bytes == 6
    assert m.spread_seconds == pytest.approx(0.45 - 0.15)  # interquartile range
    assert _record([0.2, 0.1]).spread_seconds == pytest.approx(0.1)
    merged = m.merged(_record([0.6, 0.7]))
    assert len(merged.step_seconds_samples) == 7 and merged.step_seconds == 0.4
    assert MeasuredPlan.model_validate_json(merged.model_dump_json()) == merged
    with pytest.raises(MeasurementError) as e:
        m.merged(_record([0.1], digest="other"))
    one_line_error(e, "cannot merge measurements of different plans")


def test_two_measurements_at_micro_batches_compare_per_sample_within_either_spread() -> None:
    from env.data.measured import within_spreads
    # 0.40 s at 4 is 0.100 s a sample; 0.21 s at 2 is 0.105: 0.005 apart
    assert within_spreads((0.40, 4, 0.02), (0.21, 2, 0.0))  # the first's spread, 0.005 a sample, covers it
    assert within_spreads((0.40, 4, 0.0), (0.21, 2, 0.01))  # so does the second's
    assert not within_spreads((0.40, 4, 0.019), (0.21, 2, 0.0099))  # neither does: apart
    assert not within_spreads((0.21, 2, 0.0099), (0.40, 4, 0.019))  # in either order


def test_a_measurement_merges_once_and_never_across_clocks() -> None:
    a = _record([0.1, 0.2], mid="e0:1", source="rule:all")
    b = _record([0.3], mid="e0:2", source="agent_0")
    ab = a.merged(b)
    assert ab.step_seconds_samples == [0.1, 0.2, 0.3] and ab.measurement_ids == ["e0:1", "e0:2"]
    assert ab.sources == ["rule:all", "agent_0"] and ab.source == "rule:all" and ab.n_measurements == 2
    assert ab.merged(b) == ab  # the same measurement again adds nothing
    with pytest.raises(MeasurementError) as e:
        a.merged(_record([0.1], mid="e1:1", clock="thread-cpu"))
    one_line_error(e, "cannot join those by the wall clock")


class _Sleeper(nn.Module):
    """A layer that waits 40 ms in forward: time no CPU is spent on, as when another process
    holds the core."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.04)
        return self.lin(x).pow(2).mean()


def test_one_cpu_thread_times_the_step_by_its_cpu_time_more_threads_by_the_wall() -> None:
    w = Workload("sleeper", _Sleeper(), (torch.randn(8, 4),))
    plan = plan_for(w.model, ["lin"], [Action.KEEP])
    assert torch.get_num_threads() == 1  # tests/conftest.py
    one = measure(w, plan, ["lin"], repeats=2)
    assert one.clock == "thread-cpu" and max(one.step_seconds_samples) < 0.02  # the wait is not counted
    torch.set_num_threads(2)
    try:
        two = measure(w, plan, ["lin"], repeats=2)
    finally:
        torch.set_num_threads(1)
    assert two.clock == "wall" and min(two.step_seconds_samples) >= 0.04


def test_repeats_must_be_positive(gpt) -> None:
    w, units = gpt
    with pytest.raises(MeasurementError) as e:
        measure(w, plan_for(w.model, units, [Action.KEEP] * len(units)), units, repeats=0)
    one_line_error(e, "repeats=0 must be at least 1")


def test_unit_markers_remove_their_hooks(gpt) -> None:
    w, units = gpt
    optimizer = torch.optim.SGD(w.model.parameters(), lr=0.0)
    with UnitMarkers(w.model, units) as markers:
        train_step(w, optimizer, markers)
    names = [name for name, _ in markers.marks]
    assert names[0] == "step_start" and names[-1] == "step_end"
    assert [n for n in names if n.startswith("bwd_pre")] == [f"bwd_pre:{i}" for i in (3, 2, 1, 0)]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in w.model.modules())


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (self.blocks[0], self.blocks[1], self.blocks[0]):  # blocks.0 is reused
            x = block(x)
        return x.pow(2).mean()


def test_a_unit_that_runs_twice_is_named() -> None:
    w = Workload("twice", _Twice(), (torch.randn(2, 4),))
    with pytest.raises(MeasurementError) as e:
        profile(w, ["blocks.0", "blocks.1"], repeats=1, baseline=False)
    one_line_error(e, "fired twice in one step", "a unit ran twice", "each run once per step")


def test_warm_up_steps_until_the_step_time_settles() -> None:
    """At least ``min_steps``; stops once the last three agree within ``tolerance``; never past ``max_steps``."""
    w = load_workload("gpt/tiny")
    assert len(warm_up(w, max_steps=8, min_steps=3, tolerance=float("inf"))) == 3
    never = warm_up(w, max_steps=5, min_steps=3, tolerance=-1.0)
    assert len(never) == 5 and all(t > 0 for t in never)
    settled = warm_up(w, max_steps=30, min_steps=4, tolerance=0.5)
    last = sorted(settled[-3:])
    assert 4 <= len(settled) <= 30 and (len(settled) == 30 or last[-1] - last[0] <= 0.5 * last[1])


def test_compare_times_calls_faster_or_slower_only_beyond_both_spreads() -> None:
    from env.data.measured import compare_times

    within = compare_times((0.95, 0.02), (1.00, 0.06))  # 5% apart, the second's spread 6%: noise
    assert within.verdict == "within noise" and str(within) == "within noise (±6%)"
    faster = compare_times((0.90, 0.02), (1.00, 0.03))
    assert faster.verdict == "faster" and abs(faster.ratio - 0.9) < 1e-12
    assert compare_times((1.00, 0.03), (0.90, 0.02)).verdict == "slower"
    assert compare_times((0.40, 0.019), (0.21, 0.0099), (4, 2)).verdict == "faster"  # per sample: 0.100 against 0.105

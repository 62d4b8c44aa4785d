"""The CUDA path: measurement, the profile from device allocations, OOM, offload, gradients.

Every test here is marked ``gpu`` and skipped without CUDA (tests/conftest.py); ``python
bench/gpu.py`` runs them on a GPU machine (``pytest -m gpu``). The workloads are small, so the
whole file takes well under a minute on one GPU.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from agents.exact import exact_frontier
from env.cost.cost_model import CostModel
from env.data.plan import Action
from env.measure.measurement import measure
from env.measure.profiler import check_profile, profile
from env.measure.timeline import profiled_step, profiler_events, train_step
from env.measure.trace import MEMORY_EVENT, PEAK_TOLERANCE
from env.runtime.apply import plan_for
from env.runtime.offload import offloader_for
from env.units.find import find_units
from env.workloads.workload import Workload, load_workload
from search.training.snippet import plan_snippet
from tests.test_apply import Case, compare

pytestmark = pytest.mark.gpu

# big activations: 8 blocks saving ~140 MB each at batch 8 x 512 tokens, a small vocabulary
BIG_GPT = "gpt?n_layer=8&d_model=512&n_head=8&seq_len=512&batch_size=8&vocab_size=1024"


def loaded(spec: str) -> tuple[Workload, list[str]]:
    w = load_workload(spec, device="cuda")
    return w, find_units(w.model)


def uniform(w: Workload, units: list[str], action: Action):
    return plan_for(w.model, units, [action] * len(units))


def test_measure_on_cuda_reads_the_caching_allocator() -> None:
    w, units = loaded("gpt/small")
    keep = measure(w, uniform(w, units, Action.KEEP), units, repeats=3)
    assert keep.clock == "wall" and len(keep.step_seconds_samples) == 3 and min(keep.step_seconds_samples) > 0
    param_bytes = sum(p.numel() * p.element_size() for p in w.model.parameters())
    assert keep.live_before_bytes >= 3 * param_bytes  # parameters and AdamW's two states
    assert keep.peak_bytes > keep.live_before_bytes and keep.peak_reserved_bytes >= keep.peak_bytes
    assert keep.device == torch.cuda.get_device_name(w.device) and not keep.oom
    recompute = measure(w, uniform(w, units, Action.RECOMPUTE), units, repeats=1)
    assert recompute.peak_bytes < keep.peak_bytes


def test_a_profiled_step_on_cuda_gives_the_allocators_peak() -> None:
    w = load_workload("gpt/small", device="cuda")
    optimizer = w.optimizer_factory(w.model.parameters())
    train_step(w, optimizer)  # optimizer state and library workspaces exist from here on
    events = profiler_events(w, optimizer)
    on_gpu = [e for e in events if e.name == MEMORY_EVENT and e.device_type == "cuda"]
    assert len(on_gpu) > 50 and {e.device_index for e in on_gpu} == {w.device.index}
    trace = profiled_step(w, optimizer)
    torch.cuda.synchronize(w.device)
    torch.cuda.reset_peak_memory_stats(w.device)
    before = torch.cuda.memory_allocated(w.device)
    train_step(w, optimizer)
    torch.cuda.synchronize(w.device)
    peak = torch.cuda.max_memory_allocated(w.device)
    assert abs(before + trace.peak_delta() - peak) <= 0.01 * peak, (before, trace.peak_delta(), peak)


def test_the_profile_on_cuda_takes_unit_bytes_from_device_allocations() -> None:
    w, units = loaded("gpt/small")
    prof = profile(w, units, repeats=1)  # refused if its uniform plans miss their measured peaks
    assert prof.device.startswith("cuda") and prof.baseline is not None
    keep, recompute = prof.costs[Action.KEEP], prof.costs[Action.RECOMPUTE]
    assert all(k.kept_bytes > 0 for k in keep)
    assert all(r.kept_bytes < k.kept_bytes for r, k in zip(recompute, keep))  # a checkpoint keeps its input only
    assert abs(prof.base_bytes - prof.baseline.live_before_bytes) <= 0.01 * prof.baseline.live_before_bytes


@pytest.mark.parametrize("spec", ["gpt/tiny", "cnn/tiny", "lstm/tiny"])
def test_the_profile_matches_the_measured_uniform_plans_on_cuda(spec: str) -> None:
    w, units = loaded(spec)
    prof = profile(w, units, repeats=1)
    checks = check_profile(prof, w, prof.baseline)
    assert [c.plan for c in checks] == ["all keep", "all recompute", "all selective"]
    assert all(abs(c.error) <= PEAK_TOLERANCE for c in checks), checks


def test_the_exact_frontiers_plans_are_predicted_within_5_percent_on_cuda() -> None:
    w, units = loaded("gpt/small")
    prof = profile(w, units, repeats=1)
    front = exact_frontier(CostModel(prof))
    chosen = front[::max(1, len(front) // 6)][:8]
    assert len(chosen) >= 2
    for point in chosen:
        plan = plan_for(w.model, prof.units, [prof.actions[a] for a in point.plan])
        m = measure(w, plan, prof.units, repeats=1)
        assert abs(point.peak_bytes - m.peak_bytes) <= PEAK_TOLERANCE * m.peak_bytes, (point, m.peak_bytes)


def test_out_of_memory_is_recorded_as_infeasible() -> None:
    w, units = loaded("gpt/small?batch_size=32")
    keep = uniform(w, units, Action.KEEP)
    fits = measure(w, keep, units, repeats=1)
    torch.cuda.synchronize(w.device)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(w.device).total_memory
    # a cap above what is reserved now, by a quarter of what the step adds: the step cannot fit
    cap = torch.cuda.memory_reserved(w.device) + fits.activation_bytes // 4
    torch.cuda.set_per_process_memory_fraction(cap / total, w.device)
    try:
        oom = measure(w, keep, units, repeats=1)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, w.device)
    assert oom.oom and oom.step_seconds_samples == [] and math.isinf(oom.step_seconds)
    assert oom.peak_bytes == total
    again = measure(w, keep, units, repeats=1)  # the device is usable again
    assert not again.oom and abs(again.peak_bytes - fits.peak_bytes) <= 0.01 * fits.peak_bytes


@pytest.mark.parametrize("spec", ["gpt/tiny", "cnn/tiny"])
def test_offload_gives_the_gradients_of_keep_and_prefetches(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c = Case(spec, device="cuda")
    off = offloader_for(c.workload.device)
    monkeypatch.setattr(off, "min_bytes", 1)  # the tiny workloads' activations are all below 1 MiB
    before = dataclasses.replace(off.stats)
    n = len(c.units)
    compare(c, [Action.OFFLOAD] * n)
    assert off.stats.tensors_offloaded > before.tensors_offloaded
    assert off.stats.prefetches - before.prefetches == n - 1
    assert off.stats.bytes_fetched - before.bytes_fetched == off.stats.bytes_offloaded - before.bytes_offloaded
    compare(c, [Action.OFFLOAD, Action.RECOMPUTE, Action.SELECTIVE, Action.KEEP][:n] + [Action.KEEP] * max(0, n - 4))


def test_offload_lowers_the_measured_peak_of_big_activations() -> None:
    w, units = loaded(BIG_GPT)
    keep = measure(w, uniform(w, units, Action.KEEP), units, repeats=2)
    off = measure(w, uniform(w, units, Action.OFFLOAD), units, repeats=2)
    assert not keep.oom and not off.oom
    assert off.activation_bytes < 0.7 * keep.activation_bytes, (off.activation_bytes, keep.activation_bytes)
    assert off.live_before_bytes == keep.live_before_bytes  # pinned host buffers are not device memory


def test_the_snippets_offload_runs_on_cuda() -> None:
    c = Case("gpt/tiny", device="cuda")
    model = c.workload.model
    ns: dict = {}
    exec(compile(plan_snippet(uniform(c.workload, c.units, Action.OFFLOAD)), "<snippet>", "exec"), ns)
    off = ns["offloader_for"](c.workload.device)
    off.min_bytes = 1
    remove = ns["apply_checkpoint_plan"](model)
    try:
        loss, grads, _ = c.step(None)  # the snippet's wrappers are installed on the model
    finally:
        remove()
    assert off.stats.tensors_offloaded > 0 and off.stats.prefetches == len(c.units) - 1
    assert torch.allclose(loss, c.ref_loss)
    for name, g in grads.items():
        assert torch.allclose(g, c.ref_grads[name], rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize("spec", ["gpt/tiny", "cnn/tiny"])
def test_recompute_and_selective_give_the_gradients_and_state_of_keep_on_cuda(spec: str) -> None:
    c = Case(spec, device="cuda")
    n = len(c.units)
    for actions in ([Action.RECOMPUTE] * n, [Action.SELECTIVE] * n, [Action.RECOMPUTE, Action.KEEP] * n):
        compare(c, actions[:n])
        _, _, state = c.step(actions[:n])
        for key, value in state.items():  # BatchNorm's running statistics updated once, as without a plan
            assert torch.allclose(value.float(), c.ref_state[key].float(), rtol=1e-5, atol=1e-7), key

"""Applying a plan: the same gradients, loss and model state as no checkpointing; a clean remove.

Every built-in workload runs with dropout on, so these tests fail if a recompute draws new
dropout masks. Each step starts from the same weights and ``torch.manual_seed(STEP_SEED)``.
"""

from __future__ import annotations

import contextlib
import copy
import gc
from typing import Any, Iterator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import CheckpointPolicy

from env.data.errors import PlanError
from env.data.plan import Action
import env.runtime.apply as apply
from env.runtime.apply import apply_actions, plan_for
from env.units.find import find_units
from env.workloads.workload import load_workload

STEP_SEED = 1234
TINY = ("gpt/tiny", "cnn/tiny", "lstm/tiny", "mlp/tiny")
CPU_ACTIONS = (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.LIGHT)


@contextlib.contextmanager
def deterministic(device: torch.device, strict: bool = True) -> Iterator[None]:
    """On CUDA, deterministic kernels while the block runs: the memory-efficient attention's backward (and
    other CUDA kernels) otherwise sum in an order that varies from run to run, so two steps without any plan
    already differ in the last bits and a comparison could not tell a plan's error from the kernels'.
    ``strict=False``, for a workload with an op that has no deterministic CUDA kernel: the others' deterministic
    kernels, and attention on the math kernel (the efficient one is deterministic in strict mode only)."""
    if device.type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=not strict)
    try:
        with contextlib.nullcontext() if strict else sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


class Case:
    """A workload, its units, its initial state and the no-plan reference step from that state (on CUDA with
    deterministic kernels)."""

    def __init__(self, spec: str, device: str = "cpu") -> None:
        self.workload = load_workload(spec, device=device)
        self.units = find_units(self.workload.model)
        self.initial = copy.deepcopy(self.workload.model.state_dict())
        self.strict = True
        try:
            self.ref_loss, self.ref_grads, self.ref_state = self.step(None)
        except RuntimeError as e:
            if "deterministic" not in str(e):
                raise
            self.strict = False  # an op of this workload has no deterministic CUDA kernel
            self.ref_loss, self.ref_grads, self.ref_state = self.step(None)

    def step(self, actions: list[Action] | None, seed: int = STEP_SEED) -> tuple[torch.Tensor, dict, dict]:
        """One forward/backward from the initial state; (loss, parameter grads, state after)."""
        model = self.workload.model
        model.load_state_dict(self.initial)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        with deterministic(self.workload.device, self.strict):
            if actions is None:
                loss = self.workload.loss()
                loss.backward()
            else:
                with apply_actions(model, plan_for(model, self.units, actions), self.units):
                    loss = self.workload.loss()
                    loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), grads, copy.deepcopy(model.state_dict())


_CASES: dict[str, Case] = {}


def case(spec: str) -> Case:
    if spec not in _CASES:
        _CASES[spec] = Case(spec)
    return _CASES[spec]


def compare(c: Case, actions: list[Action]) -> dict[str, bool]:
    """Assert loss and every gradient match the reference; return which are bitwise equal."""
    loss, grads, _ = c.step(actions)
    assert grads.keys() == c.ref_grads.keys()
    assert torch.allclose(loss, c.ref_loss), f"loss {loss} != {c.ref_loss} for {actions}"
    for name, g in grads.items():
        ref = c.ref_grads[name]
        worst, scale = (g - ref).abs().max().item(), ref.abs().max().item()
        assert torch.allclose(g, ref, rtol=1e-5, atol=1e-7), \
            f"grad of {name} differs for {actions}: by up to {worst:.3g} where it reaches {scale:.3g}"
    return {"loss": torch.equal(loss, c.ref_loss), **{n: torch.equal(g, c.ref_grads[n]) for n, g in grads.items()}}


@pytest.mark.parametrize("spec", TINY)
def test_dropout_is_on_so_a_replayed_mask_matters(spec: str) -> None:
    """Guards the gradient tests: another seed gives another loss, so the seed is what makes them equal."""
    c = case(spec)
    other_loss, _, _ = c.step(None, seed=STEP_SEED + 1)
    assert not torch.equal(other_loss, c.ref_loss)


@pytest.mark.parametrize("spec", TINY)
@settings(max_examples=4, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_plans_give_the_same_loss_and_gradients(spec: str, data: st.DataObject) -> None:
    c = case(spec)
    actions = data.draw(st.lists(st.sampled_from(CPU_ACTIONS), min_size=len(c.units), max_size=len(c.units)))
    compare(c, actions)


@pytest.mark.parametrize("spec", TINY)
@pytest.mark.parametrize("action", [Action.RECOMPUTE, Action.SELECTIVE, Action.LIGHT])
def test_uniform_plans_are_bitwise_equal_on_cpu(spec: str, action: Action) -> None:
    """On CPU the replayed forward runs the same kernels on the same data: not just close, equal."""
    c = case(spec)
    equal = compare(c, [action] * len(c.units))
    assert all(equal.values()), f"not bitwise equal: {[k for k, v in equal.items() if not v]}"


def test_batchnorm_state_after_a_recompute_step_is_as_without_a_plan() -> None:
    c = case("cnn/tiny")
    n = len(c.units)
    for actions in ([Action.RECOMPUTE] * n, [Action.SELECTIVE] * n, [Action.LIGHT] * n, [Action.RECOMPUTE, Action.KEEP] * n):
        _, _, state = c.step(actions[:n])
        assert state.keys() == c.ref_state.keys()
        for key, value in state.items():
            assert torch.equal(value, c.ref_state[key]), f"{key} differs after {actions[:n]}"
    tracked = [k for k in c.ref_state if k.endswith("num_batches_tracked")]
    assert tracked and all(int(c.ref_state[k]) == int(c.initial[k]) + 1 for k in tracked)
    moved = [k for k in c.ref_state if k.endswith("running_mean")]
    assert all(not torch.equal(c.ref_state[k], c.initial[k]) for k in moved)


def test_selective_saves_attention_only_where_it_draws_no_dropout() -> None:
    """On CUDA the fused attention kernels draw their own dropout mask: saved, the recompute would skip that
    draw and every later dropout would get another mask (found on an H200: gpt/tiny's gradients 1% off)."""
    aten = torch.ops.aten
    q = torch.zeros(1, 1, 2, 2)
    save, recompute = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    efficient = aten._scaled_dot_product_efficient_attention.default
    flash = aten._scaled_dot_product_flash_attention.default
    assert apply._selective_policy(None, efficient, q, q, q, None, True, 0.1, True) == recompute
    assert apply._selective_policy(None, efficient, q, q, q, None, True, 0.0, True) == save
    assert apply._selective_policy(None, efficient, q, q, q, None, True) == save  # dropout_p's default, 0
    assert apply._selective_policy(None, flash, q, q, q, 0.1) == recompute
    assert apply._selective_policy(None, flash, q, q, q, dropout_p=0.1) == recompute
    assert apply._selective_policy(None, flash, q, q, q, 0.0) == save
    assert apply._selective_policy(None, aten.mm.default, q, q) == save
    assert apply._selective_policy(None, aten.native_dropout.default, q, 0.5, True) == recompute
    assert apply._selective_policy(None, aten.rand_like.default, q) == recompute


class _Noisy(nn.Module):
    """A draw (noise), then a dropout after it: the dropout's mask depends on the noise having drawn first."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(F.dropout(h * torch.rand_like(h), 0.5, self.training))


def test_selective_recomputes_a_saved_op_that_draws_so_later_draws_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA case on CPU: an op 'selective' would save (here ``rand_like``, made one of SAVED_OPS) draws
    random numbers, and a dropout follows it in the unit. Served from the saved outputs, the recompute would
    give the dropout the noise's numbers, and ``b`` another input: b's gradient would differ."""
    monkeypatch.setattr(apply, "SAVED_OPS", apply.SAVED_OPS | {torch.ops.aten.rand_like.default})
    torch.manual_seed(0)
    model = nn.Sequential(_Noisy(), _Noisy()).train()
    x = torch.randn(4, 8)
    units = ["0", "1"]

    def grads(actions: list[Action] | None) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(STEP_SEED)
        with apply_actions(model, plan_for(model, units, actions), units) if actions else contextlib.nullcontext():
            model(x).square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    reference = grads(None)
    for got, want in zip(grads([Action.SELECTIVE] * 2), reference):
        assert torch.equal(got, want)


def test_light_saves_what_selective_does_and_the_normalizations_but_no_draw() -> None:
    """'light' grades 'selective': it saves its outputs and those of layer norm and softmax (and so recomputes
    less), recomputes the pointwise ops, and recomputes every call that draws (dropout; attention with dropout)."""
    aten = torch.ops.aten
    q = torch.zeros(1, 1, 2, 2)
    save, recompute = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert apply.SAVED_OPS < apply.LIGHT_SAVED_OPS
    for op in (aten.mm.default, aten.native_layer_norm.default, aten._softmax.default, aten._safe_softmax.default):
        assert apply._light_policy(None, op, q) == save, op
    for op in (aten.gelu.default, aten.add.Tensor, aten.mul.Tensor, aten.view.default, aten.empty_like.default,
               aten.native_batch_norm.default):
        assert apply._light_policy(None, op, q) == recompute, op
    assert apply._light_policy(None, aten.native_dropout.default, q, 0.5, True) == recompute
    assert apply._light_policy(None, aten.bernoulli_.float, q, 0.5) == recompute
    flash = aten._scaled_dot_product_flash_attention.default
    assert apply._light_policy(None, flash, q, q, q, 0.1) == recompute
    assert apply._light_policy(None, flash, q, q, q, 0.0) == save


def test_light_recomputes_a_saved_op_that_draws_so_later_draws_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for 'selective' (below): a draw among LIGHT_SAVED_OPS is recomputed, so the later dropout's mask replays."""
    monkeypatch.setattr(apply, "LIGHT_SAVED_OPS", apply.LIGHT_SAVED_OPS | {torch.ops.aten.rand_like.default})
    torch.manual_seed(0)
    model = nn.Sequential(_Noisy(), _Noisy()).train()
    x = torch.randn(4, 8)

    def grads(actions: list[Action] | None) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(STEP_SEED)
        with apply_actions(model, plan_for(model, ["0", "1"], actions), ["0", "1"]) if actions else contextlib.nullcontext():
            model(x).square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    reference = grads(None)
    for got, want in zip(grads([Action.LIGHT] * 2), reference):
        assert torch.equal(got, want)


def test_offload_without_cuda_is_refused_on_one_line() -> None:
    c = case("mlp/tiny")
    plan = plan_for(c.workload.model, c.units, [Action.OFFLOAD] + [Action.KEEP] * (len(c.units) - 1))
    with pytest.raises(PlanError) as err:
        apply_actions(c.workload.model, plan, c.units)
    msg = str(err.value)
    assert "offload" in msg and c.units[0] in msg and "CUDA" in msg and "recompute" in msg and "\n" not in msg
    assert not any("forward" in m.__dict__ for m in c.workload.model.modules())


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["gpt/tiny", "cnn/tiny"])
def test_offload_gives_the_same_gradients_on_cuda(spec: str) -> None:
    c = Case(spec, device="cuda")
    n = len(c.units)
    compare(c, [Action.OFFLOAD] * n)
    compare(c, [Action.OFFLOAD, Action.RECOMPUTE, Action.SELECTIVE, Action.KEEP][:n] + [Action.KEEP] * max(0, n - 4))


def _snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "dicts": {name: dict(m.__dict__) for name, m in model.named_modules()},
        "keys": list(model.state_dict()),
        "hooks": {name: (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
                  for name, m in model.named_modules()},
    }


def _dict_contents(snapshot: dict[str, Any]) -> dict[str, set[str]]:
    return {name: set(d) for name, d in snapshot["dicts"].items()}


def test_apply_then_remove_leaves_the_model_exactly_as_before() -> None:
    w = load_workload("gpt/tiny")
    model, units = w.model, find_units(w.model)
    before = _snapshot(model)
    plan = plan_for(model, units, [Action.RECOMPUTE, Action.SELECTIVE, Action.KEEP, Action.RECOMPUTE])
    with apply_actions(model, plan, units) as handle:
        assert handle.applied == {"blocks.0": Action.RECOMPUTE, "blocks.1": Action.SELECTIVE,
                                  "blocks.3": Action.RECOMPUTE}
        assert "forward" in model.blocks[0].__dict__ and "forward" not in model.blocks[2].__dict__
        assert list(model.state_dict()) == before["keys"]
        w.loss().backward()
    after = _snapshot(model)
    assert _dict_contents(after) == _dict_contents(before)
    assert after["keys"] == before["keys"] and after["hooks"] == before["hooks"]
    for name, m in model.named_modules():
        assert m.forward.__func__ is type(m).forward, f"{name}.forward is not its class's forward"


def test_remove_restores_a_forward_the_unit_had_before() -> None:
    w = load_workload("mlp/tiny")
    units = find_units(w.model)
    block = w.model.get_submodule(units[0])
    own = block.forward  # e.g. another library's wrapper set on the instance
    block.forward = own
    with apply_actions(w.model, plan_for(w.model, units, [Action.RECOMPUTE] * len(units)), units):
        assert block.__dict__["forward"] is not own
    assert block.__dict__["forward"] is own


def test_applying_twice_is_refused_and_leaves_the_first_plan() -> None:
    w = load_workload("mlp/tiny")
    units = find_units(w.model)
    plan = plan_for(w.model, units, [Action.RECOMPUTE] * len(units))
    with apply_actions(w.model, plan, units) as first:
        with pytest.raises(PlanError, match=r"already has a plan applied; remove it first"):
            apply_actions(w.model, plan, units)
        assert all("forward" in w.model.get_submodule(u).__dict__ for u in first.applied)
    assert not any("forward" in m.__dict__ for m in w.model.modules())


def _live_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_replanning_200_times_leaks_nothing() -> None:
    w = load_workload("mlp/tiny")
    model, units = w.model, find_units(w.model)
    n = len(units)
    plans = [plan_for(model, units, [CPU_ACTIONS[(i + k) % 3] for k in range(n)]) for i in range(3)]

    def replan(times: int) -> None:
        for i in range(times):
            with apply_actions(model, plans[i % 3], units):
                w.loss().backward()
            model.zero_grad(set_to_none=True)

    replan(20)  # warm: first-call caches of autograd and the checkpoint code
    objects_before = _live_objects()
    replan(200)
    growth = _live_objects() - objects_before
    assert growth < 50, f"{growth} more live objects after 200 re-plans"
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert not any("forward" in m.__dict__ for m in model.modules())


# ---------------------------------------------------------------------------------------------
# Chain regions: a recompute unit and the chain units after it, recomputed as one checkpoint

R, C, K = Action.RECOMPUTE, Action.CHAIN, Action.KEEP
CHAINED = {  # plans over each tiny workload's blocks (gpt/tiny: 4, cnn/tiny: 5, mlp/tiny: 4)
    "gpt/tiny": [[R, C, C, C], [R, C, K, R], [K, R, C, Action.SELECTIVE]],
    "cnn/tiny": [[R, C, C, C, C], [K, R, C, R, C]],
    "mlp/tiny": [[R, C, C, C], [R, R, C, K]],
}


@pytest.mark.parametrize("spec", sorted(CHAINED))
def test_chained_plans_give_the_same_loss_gradients_and_state_bitwise(spec: str) -> None:
    c = case(spec)
    for actions in CHAINED[spec]:
        equal = compare(c, actions)
        assert all(equal.values()), f"{actions}: not bitwise equal: {[k for k, v in equal.items() if not v]}"
        _, _, state = c.step(actions)
        for key, value in state.items():  # BatchNorm's statistics updated once, as without a plan
            assert torch.equal(value, c.ref_state[key]), f"{key} differs after {actions}"


def test_a_chain_over_units_that_do_not_chain_is_refused_in_one_line_naming_the_pair() -> None:
    from tests.test_workloads import one_line_error

    w = load_workload("gpt/tiny")
    units = find_units(w.model, "sub-block")  # blocks.0.ln_1, .attn, .ln_2, .mlp, ...
    actions = [R, C, C] + [K] * (len(units) - 3)  # ln_2 runs on the residual sum, not on attn's output
    with apply_actions(w.model, plan_for(w.model, units, actions), units), pytest.raises(PlanError) as e:
        w.loss()
    one_line_error(e, "units 'blocks.0.attn' and 'blocks.0.ln_2' do not chain", "make 'blocks.0.ln_2' recompute")
    assert not any("forward" in m.__dict__ for m in w.model.modules())


def test_a_chained_plan_is_removed_without_a_trace() -> None:
    w = load_workload("gpt/tiny")
    model, units = w.model, find_units(w.model)
    before = _snapshot(model)
    with apply_actions(model, plan_for(model, units, [R, C, C, K]), units) as handle:
        assert handle.applied == {"blocks.0": R, "blocks.1": C, "blocks.2": C}
        w.loss().backward()
    after = _snapshot(model)
    assert _dict_contents(after) == _dict_contents(before) and after["hooks"] == before["hooks"]


class _Reuse(nn.Module):
    """b runs on a's output alone and c on b's (the hooks see a chain), but the parent adds a's output again."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return (self.c(self.b(h)) + h).square().mean()


def test_chain_links_are_confirmed_on_a_real_step() -> None:
    from env.runtime.chains import candidate_links, chain_links
    from env.workloads.workload import Workload

    w = load_workload("gpt/tiny?n_layer=3")
    sub = find_units(w.model, "sub-block")
    assert chain_links(w, sub) == [False, True, False, True] * 3  # ln_1 -> attn and ln_2 -> mlp only
    assert chain_links(w, find_units(w.model)) == [False, True, True]
    g = torch.Generator().manual_seed(0)
    reuse = Workload(spec="reuse", model=_Reuse(), inputs=(torch.randn(4, 8, generator=g),))
    units = ["a", "b", "c"]
    assert candidate_links(reuse, units) == [False, True, True]  # what the hooks see
    grads_before = [p.grad for p in reuse.model.parameters()]
    assert chain_links(reuse, units) == [False, False, True]  # a -> b changes the step: refused
    assert [p.grad for p in reuse.model.parameters()] == grads_before


def test_a_chained_plan_peaks_no_higher_than_recomputing_every_unit() -> None:
    """gpt/tiny?n_layer=8 at sub-block units (32): each block's norm and attention, and its norm
    and MLP, chain. As regions they keep one input each instead of two, and in backward rerun a
    pair at a time: the measured peak is below recomputing each of the 32 units on its own."""
    from env.measure.measurement import measure
    from env.runtime.chains import chain_links

    w = load_workload("gpt/tiny?n_layer=8")
    units = find_units(w.model, "sub-block")
    links = chain_links(w, units)
    assert len(units) == 32 and sum(links) == 16
    chained = [C if link else R for link in links]
    per_unit = measure(w, plan_for(w.model, units, [R] * 32), units, repeats=1)
    regions = measure(w, plan_for(w.model, units, chained), units, repeats=1)
    assert regions.peak_bytes < per_unit.peak_bytes
    assert regions.live_before_bytes == per_unit.live_before_bytes


# ---------------------------------------------------------------------------------------------
# Blocks: every unit of a parent 'block', the parent recomputed as one checkpoint

B, S = Action.BLOCK, Action.SELECTIVE
BLOCKED = {  # plans over sub-block units: gpt/tiny's blocks have 4 (ln_1, attn, ln_2, mlp); cnn/tiny's BatchNorm
    "gpt/tiny": [[B] * 16, [B] * 4 + [R, C, K, S] + [B] * 4 + [K] * 4],
    "cnn/tiny": [[B] * 19, [K, K] + [B] * 4 + [R] * 4 + [B] * 5 + [K] * 4],
}


@pytest.mark.parametrize("spec", sorted(BLOCKED))
def test_block_plans_give_the_same_loss_gradients_and_state_bitwise(spec: str) -> None:
    """Dropout on (gpt/tiny) and BatchNorm statistics (cnn/tiny): a parent recomputed whole replays the masks and
    updates the statistics once, as without a plan."""
    w = load_workload(spec)
    c = Case.__new__(Case)
    c.workload, c.units, c.strict = w, find_units(w.model, "sub-block"), True
    c.initial = copy.deepcopy(w.model.state_dict())
    c.ref_loss, c.ref_grads, c.ref_state = c.step(None)
    for actions in BLOCKED[spec]:
        assert len(actions) == len(c.units)
        equal = compare(c, actions)
        assert all(equal.values()), f"{actions}: not bitwise equal: {[k for k, v in equal.items() if not v]}"
        _, _, state = c.step(actions)
        for key, value in state.items():
            assert torch.equal(value, c.ref_state[key]), f"{key} differs after {actions}"


def test_a_block_is_applied_to_its_parent_and_removed_without_a_trace() -> None:
    w = load_workload("gpt/tiny")
    model, units = w.model, find_units(w.model, "sub-block")
    before = _snapshot(model)
    with apply_actions(model, plan_for(model, units, [B] * 4 + [R] + [K] * 11), units) as handle:
        assert handle.applied == {"blocks.1.ln_1": R, "blocks.0": B}
        assert "forward" in model.blocks[0].__dict__ and "forward" not in model.blocks[0].attn.__dict__
        w.loss().backward()
    after = _snapshot(model)
    assert _dict_contents(after) == _dict_contents(before) and after["hooks"] == before["hooks"]


def test_a_block_over_part_of_a_parent_or_with_no_parent_of_its_own_is_refused_in_one_line() -> None:
    from tests.test_workloads import one_line_error

    w = load_workload("gpt/tiny")
    sub = find_units(w.model, "sub-block")
    with pytest.raises(PlanError) as e:
        apply_actions(w.model, plan_for(w.model, sub, [B, B, B, K] + [K] * 12), sub)
    one_line_error(e, "'blocks.0.ln_1' is 'block' and 'blocks.0.mlp', another unit of its parent 'blocks.0', is "
                      "'keep'", "make every unit of 'blocks.0' block, or none")
    blocks = find_units(w.model)  # blocks.0 .. blocks.3: their parent is a ModuleList
    with pytest.raises(PlanError) as e:
        apply_actions(w.model, plan_for(w.model, blocks, [B] * 4), blocks)
    one_line_error(e, "its parent 'blocks' is a ModuleList, which runs no forward of its own", "recompute the units")
    mlp = load_workload("mlp/tiny")
    top = [n for n, _ in mlp.model.named_children()]
    with pytest.raises(PlanError) as e:
        apply_actions(mlp.model, plan_for(mlp.model, top, [B] * len(top)), top)
    one_line_error(e, "its parent is the model itself", "make it recompute")
    assert not any("forward" in m.__dict__ for m in (*w.model.modules(), *mlp.model.modules()))


def test_block_spans_are_the_parents_whose_recompute_gives_the_same_step() -> None:
    from env.runtime.chains import block_spans, parent_runs

    w = load_workload("gpt/tiny?n_layer=3")
    sub = find_units(w.model, "sub-block")
    assert block_spans(w, sub) == [(0, 4), (4, 8), (8, 12)]
    assert parent_runs(w.model, find_units(w.model)) == []  # blocks' parent is a ModuleList
    assert parent_runs(w.model, sub[:3] + sub[4:]) == [(3, 7), (7, 11)]  # blocks.0's mlp is no unit here

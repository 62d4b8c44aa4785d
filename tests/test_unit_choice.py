"""Automatic units: where the saved activations are, each unit run once, in an order the profile accepts.

Also the nothing-to-save message, which reads only a profile.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from env.cost.cost_model import CostModel
from env.cost.headroom import lowest_and_keep_peak, nothing_to_save
from env.data.errors import MeasurementError, UnitError
from env.data.plan import Action
from env.measure.measurement import measure
from env.measure.profiler import profile
from env.runtime.apply import apply_actions, plan_for
from env.units.choice import MAX_UNITS, UnitChoice, choose_units, module_memory, out_of_order, resolve_units
from env.units.find import find_units
from env.workloads.workload import Workload, load_workload
from tests.test_workloads import one_line_error
from tests.test_zoo import SMALL as SMALL_ZOO
from tests.test_zoo import needs_zoo, small

ROOT = Path(__file__).resolve().parents[1]
UNET = "examples/unet_skips.py:build?batch_size=1&image_size=32&width=8"


class MLPBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class SharedTwice(nn.Module):
    """One block called twice per step (weight sharing), then three ordinary blocks."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.inp, self.shared = nn.Linear(8, d), MLPBlock(d)
        self.blocks = nn.ModuleList(MLPBlock(d) for _ in range(3))
        self.out = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.shared(self.shared(self.inp(x)))
        for block in self.blocks:
            h = block(h)
        return F.mse_loss(self.out(h).squeeze(-1), y)


class NamedOnly(nn.Module):
    """Structure only in named children: no ModuleList or Sequential anywhere."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.first, self.second, self.third = MLPBlock(d), MLPBlock(d), MLPBlock(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.third(self.second(self.first(x))).pow(2).mean()


class ReturnsSkip(nn.Module):
    """Returns the skip tensor it was given first: its first output was made before the unit ran."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.mlp = MLPBlock(d)

    def forward(self, h: torch.Tensor, skip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return skip, self.mlp(h)


class PassThrough(nn.Module):
    """``b`` runs after ``a`` but the gradient of its first output (``stem``'s) arrives after ``a``'s."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.stem, self.a, self.b, self.c = MLPBlock(d), MLPBlock(d), ReturnsSkip(d), MLPBlock(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stem(x)
        skip, h = self.b(self.a(s), s)
        return (self.c(h) + skip).pow(2).mean()



class LossInside(nn.Module):
    """A language model whose own forward computes the loss over a large vocabulary, wrapped once: the
    loss saves far more than 5% of the bytes, and it is ``lm``'s own, so no split of ``lm`` covers 95%."""

    def __init__(self, vocab: int = 2048, d: int = 32, n: int = 6) -> None:
        super().__init__()
        self.lm = nn.Module()
        self.lm.emb, self.lm.blocks = nn.Embedding(vocab, d), nn.ModuleList(MLPBlock(d) for _ in range(n))
        self.lm.head = nn.Linear(d, vocab)
        self.lm.forward = self._lm_forward  # type: ignore[method-assign]

    def _lm_forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.lm.emb(idx)
        for block in self.lm.blocks:
            x = block(x)
        logits = self.lm.head(x).log_softmax(-1)
        return F.nll_loss(logits.view(-1, logits.size(-1)), targets.view(-1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.lm(idx, targets)

def workload(model: nn.Module, *inputs: torch.Tensor) -> Workload:
    return Workload(f"test:{type(model).__name__}", model, inputs)


def g() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# ---------------------------------------------------------------------------------------------
# The instrumented step

def test_saved_bytes_are_attributed_to_the_innermost_module_and_counted_once() -> None:
    torch.manual_seed(0)
    model = NamedOnly(d=16)
    x = torch.randn(32, 16, generator=g())
    mem = module_memory(workload(model, x))
    # first.up (Linear) saves its input x: the batch, live before the step, is not counted;
    # gelu saves up's output (32 x 64 floats) while 'first' is the innermost module;
    # first.down saves gelu's output (32 x 64 floats)
    assert mem.bytes_of(mem.modules["first.up"].own) == 0
    assert mem.bytes_of(mem.modules["first"].own) == 32 * 64 * 4
    assert mem.bytes_of(mem.modules["first.down"].own) == 32 * 64 * 4
    # second.up saves first's output, which no one saved before it
    assert mem.bytes_of(mem.modules["second.up"].own) == 32 * 16 * 4
    assert all(mem.modules[n].calls == 1 for n in ("first", "second", "third", "first.up"))
    assert mem.modules[""].calls == 1 and mem.modules["first"].first_call < mem.modules["second"].first_call
    # backward reaches the last block's output first
    assert mem.modules["third"].grad_order < mem.modules["second"].grad_order < mem.modules["first"].grad_order


def test_the_instrumented_step_leaves_weights_buffers_grads_and_rng_as_they_were() -> None:
    w = load_workload("cnn/tiny")  # BatchNorm running statistics, dropout
    state = copy.deepcopy(w.model.state_dict())
    rng = torch.get_rng_state()
    module_memory(w)
    assert all(torch.equal(v, state[k]) for k, v in w.model.state_dict().items())
    assert all(p.grad is None for p in w.model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    w.loss().backward()
    before = {n: p.grad.clone() for n, p in w.model.named_parameters()}
    module_memory(w)  # in the middle of gradient accumulation: the gradients stay as they were
    assert all(torch.equal(p.grad, before[n]) for n, p in w.model.named_parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in w.model.modules())


# ---------------------------------------------------------------------------------------------
# The choice

@pytest.mark.parametrize("spec", ["gpt/tiny", "cnn/tiny", "lstm/tiny", "mlp/tiny"])
def test_on_the_builtins_auto_units_are_the_repeated_blocks(spec: str) -> None:
    """Where the old rule was right (stacks of blocks), the automatic choice agrees with it, and adds the
    loss unit where the model has one (gpt's ``lm_loss``)."""
    w = load_workload(spec)
    loss = ["lm_loss"] if spec.startswith("gpt") else []
    assert resolve_units(w).units == find_units(w.model) + loss


def test_user_unet_with_skips_gets_its_blocks_and_never_the_shared_pool() -> None:
    choice = resolve_units(load_workload(UNET))
    assert choice.units == ["down1", "down2", "down3", "bottom", "dec3", "dec2", "dec1"]
    assert choice.coverage >= 0.95 and choice.mode == "auto"
    assert "pool" not in choice.units  # called three times a step
    old = find_units(load_workload(UNET).model)  # the old rule: the six layers of the largest block
    assert len(old) == 6 and all(u.startswith("bottom.") for u in old)


@needs_zoo
@pytest.mark.parametrize("spec", sorted(SMALL_ZOO))
def test_zoo_units_cover_the_saved_bytes(spec: str) -> None:
    w = small(spec)
    choice = resolve_units(w)
    assert choice.coverage >= 0.95, "\n".join(choice.lines())
    assert 2 <= len(choice.units) <= MAX_UNITS
    mem = module_memory(w)
    assert all(mem.modules[u].calls == 1 for u in choice.units)
    assert out_of_order(mem, choice.units) is None
    for a in choice.units:  # non-overlapping
        assert not any(b.startswith(a + ".") for b in choice.units)


@needs_zoo
def test_auto_units_find_what_the_old_rule_misses_on_t5_and_unet2d() -> None:
    t5 = resolve_units(small("hf/t5"))
    assert any(u.startswith("encoder.") for u in t5.units) and any(u.startswith("decoder.") for u in t5.units)
    assert resolve_units(small("hf/t5"), ["blocks"]).coverage < 0.5  # the decoder only
    unet = resolve_units(small("diffusers/unet2d"))
    assert any(u.startswith("down_blocks.") for u in unet.units) and any(u.startswith("up_blocks.") for u in unet.units)


def test_a_block_called_twice_is_never_a_unit_and_the_profile_runs() -> None:
    torch.manual_seed(0)
    w = workload(SharedTwice(), torch.randn(64, 8, generator=g()), torch.randn(64, generator=g()))
    choice = resolve_units(w)
    assert choice.units and not any(u == "shared" or u.startswith("shared.") for u in choice.units)
    assert {"blocks.0", "blocks.1", "blocks.2"} <= set(choice.units)
    prof = profile(w, choice.units, repeats=1, baseline=False)  # no "unit ran twice"
    assert prof.units == choice.units
    with pytest.raises(UnitError) as e:
        resolve_units(w, ["shared"])
    one_line_error(e, "unit 'shared' runs 2 times", "exactly once", "--units auto")


def test_a_model_with_only_named_children_gets_units() -> None:
    torch.manual_seed(0)
    w = workload(NamedOnly(), torch.randn(32, 16, generator=g()))
    with pytest.raises(UnitError):
        find_units(w.model)  # the old rule refuses it
    assert resolve_units(w).units == ["first", "second", "third"]


def test_units_out_of_the_profiles_order_are_repaired_or_refused_when_given() -> None:
    torch.manual_seed(0)
    w = workload(PassThrough(), torch.randn(32, 16, generator=g()))
    given = ["stem", "a", "b", "c"]
    mem = module_memory(w)
    assert out_of_order(mem, given) == ("a", "b")
    with pytest.raises(MeasurementError, match="did not run in the expected order"):
        profile(w, given, repeats=1, baseline=False)  # the check mirrors the profile's own
    choice = choose_units(mem)
    assert out_of_order(mem, choice.units) is None and len(choice.units) >= 2
    assert profile(w, choice.units, repeats=1, baseline=False).units == choice.units
    with pytest.raises(UnitError) as e:
        resolve_units(w, given)
    one_line_error(e, "units 'a' and 'b' are out of the profile's order", "common parent", "--units auto")


def test_max_units_bounds_the_splits() -> None:
    torch.manual_seed(0)
    body = nn.Sequential(*[MLPBlock(16) for _ in range(6)])
    w = Workload("test:wrapped", nn.Sequential(body, nn.Linear(16, 1)), (torch.randn(32, 16, generator=g()),),
                 loss_fn=lambda m, x: m(*x).pow(2).mean())
    assert resolve_units(w).units == [f"0.{i}" for i in range(6)]  # the wrapper split into its blocks
    assert len(resolve_units(w, max_units=3).units) <= 3  # six blocks would not fit: no split
    with pytest.raises(UnitError, match="max_units=0 must be at least 1"):
        resolve_units(w, max_units=0)
    # a stack deeper than max_units keeps every block (as the old rule): the budget bounds splits only
    deep = load_workload("gpt/tiny?n_layer=40")
    assert resolve_units(deep, max_units=32).units == find_units(deep.model) + ["lm_loss"]


def test_the_old_rules_and_patterns_through_one_entry_point() -> None:
    w = load_workload("gpt/tiny")
    assert resolve_units(w, ["blocks"]).units == find_units(w.model)
    assert resolve_units(w, ["sub-blocks"]).units == find_units(w.model, "sub-block")
    chosen = resolve_units(w, ["blocks.*.mlp"])
    assert chosen.units == [f"blocks.{i}.mlp" for i in range(4)] and chosen.mode == "patterns"
    assert 0 < chosen.coverage < resolve_units(w, ["blocks"]).coverage
    assert resolve_units(w, []).mode == "auto"
    with pytest.raises(UnitError) as e:
        resolve_units(w, ["auto", "blocks.0"])
    one_line_error(e, "'auto' must be given alone", "auto, blocks, sub-blocks")


def test_unit_choice_is_plain_data_with_readable_lines() -> None:
    choice = resolve_units(load_workload("gpt/tiny"))
    again = UnitChoice.model_validate_json(choice.model_dump_json())
    assert again == choice
    lines = choice.lines()
    assert len(lines) == len(choice.units) + 1
    assert lines[0].startswith(choice.units[0]) and "MiB" in lines[0] and "%" in lines[0]
    assert f"{choice.coverage:.1%}" in lines[-1] and "units (auto)" in lines[-1]


# ---------------------------------------------------------------------------------------------
# End to end: the profile accepts the units, and the prediction of the uniform plans is exact

@needs_zoo
@pytest.mark.slow
@pytest.mark.parametrize("spec", ["diffusers/unet2d", "hf/t5"])
def test_profile_and_cost_model_on_auto_units_match_measured_peaks(spec: str) -> None:
    w = small(spec)
    units = resolve_units(w).units
    prof = profile(w, units, repeats=1, baseline=False)
    cm = CostModel(prof)
    for action in (Action.KEEP, Action.RECOMPUTE):
        measured = measure(w, plan_for(w.model, units, [action] * len(units)), units, repeats=1).peak_bytes
        assert cm.peak_bytes([prof.actions.index(action)] * len(units)) == pytest.approx(measured, rel=0.02)


@needs_zoo
def test_a_plan_over_auto_units_gives_the_gradients_of_no_checkpointing() -> None:
    w = small("diffusers/unet2d")  # dropout on, GroupNorm, attention, skips
    units = resolve_units(w).units
    cycle = [Action.RECOMPUTE, Action.SELECTIVE, Action.KEEP]
    plan = plan_for(w.model, units, [cycle[i % 3] for i in range(len(units))])

    def grads(with_plan: bool) -> dict[str, torch.Tensor]:
        w.model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        if with_plan:
            with apply_actions(w.model, plan, units):
                w.loss().backward()
        else:
            w.loss().backward()
        return {n: p.grad.clone() for n, p in w.model.named_parameters() if p.grad is not None}

    ref, got = grads(False), grads(True)
    assert ref.keys() == got.keys() and ref
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------
# Nothing to save

def test_nothing_to_save_names_the_weights_when_they_hold_the_peak() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    w = Workload("test:huge-linear", model, (torch.randn(2, 1024, generator=g()),),
                 loss_fn=lambda m, x: m(*x).pow(2).mean())
    prof = profile(w, resolve_units(w).units, repeats=1, baseline=False)
    msg = nothing_to_save(prof)
    assert msg is not None and "\n" not in msg
    for words in ("nothing to save", "more than 5%", "live before the step", "weights, optimizer state",
                  "nor will a smaller batch", "FSDP"):
        assert words in msg, msg
    lowest, keep = lowest_and_keep_peak(prof)
    assert 0 <= 1 - lowest / keep <= 0.05


def test_nothing_to_save_points_at_the_units_when_activations_are_outside_them() -> None:
    w = load_workload("gpt/tiny?batch_size=16&seq_len=64")
    msg = nothing_to_save(profile(w, ["blocks.0.ln_1"], repeats=1, baseline=False))
    assert msg is not None and "'blocks.0.ln_1' the most" in msg
    assert "most of it is outside the units" in msg and "finer units" in msg and "FSDP" not in msg


def test_nothing_to_save_is_silent_when_a_plan_saves() -> None:
    w = load_workload("gpt/tiny")
    prof = profile(w, find_units(w.model), repeats=1, baseline=False)
    lowest, keep = lowest_and_keep_peak(prof)
    assert 1 - lowest / keep > 0.05
    assert nothing_to_save(prof) is None
    assert nothing_to_save(prof, threshold=0.99) is not None  # the threshold is what decides


def test_headroom_imports_without_torch() -> None:
    code = "import sys, env.cost.headroom; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_model_whose_own_loss_saves_much_still_gets_a_split_that_saves() -> None:
    """Where the top module's own forward (the loss over the logits) saves more than 5% of the bytes, no
    split reaches 95% coverage; the estimated peak decides, so the units are the blocks, not the whole model."""
    torch.manual_seed(0)
    idx = torch.randint(0, 2048, (4, 64), generator=g())
    w = workload(LossInside(), idx, torch.randint(0, 2048, (4, 64), generator=g()))
    mem = module_memory(w)
    assert mem.bytes_of(set(mem.modules["lm"].own)) > 0.05 * mem.bytes_of(mem.outside | set().union(
        *(set(m.own) for m in mem.modules.values())))  # the premise: the loss saves more than 5%
    choice = resolve_units(w)
    assert choice.units == [f"lm.blocks.{i}" for i in range(6)]
    keep = measure(w, plan_for(w.model, choice.units, [Action.KEEP] * 6), choice.units, repeats=1)
    blocks = measure(w, plan_for(w.model, choice.units, [Action.RECOMPUTE] * 6), choice.units, repeats=1)
    whole = measure(w, plan_for(w.model, ["lm"], [Action.RECOMPUTE]), ["lm"], repeats=1)  # the choice before
    assert whole.activation_bytes >= 0.95 * keep.activation_bytes  # one unit over the whole model saves nothing
    assert blocks.activation_bytes < 0.85 * keep.activation_bytes  # the blocks save

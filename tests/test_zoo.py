"""Zoo workloads (hf/*, diffusers/unet2d): specs build library models with a scalar loss; bad specs fail on one line.

Also: the HF export path (``apply_hf_plan``) and the libraries' own gradient checkpointing on
these models, and bad option values of any built-in.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from env.data.errors import PlanError
from env.data.plan import Action
from env.runtime.apply import plan_for
from env.units.choice import resolve_units
from env.workloads.spec import PRESETS, WorkloadSpec, builtin_options, workload_names, zoo_specs
from env.workloads.workload import load_workload
from env.workloads.zoo import zoo_available
from search.training.integrations import apply_hf_plan
from tests.test_workloads import refused

needs_zoo = pytest.mark.skipif(not zoo_available(), reason="transformers/diffusers are not installed")
SMALL = {
    "hf/llama": "batch_size=1&seq_len=32",
    "hf/llama-1b": "batch_size=1&seq_len=32&n_layer=2&d_model=64&n_head=2&d_ff=176&vocab_size=256",  # its shape, small
    "hf/gpt2": "batch_size=1&seq_len=32",
    "hf/bert": "batch_size=1&seq_len=32",
    "hf/t5": "batch_size=1&seq_len=32&target_len=16",
    "hf/resnet50": "batch_size=1&image_size=64",
    "diffusers/unet2d": "batch_size=1&image_size=32",
}
HF = [s for s in SMALL if s.startswith("hf/")]


def small(spec: str, seed: int = 0):
    return load_workload(f"{spec}?{SMALL[spec]}", seed=seed)


def grads(w, seed: int = 5) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    w.model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = w.loss()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in w.model.named_parameters() if p.grad is not None}


def assert_same(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert got.keys() == ref.keys() and ref
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6, msg=name)


def test_every_zoo_spec_is_listed_and_has_a_small_size_here() -> None:
    assert sorted(zoo_specs()) == sorted(SMALL)
    assert set(workload_names()) == {"gpt", "cnn", "lstm", "mlp"}  # the core built-ins, each with 'tiny'


@needs_zoo
@pytest.mark.parametrize("spec", sorted(SMALL))
def test_a_zoo_spec_builds_deterministically_with_a_scalar_loss_whose_backward_runs(spec: str) -> None:
    a, b = small(spec), small(spec)
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert a.model.training
    loss, g = grads(a)
    assert loss.dim() == 0 and torch.isfinite(loss)
    n_params = sum(1 for p in a.model.parameters() if p.requires_grad)
    assert len(g) >= 0.9 * n_params and all(torch.isfinite(t).all() for t in g.values())


@needs_zoo
def test_zoo_options_work_as_for_the_builtins() -> None:
    w = load_workload("hf/llama?batch_size=2&seq_len=16&n_layer=2")
    assert w.batch_shape == "input_ids:2x16,labels:2x16"
    assert len(w.model.model.layers) == 2
    assert w.spec == "hf/llama?batch_size=2&n_layer=2&seq_len=16"
    assert builtin_options(WorkloadSpec.parse("diffusers/unet2d?batch_size=2"))["batch_size"] == 2
    assert load_workload("diffusers/unet2d?batch_size=1&image_size=32&widths=32,64").model.config.block_out_channels \
        == (32, 64)


def test_a_zoo_target_needs_a_model_preset() -> None:
    refused("hf", "workload 'hf' needs a model preset", "hf/llama", "hf/resnet50")
    refused("hf/mistral", "unknown preset 'mistral'", "llama, llama-1b, gpt2, bert, t5, resnet50")
    refused("diffusers/unet2d?layers=3", "unknown option 'layers'", "layers_per_block")


def test_a_missing_library_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("transformers", "diffusers") else real(name, *a))
    for spec, library in (("hf/gpt2", "transformers"), ("diffusers/unet2d", "diffusers")):
        refused(spec, f"'{spec}' needs {library}", "pip install 'ckpt-search[hf]'")


def test_a_bad_option_value_fails_on_one_line() -> None:
    refused("gpt?n_layer=abc", "option n_layer=abc must be an integer", "n_layer=6")
    refused("gpt/tiny?dropout=lots", "option dropout=lots must be a number", "dropout=0.1")
    refused("gpt/tiny?tokens=17", "option tokens=17 must lie between 1 and seq_len=16", "(0: seq_len)")
    assert PRESETS["gpt"]["tiny"]["n_layer"] == 4  # presets are not changed by a failed parse


def _hf_checkpointing(model) -> tuple:
    """(enable, disable) of transformers' own checkpointing; transformers 5 renamed them."""
    if hasattr(model, "activation_checkpointing_enable"):
        return model.activation_checkpointing_enable, model.activation_checkpointing_disable
    return model.gradient_checkpointing_enable, model.gradient_checkpointing_disable


@needs_zoo
@pytest.mark.parametrize("spec", HF)
def test_transformers_own_checkpointing_runs_and_the_hf_export_refuses_to_double_it(spec: str) -> None:
    w = small(spec)
    units = resolve_units(w).units
    plan = plan_for(w.model, units, [Action.RECOMPUTE] * len(units))
    ref_loss, ref = grads(w)
    enable, disable = _hf_checkpointing(w.model)
    if w.model.supports_gradient_checkpointing:
        enable()
        loss, _ = grads(w)  # transformers' own checkpointing works on the zoo model
        assert torch.equal(loss, ref_loss)
        with pytest.raises(PlanError, match="gradient checkpointing on"):
            apply_hf_plan(w.model, plan)
        disable()
    else:  # ResNet: transformers cannot checkpoint it, a plan can
        with pytest.raises(ValueError, match="does not support"):
            enable()
    with apply_hf_plan(w.model, plan) as handle:  # our plan over the automatic units, exported the HF way
        assert sorted(handle.applied) == sorted(units)
        loss, got = grads(w)
    assert torch.equal(loss, ref_loss)
    assert_same(got, ref)


@needs_zoo
def test_diffusers_own_checkpointing_runs_and_the_export_refuses_to_double_it() -> None:
    w = small("diffusers/unet2d")
    units = resolve_units(w).units
    _, ref = grads(w)
    w.model.enable_gradient_checkpointing()
    assert w.model.is_gradient_checkpointing
    _, got = grads(w)
    assert_same(got, ref)
    with pytest.raises(PlanError, match="gradient checkpointing on"):
        apply_hf_plan(w.model, plan_for(w.model, units, [Action.RECOMPUTE] * len(units)))
    w.model.disable_gradient_checkpointing()

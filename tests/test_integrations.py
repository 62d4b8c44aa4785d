"""Hugging Face models built from a config, and FSDP's apply_activation_checkpointing check_fn."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from env.data.errors import PlanError
from env.runtime.apply import plan_for
from env.units.find import find_units
from env.workloads.workload import load_workload
from search import apply_plan
from search.training.integrations import apply_hf_plan, fsdp_check_fn, hf_available, hf_plan_for, hf_units

needs_hf = pytest.mark.skipif(not hf_available(), reason="transformers is not installed")
GPT2 = "env.workloads.zoo:hf_gpt2"
BERT = "env.workloads.zoo:hf_bert?n_layer=3"


def _grads(w) -> dict[str, torch.Tensor]:
    torch.manual_seed(5)
    w.loss().backward()
    return {n: p.grad.clone() for n, p in w.model.named_parameters() if p.grad is not None}


def _assert_same(g: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert g.keys() == ref.keys() and ref
    for name in ref:
        torch.testing.assert_close(g[name], ref[name], rtol=0, atol=1e-6, msg=name)


@needs_hf
@pytest.mark.parametrize("spec, units", [
    (GPT2, [f"transformer.h.{i}" for i in range(4)]),
    (BERT, [f"bert.encoder.layer.{i}" for i in range(3)]),
])
def test_hf_units_are_the_layers_transformers_checkpoints(spec, units):
    w = load_workload(spec)
    assert hf_units(w.model) == units
    assert find_units(w.model) == units  # the generic finder agrees


@needs_hf
@pytest.mark.parametrize("spec, actions", [
    (GPT2, ["recompute", "selective", "keep", "recompute"]),
    (BERT, ["recompute", "keep", "selective"]),
])
def test_hf_plan_keeps_gradients_with_dropout_on(spec, actions):
    w_plan, w_none = load_workload(spec, seed=0), load_workload(spec, seed=0)
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in w_plan.model.modules())
    with apply_hf_plan(w_plan.model, hf_plan_for(w_plan.model, actions)) as handle:
        assert sorted(handle.applied) == sorted(u for u, a in zip(hf_units(w_plan.model), actions) if a != "keep")
        _assert_same(_grads(w_plan), _grads(w_none))


@needs_hf
def test_hf_own_gradient_checkpointing_must_be_off():
    w = load_workload(GPT2)
    new_api = hasattr(w.model, "activation_checkpointing_enable")  # transformers 5 renamed it
    enable = w.model.activation_checkpointing_enable if new_api else w.model.gradient_checkpointing_enable
    disable = w.model.activation_checkpointing_disable if new_api else w.model.gradient_checkpointing_disable
    enable()
    with pytest.raises(PlanError, match=r"gradient checkpointing on.*gradient_checkpointing_disable\(\)") as e:
        apply_hf_plan(w.model, hf_plan_for(w.model, ["recompute"] * 4))
    assert "\n" not in str(e.value)
    disable()
    apply_hf_plan(w.model, hf_plan_for(w.model, ["recompute"] * 4)).remove()


@needs_hf
def test_hf_cache_is_turned_off_for_training_with_a_warning():
    w_plan, w_none = load_workload(GPT2, seed=0), load_workload(GPT2, seed=0)
    w_plan.model.config.use_cache = True
    with pytest.warns(UserWarning, match="use_cache=True is incompatible"):
        handle = apply_hf_plan(w_plan.model, hf_plan_for(w_plan.model, ["recompute"] * 4))
    assert w_plan.model.config.use_cache is False
    _assert_same(_grads(w_plan), _grads(w_none))
    handle.remove()


def test_fsdp_check_fn_wraps_exactly_the_recompute_units_and_keeps_gradients():
    w_wrap, w_none = load_workload("gpt/tiny", seed=0), load_workload("gpt/tiny", seed=0)
    units = find_units(w_wrap.model)
    plan = plan_for(w_wrap.model, units, ["recompute", "keep", "selective", "recompute"])
    apply_activation_checkpointing(
        w_wrap.model, check_fn=fsdp_check_fn(w_wrap.model, plan),
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    wrapped = [n for n, m in w_wrap.model.named_modules() if isinstance(m, CheckpointWrapper)]
    assert wrapped == ["blocks.0", "blocks.3"]  # selective is not expressible as a check_fn
    g_wrap, g_none = _grads(w_wrap), _grads(w_none)
    _assert_same({n.replace("._checkpoint_wrapped_module", ""): g for n, g in g_wrap.items()}, g_none)


def test_fsdp_check_fn_wraps_the_parent_a_block_recomputes_with_the_gradients_of_no_plan():
    w_wrap, w_none = load_workload("gpt/tiny", seed=0), load_workload("gpt/tiny", seed=0)
    units = find_units(w_wrap.model, "sub-block")
    plan = plan_for(w_wrap.model, units, ["block"] * 4 + ["recompute"] + ["keep"] * 11)
    apply_activation_checkpointing(
        w_wrap.model, check_fn=fsdp_check_fn(w_wrap.model, plan),
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    wrapped = [n for n, m in w_wrap.model.named_modules() if isinstance(m, CheckpointWrapper)]
    assert wrapped == ["blocks.0", "blocks.1.ln_1"]  # the block's parent, and the recompute unit
    g_wrap, g_none = _grads(w_wrap), _grads(w_none)
    _assert_same({n.replace("._checkpoint_wrapped_module", ""): g for n, g in g_wrap.items()}, g_none)


def test_fsdp_check_fn_refuses_another_models_plan():
    w, wide = load_workload("gpt/tiny"), load_workload("gpt/tiny?d_model=64")
    plan = plan_for(wide.model, find_units(wide.model), ["recompute"] * 4)
    with pytest.raises(PlanError, match="another model"):
        fsdp_check_fn(w.model, plan)
    check = fsdp_check_fn(w.model, plan, strict=False)
    assert [n for n, m in w.model.named_modules() if check(m)] == [f"blocks.{i}" for i in range(4)]


def test_fsdp_check_fn_refuses_a_plan_with_chain_regions_in_one_line():
    """apply_activation_checkpointing wraps one module at a time: a region recomputed unit by unit
    would keep every unit's input, so the plan is refused rather than quietly weakened."""
    from tests.test_workloads import one_line_error

    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    plan = plan_for(w.model, units, ["keep", "recompute", "chain", "chain"])
    with pytest.raises(PlanError) as e:
        fsdp_check_fn(w.model, plan)
    one_line_error(e, "'blocks.1' .. 'blocks.3' as one chain region", "search.apply_plan before fully_shard")
    with apply_plan(w.model, plan):  # the way in for such a plan
        w.loss().backward()

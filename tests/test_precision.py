"""Precision is part of the workload: the spec carries it, the step runs at it, the run's config and
``--resume`` keep it, and a plan measured at one precision says so when applied at another."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from env.data.errors import WorkloadError
from env.data.plan import Action, Plan
from env.workloads.workload import load_workload
from search.records import meta
from search.records.config import CkptSearchError, SearchConfig, parse_config
from search.records.runs import make_run_dir
from search.records.store import RunStore
from search.training.apply import PrecisionWarning, apply_plan


def test_the_step_runs_at_the_precision_the_spec_names():
    mixed = load_workload("gpt/tiny?precision=bf16-mixed")
    assert mixed.precision == "bf16-mixed" and next(mixed.model.parameters()).dtype == torch.float32
    logits_dtype = []
    hook = mixed.model.lm_loss.head.register_forward_hook(lambda m, a, out: logits_dtype.append(out.dtype))
    mixed.loss()
    hook.remove()
    assert logits_dtype == [torch.bfloat16]  # the head's matmul ran under bf16 autocast
    true = load_workload("mlp/tiny?precision=bf16-true")
    assert all(p.dtype == torch.bfloat16 for p in true.model.parameters())
    assert true.inputs[0].dtype == torch.bfloat16 and true.loss().dtype == torch.bfloat16
    assert load_workload("gpt/tiny").spec == "gpt/tiny"  # the default is not written


def test_a_bad_precision_is_refused_in_one_line():
    with pytest.raises(WorkloadError, match="precision=fp8 is not one of 32, bf16-mixed"):
        load_workload("gpt/tiny?precision=fp8")
    with pytest.raises(CkptSearchError, match="matmul_precision=medium"):
        SearchConfig(workload="gpt/tiny?matmul_precision=medium").validate()


def test_the_checks_before_launch_take_a_spec_that_names_its_precision():
    """``python -m search.run --precision bf16-mixed`` folds the flag into the spec, which the checks made before Ray
    starts (``check_workload``) and the dashboard's form (``resolve_workload``) read with the workload's own options."""
    from dashboard.new_search import resolve_workload
    from search.run import check_workload

    spec = parse_config(["--workload", "gpt/tiny", "--precision", "bf16-mixed"]).workload
    check_workload(spec)
    assert resolve_workload(spec) == spec
    with pytest.raises(WorkloadError, match="precision=fp8 is not one of"):
        check_workload("gpt/tiny?precision=fp8")


def test_a_built_in_spec_that_names_its_precision_is_accepted_where_its_options_are_read():
    """search.run checks the spec folded with --precision (check_workload), and the throughput search reads the
    batch size from a loaded workload's spec: both see the precision options beside the workload's own."""
    from env.workloads.batching import batching_for
    from env.workloads.spec import WorkloadSpec, builtin_options
    from search.run import check_workload

    cfg = parse_config(["--workload", "gpt/tiny", "--precision", "bf16-mixed"]).validate()
    check_workload(cfg.workload)
    assert builtin_options(WorkloadSpec.parse(cfg.workload))["batch_size"] == 2
    assert batching_for(load_workload(cfg.workload)).base == 2
    with pytest.raises(WorkloadError, match="unknown option 'precison' for workload 'gpt'"):
        builtin_options(WorkloadSpec.parse("gpt/tiny?precison=bf16-mixed"))
    with pytest.raises(WorkloadError, match="precision=fp8 is not one of"):
        builtin_options(WorkloadSpec.parse("gpt/tiny?precision=fp8"))


def test_precision_round_trips_through_config_json_and_resume(tmp_path: Path):
    cfg = parse_config(["--workload", "gpt/tiny", "--precision", "bf16-mixed", "--matmul-precision", "high",
                        "--out", str(tmp_path), "--name", "run"])
    assert cfg.workload == "gpt/tiny?matmul_precision=high&precision=bf16-mixed" and cfg.precision == "bf16-mixed"
    cfg, run, lock = make_run_dir(cfg)
    lock.release()  # the driver that made the folder is done with it; the resume below takes the lock again
    again = parse_config(["--config", str(run / "config.json")])
    assert (again.workload, again.precision, again.matmul_precision) == (cfg.workload, "bf16-mixed", "high")
    with RunStore(run / "store.sqlite") as s:
        s.write(meta.CONFIG, json.loads(cfg.to_json()))
    resumed, _, lock = make_run_dir(SearchConfig(resume=str(run)).validate())
    lock.release()
    assert (resumed.workload, resumed.precision) == (cfg.workload, "bf16-mixed")
    # a spec that names its precision needs no flag; the flag given over it wins
    assert SearchConfig(workload="gpt/tiny?precision=bf16-true").validate().precision == "bf16-true"
    assert SearchConfig(workload="gpt/tiny?precision=bf16-true", precision="16-mixed").validate().workload == \
        "gpt/tiny?precision=16-mixed"


def test_a_plan_measured_at_bf16_mixed_applied_at_32_says_so_in_one_line():
    w = load_workload("gpt/tiny")
    units = [f"blocks.{i}" for i in range(4)]
    from env.data.plan import fingerprint

    plan = Plan(fingerprint=fingerprint(w.model, units), actions={u: Action.RECOMPUTE for u in units},
                precision="bf16-mixed")
    assert Plan.from_json(plan.to_json()).precision == "bf16-mixed"
    with pytest.warns(PrecisionWarning, match="measured at precision bf16-mixed and is applied at 32") as got:
        apply_plan(w.model, plan, precision="32").remove()
    assert len(got) == 1 and "\n" not in str(got[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_plan(w.model, plan, precision="bf16-mixed").remove()


def test_16_mixed_scales_the_loss_or_says_why_not():
    w = load_workload("mlp/tiny?precision=16-mixed")
    loss = w.loss()
    w.backward(loss)
    assert w._scaler is not None and all(p.grad is not None for p in w.model.parameters())
    w.optimizer_step(w.optimizer)


def test_fsdp2_shards_a_bf16_mixed_step_with_its_mixed_precision_policy():
    """One gloo rank in this process: the units and the root sharded with parameters gathered in bf16."""
    import socket

    import torch.distributed as dist

    from env.measure.fsdp import leave_group, shard_workload

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        w = load_workload("gpt/tiny?precision=bf16-mixed")
        sharded = shard_workload(w, ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "lm_loss"])
        policy = sharded.model.blocks[0]._get_fsdp_state()._mp_policy
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
        loss = sharded.loss()
        sharded.backward(loss)
        assert torch.isfinite(loss) and all(p.grad is not None for p in sharded.model.parameters())
    finally:
        leave_group()


def test_a_spec_without_precision_options_stays_as_given():
    from env.workloads.spec import fold_precision

    assert fold_precision("gpt?n_layer=2&batch_size=4", "32", "highest") == ("gpt?n_layer=2&batch_size=4", "32", "highest")
    assert fold_precision("gpt?n_layer=2&precision=32", "32", "highest")[0] == "gpt?n_layer=2"


def test_the_profile_at_bf16_mixed_predicts_every_checked_plans_peak():
    """Autocast runs with its weight cache off, so per-unit costs add up: with it on, the profile of gpt/tiny at
    bf16-mixed over-predicted recomputing the blocks by 10% and was refused (``check_profile``)."""
    from env.data.plan import Action
    from env.measure.profiler import check_profile, profile
    from env.units.choice import resolve_units

    w = load_workload("gpt/tiny?precision=bf16-mixed", seed=0)
    units = list(resolve_units(w, ["auto"], 32).units)
    assert units[-1] == "lm_loss"
    prof = profile(w, units, [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.CHUNKED], repeats=1, check=False)
    checks = check_profile(prof, w)
    assert {c.plan for c in checks} >= {"all keep", "all recompute", "all chunked"}
    assert all(abs(c.predicted_bytes - c.measured_bytes) <= 0.01 * c.measured_bytes for c in checks), checks

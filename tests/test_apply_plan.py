"""apply_plan: from a Plan, a file or JSON text; refuses another model's plan; strict=False skips."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from env.data.errors import PlanError
from env.data.plan import Action
from env.runtime.apply import plan_for
from env.units.find import find_units
from env.workloads.workload import load_workload
from search import apply_plan
from search.training.apply import PlanMismatchWarning

ROOT = Path(__file__).resolve().parents[1]
MIXED = ["recompute", "selective", "keep", "recompute"]


def _gpt(spec: str = "gpt/tiny"):
    w = load_workload(spec, seed=0)
    return w, find_units(w.model)


def _grads(w) -> dict[str, torch.Tensor]:
    torch.manual_seed(7)  # same dropout draws in both runs
    w.loss().backward()
    return {n: p.grad.clone() for n, p in w.model.named_parameters()}


def _wrapped(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if "forward" in m.__dict__]


@pytest.mark.parametrize("form", ["plan", "path", "str_path", "json_text"])
def test_apply_plan_reads_every_form_and_removes_cleanly(tmp_path, form):
    w, units = _gpt()
    plan = plan_for(w.model, units, MIXED)
    source = {"plan": plan, "path": plan.save(tmp_path / "p.json"), "str_path": str(plan.save(tmp_path / "q.json")),
              "json_text": plan.to_json()}[form]
    with apply_plan(w.model, source) as handle:
        assert _wrapped(w.model) == ["blocks.0", "blocks.1", "blocks.3"]  # keep wraps nothing
        assert handle.applied == {"blocks.0": Action.RECOMPUTE, "blocks.1": Action.SELECTIVE,
                                  "blocks.3": Action.RECOMPUTE}
    assert _wrapped(w.model) == []


def test_planned_gradients_equal_unplanned_with_dropout_on():
    (w0, _), (w1, units) = _gpt(), _gpt()
    assert w1.model.training and w1.meta["options"]["dropout"] > 0
    handle = apply_plan(w1.model, plan_for(w1.model, units, MIXED))
    g0, g1 = _grads(w0), _grads(w1)
    handle.remove()
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=1e-6, msg=name)


def test_plan_for_another_model_is_refused_in_one_line():
    (small, units), (wide, _) = _gpt(), _gpt("gpt/tiny?d_model=64")
    plan = plan_for(wide.model, units, MIXED)  # same unit names, other parameter shapes
    with pytest.raises(PlanError) as e:
        apply_plan(small.model, plan)
    msg = str(e.value)
    assert "\n" not in msg and "another model" in msg and plan.fingerprint in msg and "strict=False" in msg
    assert _wrapped(small.model) == []


def test_strict_false_applies_what_matches_and_reports_the_rest():
    (small, _), (deep, deep_units) = _gpt(), _gpt("gpt/tiny?n_layer=6")
    plan = plan_for(deep.model, deep_units, ["recompute"] * 6)
    with pytest.warns(PlanMismatchWarning, match=r"applied 4 of 6 units, skipped 2 .*blocks\.4, blocks\.5"):
        handle = apply_plan(small.model, plan, strict=False)
    assert handle.skipped == ["blocks.4", "blocks.5"]
    assert sorted(handle.applied) == [f"blocks.{i}" for i in range(4)]
    handle.remove()


def test_plan_file_that_is_not_json_is_one_line_with_the_fix(tmp_path):
    w, _ = _gpt()
    bad = tmp_path / "plan.json"
    bad.write_text("recompute everything please")
    with pytest.raises(PlanError, match=r"plan file .*plan\.json' is not JSON .*python -m search\.export") as e:
        apply_plan(w.model, bad)
    assert "\n" not in str(e.value)
    with pytest.raises(PlanError, match=r"does not exist; export one with python -m search\.export"):
        apply_plan(w.model, tmp_path / "missing.json")


@pytest.mark.parametrize("version, fix", [(0, "re-export it with this version"), (6, "upgrade ckpt-search")])
def test_older_or_newer_plan_schema_is_refused(version, fix):
    w, units = _gpt()
    data = json.loads(plan_for(w.model, units, MIXED).to_json())
    data["schema_version"] = version
    with pytest.raises(PlanError, match=f"schema version {version}, this ckpt-search reads versions 1, 2, 3, 4, 5; {fix}"):
        apply_plan(w.model, json.dumps(data))


def test_a_plan_cannot_be_applied_twice():
    w, units = _gpt()
    plan = plan_for(w.model, units, MIXED)
    with apply_plan(w.model, plan):
        with pytest.raises(PlanError, match="already has a plan applied; remove it first"):
            apply_plan(w.model, plan)


def test_importing_search_loads_neither_ray_nor_streamlit():
    code = ("import sys, search; from search import apply_plan; "
            "print(sorted(m for m in ('ray', 'streamlit') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

"""The correctness gate (env.measure.gate) on models broken on purpose: a plan that recomputes the broken unit
is refused with the unit named and a likely cause; a plan that keeps it passes."""

from __future__ import annotations

import pytest
import torch

from env.data.plan import Action
from env.data.plan_check import GATE_TOLERANCE, PlanCheck, gate_tolerance
from env.measure.gate import check_plan
from env.runtime.apply import plan_for
from env.runtime.state import plain_attributes
from env.workloads.precision import PRECISIONS
from env.workloads.workload import Workload
from tests import broken_models

UNITS = [f"blocks.{i}" for i in range(broken_models.DEPTH)]
CAUSE = {"numpy_noise": "numpy's global generator", "counting": "changes Python state in forward (blocks.1.calls",
         "global_backward": "custom autograd Function(s) GlobalScale"}


def workload(name: str) -> Workload:
    model, inputs = getattr(broken_models, name)()
    return Workload(name, model, inputs)


def test_sound_model_passes_every_uniform_plan():
    w = workload("sound")
    for action in (Action.RECOMPUTE, Action.SELECTIVE):
        check = check_plan(w, plan_for(w.model, UNITS, [action] * len(UNITS)), UNITS)
        assert check.passed and check.error <= GATE_TOLERANCE["32"] and check.culprits == []


@pytest.mark.parametrize("name", sorted(broken_models.BROKEN))
def test_broken_unit_is_named_and_refused(name):
    w = workload(name)
    before = {k: v.detach().clone() for k, v in w.model.state_dict().items()}
    attrs = plain_attributes(w.model)
    check = check_plan(w, plan_for(w.model, UNITS, [Action.RECOMPUTE] * len(UNITS)), UNITS)
    assert not check.passed and check.error > check.tolerance
    first = "blocks.1"  # global_backward: recomputing blocks.0 (last in backward) or blocks.3 rewrites nothing read
    assert check.culprit == first
    assert any(CAUSE[name] in c for c in check.causes), check.causes
    line = check.line()
    assert "\n" not in line and f"'{first}'" in line and line.startswith("refused")
    # the model as it was: weights, buffers and Python attributes
    assert all(torch.equal(before[k], v) for k, v in w.model.state_dict().items())
    assert plain_attributes(w.model) == attrs


@pytest.mark.parametrize("name", sorted(broken_models.BROKEN))
def test_plan_keeping_the_broken_units_passes(name):
    w = workload(name)
    broken = {"numpy_noise": {1}, "counting": {1}, "global_backward": {1, 2}}[name]
    actions = [Action.KEEP if i in broken else Action.RECOMPUTE for i in range(len(UNITS))]
    check = check_plan(w, plan_for(w.model, UNITS, actions), UNITS)
    assert check.passed, check.line()


def test_tolerance_is_stated_per_precision():
    assert gate_tolerance(None) == gate_tolerance("32") == GATE_TOLERANCE["32"]
    assert set(GATE_TOLERANCE) == set(PRECISIONS)  # every precision a workload runs at has one
    assert GATE_TOLERANCE["32"] < GATE_TOLERANCE["16-mixed"] < GATE_TOLERANCE["bf16-mixed"]
    with pytest.raises(Exception, match="precision 'fp8' has no gradient tolerance"):
        gate_tolerance("fp8")
    assert PlanCheck(digest="x", passed=True, error=0.0, tolerance=1e-3).culprit is None


def test_the_gate_reads_the_workloads_precision():
    """Under bf16 autocast the sound model passes within bf16-mixed's tolerance; the broken one is still refused."""
    precision = "bf16-mixed"
    for name, passes in (("sound", True), ("numpy_noise", False)):
        model, inputs = getattr(broken_models, name)()
        w = Workload(name, model, inputs, precision=precision)
        check = check_plan(w, plan_for(w.model, UNITS, [Action.RECOMPUTE] * len(UNITS)), UNITS)
        assert check.tolerance == GATE_TOLERANCE[precision] and check.passed is passes, check.line()

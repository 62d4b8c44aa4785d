"""Cost model: exact peaks for homogeneous plans, within 5% for mixed ones, against measure().

Step time is noisy on a shared CPU, so time is checked here only for its form; its accuracy
is measured by ``bench/fidelity.py``.
"""

from __future__ import annotations

import math
import random

import pytest

from env.cost.cost_model import CostModel
from env.data.errors import PlanError
from env.measure.measurement import measure
from env.measure.profiler import ModelProfile, Segment, profile
from env.runtime.apply import plan_for
from env.units.find import find_units
from env.workloads.workload import Workload, load_workload
from tests.test_workloads import one_line_error

SPECS = ("gpt/tiny", "cnn/tiny")
_PROFILED: dict[str, tuple[Workload, list[str], CostModel]] = {}


def profiled(spec: str) -> tuple[Workload, list[str], CostModel]:
    if spec not in _PROFILED:
        w = load_workload(spec)
        units = find_units(w.model)
        _PROFILED[spec] = (w, units, CostModel(profile(w, units, repeats=1, baseline=False)))
    return _PROFILED[spec]


def measured_peak(w: Workload, units: list[str], cm: CostModel, idx: list[int]) -> int:
    plan = plan_for(w.model, units, [cm.profile.actions[i] for i in idx])
    return measure(w, plan, units, repeats=1, warmup=1).peak_bytes


@pytest.mark.parametrize("spec", SPECS)
def test_homogeneous_plans_are_predicted_exactly(spec: str) -> None:
    w, units, cm = profiled(spec)
    for a in range(len(cm.profile.actions)):
        idx = [a] * cm.n_units
        assert cm.predict(idx).peak_bytes == measured_peak(w, units, cm, idx), cm.profile.actions[a]


@pytest.mark.parametrize("spec", SPECS)
def test_random_mixed_plans_are_within_five_percent(spec: str) -> None:
    w, units, cm = profiled(spec)
    rng = random.Random(7)
    errors = []
    for _ in range(6):
        idx = [rng.randrange(len(cm.profile.actions)) for _ in units]
        peak = measured_peak(w, units, cm, idx)
        errors.append(abs(cm.predict(idx).peak_bytes - peak) / peak)
    assert max(errors) <= 0.05, errors


def test_the_head_is_part_of_the_last_units_forward() -> None:
    """cnn: a kept last block's ReLU keeps its output through the head; a checkpointed one frees it."""
    _, _, cm = profiled("cnn/tiny")
    p = cm.profile
    assert p.post == Segment(delta_bytes=0, rise_bytes=0, seconds=0.0)
    last_keep, last_recompute = (p.costs[a][-1].fwd.delta_bytes for a in p.actions[:2])
    assert last_keep > last_recompute


def test_predictions_have_the_form_of_a_step() -> None:
    _, _, cm = profiled("gpt/tiny")
    keep, recompute = [0] * cm.n_units, [1] * cm.n_units
    for idx in (keep, recompute):
        pred = cm.predict(idx)
        assert pred.peak_bytes > cm.profile.base_bytes and math.isfinite(pred.step_seconds) and pred.step_seconds > 0
        assert pred.step_seconds == pytest.approx(cm.fixed_seconds + sum(cm.seconds[i, a] for i, a in enumerate(idx)))
    assert cm.forward_levels(keep)[-1] > cm.forward_levels(recompute)[-1]


def test_a_profile_is_plain_data_that_predicts_the_same_after_json() -> None:
    _, _, cm = profiled("cnn/tiny")
    again = CostModel(ModelProfile.model_validate_json(cm.profile.model_dump_json()))
    rng = random.Random(3)
    for _ in range(20):
        idx = [rng.randrange(3) for _ in range(cm.n_units)]
        assert again.predict(idx) == cm.predict(idx)


def test_plans_that_do_not_fit_the_profile() -> None:
    w, units, cm = profiled("gpt/tiny")
    other = load_workload("gpt/tiny?d_model=64")
    with pytest.raises(PlanError) as e:
        cm.predict(plan_for(other.model, units, ["keep"] * len(units)))
    one_line_error(e, "is not this profile's", "profile the plan's model")
    with pytest.raises(PlanError) as e:
        cm.predict([0, 1])
    one_line_error(e, "2 actions for 4 units", "one per unit")
    with pytest.raises(PlanError) as e:
        cm.predict(plan_for(w.model, units, ["offload"] * len(units)))
    one_line_error(e, "action the profile lacks", "keep, recompute, selective")

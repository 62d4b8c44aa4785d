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
from env.data.plan import Action
from env.measure.measurement import measure
from env.data.model_profile import UnitCost, chain_costs
from env.measure.profiler import ModelProfile, Segment, profile
from env.runtime.apply import plan_for
from env.units.find import find_units
from env.workloads.workload import Workload, load_workload
from tests.test_workloads import one_line_error

SPECS = ("gpt/tiny", "cnn/tiny")
ACTIONS = (Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.CHAIN)
_PROFILED: dict[str, tuple[Workload, list[str], CostModel]] = {}


def profiled(spec: str) -> tuple[Workload, list[str], CostModel]:
    if spec not in _PROFILED:
        w = load_workload(spec)
        units = find_units(w.model)
        _PROFILED[spec] = (w, units, CostModel(profile(w, units, ACTIONS, repeats=1, baseline=False)))
    return _PROFILED[spec]


def measured_peak(w: Workload, units: list[str], cm: CostModel, idx: list[int]) -> int:
    plan = plan_for(w.model, units, [cm.profile.actions[i] for i in idx])
    return measure(w, plan, units, repeats=1, warmup=1).peak_bytes


def uniform_actions(cm: CostModel) -> list[int]:
    """The actions a plan may give every unit (not chain: a chain continues a region)."""
    return [a for a, action in enumerate(cm.profile.actions) if action is not Action.CHAIN]


@pytest.mark.parametrize("spec", SPECS)
def test_homogeneous_plans_are_predicted_exactly(spec: str) -> None:
    w, units, cm = profiled(spec)
    for a in uniform_actions(cm):
        idx = [a] * cm.n_units
        assert cm.predict(idx).peak_bytes == measured_peak(w, units, cm, idx), cm.profile.actions[a]


@pytest.mark.parametrize("spec", SPECS)
def test_random_mixed_plans_are_within_five_percent(spec: str) -> None:
    w, units, cm = profiled(spec)
    rng = random.Random(7)
    errors = []
    for _ in range(6):
        idx = [rng.choice(uniform_actions(cm)) for _ in units]
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


# ---------------------------------------------------------------------------------------------
# Chains: a region's forward keeps only its input; in backward it is recomputed at once


def random_chained_plan(cm: CostModel, rng: random.Random) -> list[int]:
    """A random plan with chains where the profile's links allow them (each unit: keep, recompute,
    selective, or chain when the unit before it is recompute or chain)."""
    plan: list[int] = []
    for i in range(cm.n_units):
        can_chain = i > 0 and cm.links[i] and plan[-1] in (cm.rec, cm.chain)
        plan.append(cm.chain if can_chain and rng.random() < 0.6 else rng.choice(uniform_actions(cm)))
    return plan


@pytest.mark.parametrize("spec, tolerance", [("gpt/tiny", 0.0), ("cnn/tiny", 0.05)])
def test_chained_plans_are_predicted_from_the_profile(spec: str, tolerance: float) -> None:
    """gpt/tiny exactly (CPU allocations are repeatable); cnn/tiny within 5% (its regions restore
    BatchNorm buffers from copies made during the recompute, which the profile does not price)."""
    w, units, cm = profiled(spec)
    assert cm.chain is not None and all(cm.links[1:])  # blocks chain
    n, rng = cm.n_units, random.Random(11)
    plans = [[cm.rec] + [cm.chain] * (n - 1), [cm.rec, cm.chain] + [cm.keep] * (n - 2)]
    plans += [random_chained_plan(cm, rng) for _ in range(4)]
    for idx in plans:
        peak = measured_peak(w, units, cm, idx)
        assert abs(cm.predict(idx).peak_bytes - peak) <= tolerance * peak, [cm.profile.actions[a].value for a in idx]


def test_a_region_is_recomputed_at_once_in_backward() -> None:
    """Two units kept at 100 bytes each (rise 150), 10 bytes of output: chained, the backward
    reruns the first as kept (100 bytes, rise 150) and then runs the last as recomputed."""
    def seg(delta: int, rise: int, seconds: float) -> Segment:
        return Segment(delta_bytes=delta, rise_bytes=rise, seconds=seconds)

    keep = UnitCost(fwd=seg(100, 150, 1.0), bwd=seg(-90, 20, 1.0))
    rec = UnitCost(fwd=seg(10, 150, 1.0), bwd=seg(0, 160, 2.0))
    zero = seg(0, 0, 0.0)
    prof = ModelProfile(workload="w", batch_shape="-", device="none", fingerprint="f", units=["a", "b"],
                        actions=[Action.KEEP, Action.RECOMPUTE, Action.CHAIN], base_bytes=1000, pre=zero, post=zero,
                        tail=zero, costs={Action.KEEP: [keep, keep], Action.RECOMPUTE: [rec, rec],
                                          Action.CHAIN: chain_costs([rec, rec])}, chain_links=[False, True])
    cm = CostModel(prof)
    # forward: a keeps 10 (rise 150), b frees a's 10 and keeps its own 10 (rise 150): level 1010
    # backward: a rerun as kept (1010 + 150, then 1110), b as recomputed (1110 + 160 = 1270), a as kept (1110 + 20)
    assert cm.predict([1, 2]).peak_bytes == 1270
    assert cm.predict([1, 1]).peak_bytes == 1020 + 160  # per unit: both inputs kept, one unit recomputed at a time
    assert cm.predict([1, 2]).step_seconds == cm.predict([1, 1]).step_seconds == 6.0
    with pytest.raises(PlanError) as e:
        cm.predict([0, 2])
    one_line_error(e, "unit 'b' is 'chain' after 'a', which is 'keep'")
    unlinked = CostModel(prof.model_copy(update={"chain_links": [False, False]}))
    with pytest.raises(PlanError) as e:
        unlinked.predict([1, 2])
    one_line_error(e, "units 'a' and 'b' do not chain in this model", "make 'b' recompute")


@pytest.mark.parametrize("region", [Action.CHAIN, Action.BLOCK])
def test_a_region_action_without_keep_and_recompute_is_refused_in_one_line(region: Action) -> None:
    """A chain region and a block both start as a recompute and are recomputed as kept units: profiling one without
    keep and recompute, or pricing a profile that has one without them, is refused in one line naming the fix."""
    from env.data.errors import MeasurementError
    from tests.profiles import synthetic_profile

    w = load_workload("gpt/tiny")
    with pytest.raises(MeasurementError) as e:
        profile(w, find_units(w.model, "sub-block"), [Action.KEEP, region])
    one_line_error(e, f"'{region.value}' needs 'keep' and 'recompute'", "add them")
    prof = synthetic_profile(3, 1, seed=0)  # keep alone
    costs = {**prof.costs, region: prof.costs[Action.KEEP]}
    with pytest.raises(PlanError) as e:
        CostModel(prof.model_copy(update={"actions": [Action.KEEP, region], "costs": costs}))
    one_line_error(e, f"the profile has '{region.value}' but not recompute", "profile both")

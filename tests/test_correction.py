"""MeasuredCorrection: the cost model corrected by measured plans (hybrid reward, candidates)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from env.cost.correction import MeasuredCorrection
from env.cost.cost_model import CostModel
from tests.profiles import synthetic_profile

N = 6
KEEP = (0,) * N


def _model(seed: int = 4) -> CostModel:
    """A random profile made physical: no unit is faster recomputed than kept."""
    prof = synthetic_profile(N, 2, seed=seed)
    keep, other = prof.actions
    slower = []
    for k, o in zip(prof.costs[keep], prof.costs[other]):
        lack = (k.fwd.seconds + k.bwd.seconds) - (o.fwd.seconds + o.bwd.seconds)
        slower.append(o.model_copy(update={"bwd": o.bwd.model_copy(update={"seconds": o.bwd.seconds + max(0.0, lack) + 1e-3})}))
    return CostModel(prof.model_copy(update={"costs": {keep: prof.costs[keep], other: slower}}))


def _slower_plans(cm: CostModel) -> list[tuple[int, ...]]:
    base = cm.step_seconds(KEEP)
    return [p for p in itertools.product(range(2), repeat=N) if cm.step_seconds(p) > base]


def test_before_any_measurement_it_is_the_cost_model() -> None:
    cm = _model()
    c = MeasuredCorrection(cm)
    for p in list(itertools.product(range(2), repeat=N))[:20]:
        assert c.predict(p) == (cm.peak_bytes(p), pytest.approx(cm.step_seconds(p)))


def test_a_measured_plan_is_its_measurement_and_peaks_scale_by_the_mean_ratio() -> None:
    cm = _model()
    c = MeasuredCorrection(cm)
    p = (1, 0, 1, 0, 0, 0)
    assert c.add(p, cm.peak_bytes(p) * 2, 0.5) and not c.add(p, 1, 1.0)
    assert c.predict(p) == (cm.peak_bytes(p) * 2, 0.5)
    other = (0, 1, 0, 0, 0, 0)
    assert c.predict(other)[0] == round(cm.peak_bytes(other) * 2)


def test_noise_that_makes_measured_plans_fast_never_makes_unrelated_plans_beat_the_baseline() -> None:
    """Plans measured 20% under their prediction (noise) pull a plain measured/predicted ratio
    below 1, which predicted every near-baseline plan faster than the measured baseline, so the
    agent allowed everything never proposed the baseline. Units never measured under another
    action keep the profile's extra time, scaled by a non-negative slope."""
    cm = _model()
    base_t = cm.step_seconds(KEEP)
    c = MeasuredCorrection(cm)
    measured = [(1, 0, 0, 0, 0, 0), (0, 1, 0, 0, 0, 0), (1, 1, 0, 0, 0, 0)]
    c.add(KEEP, cm.peak_bytes(KEEP), base_t)
    for p in measured:
        c.add(p, cm.peak_bytes(p), 0.8 * cm.step_seconds(p))
    untouched = [p for p in _slower_plans(cm) if p[0] == p[1] == 0]
    assert len(untouched) > 5
    assert all(c.predict(p)[1] >= base_t for p in untouched)
    assert c.predict(KEEP)[1] == base_t


def test_extras_measured_at_twice_the_profile_double_every_prediction() -> None:
    cm = _model()
    base_t = cm.step_seconds(KEEP)
    c = MeasuredCorrection(cm)
    c.add(KEEP, cm.peak_bytes(KEEP), base_t)
    for p in _slower_plans(cm)[:4]:
        c.add(p, cm.peak_bytes(p), base_t + 2 * (cm.step_seconds(p) - base_t))
    for p in _slower_plans(cm)[4:12]:
        assert c.predict(p)[1] == pytest.approx(base_t + 2 * (cm.step_seconds(p) - base_t))


def test_it_learns_a_unit_whose_recompute_the_profile_overprices() -> None:
    """The truth: unit 0's recompute costs a fifth of what the profile says; everything else as
    profiled. After a dozen measured plans the correction predicts the unmeasured plans that
    recompute unit 0 far better than the profile, and those that do not as well as it."""
    cm = _model(seed=7)
    extra = cm.seconds[:, 1] - cm.seconds[:, 0]
    base_t = cm.step_seconds(KEEP)

    def truth(p: tuple[int, ...]) -> float:
        return cm.step_seconds(p) - (0.8 * extra[0] if p[0] == 1 else 0.0)

    plans = list(itertools.product(range(2), repeat=N))
    rng = random.Random(0)
    measured = rng.sample(plans[1:], 12)
    c = MeasuredCorrection(cm)
    c.add(KEEP, cm.peak_bytes(KEEP), base_t)
    for p in measured:
        c.add(p, cm.peak_bytes(p), truth(p))
    rest = [p for p in plans if p not in measured and p != KEEP]

    def error(group: list[tuple[int, ...]], predict) -> float:  # type: ignore[no-untyped-def]
        return sum(abs(predict(p) - truth(p)) for p in group) / len(group)

    with_0 = [p for p in rest if p[0] == 1]
    without_0 = [p for p in rest if p[0] == 0]
    profiled = error(with_0, cm.step_seconds)
    assert profiled == pytest.approx(0.8 * extra[0]) and profiled > 0
    assert error(with_0, lambda p: c.predict(p)[1]) < 0.5 * profiled
    assert error(without_0, lambda p: c.predict(p)[1]) < 0.25 * profiled  # the profile is right there


def test_the_corrected_model_predicts_as_the_correction_and_feeds_the_exact_solver() -> None:
    from agents.exact import exact_frontier

    cm = _model(seed=7)
    c = MeasuredCorrection(cm)
    assert c.corrected_model() is cm  # nothing measured
    base_t = cm.step_seconds(KEEP)
    c.add(KEEP, cm.peak_bytes(KEEP), base_t)
    for p in _slower_plans(cm)[:6]:
        c.add(p, cm.peak_bytes(p), base_t + 3 * (cm.step_seconds(p) - base_t))
    fixed = c.corrected_model()
    unmeasured = [p for p in itertools.product(range(2), repeat=N) if p not in c.measured]
    for p in unmeasured[:20]:
        assert fixed.step_seconds(p) == pytest.approx(c.predict(p)[1])
        assert fixed.peak_bytes(p) == cm.peak_bytes(p)
    assert cm.step_seconds(KEEP) == base_t  # the original is untouched
    front = exact_frontier(fixed)
    assert front and all(pt.step_seconds == pytest.approx(fixed.step_seconds(pt.plan)) for pt in front)


def test_noise_never_fits_an_action_faster_than_keeping_the_unit() -> None:
    """Measurements where recomputing units 0 and 1 looks faster than the baseline (noise): the
    fitted extras stay at or above zero, so the all-keep plan stays the fastest plan the
    corrected model knows and the exact solver on it keeps the baseline on its frontier."""
    from agents.exact import exact_frontier

    cm = _model(seed=7)
    base_t = cm.step_seconds(KEEP)
    c = MeasuredCorrection(cm)
    c.add(KEEP, cm.peak_bytes(KEEP), base_t)
    for p, dt in (((1, 0, 0, 0, 0, 0), -0.05), ((0, 1, 0, 0, 0, 0), -0.03), ((1, 1, 0, 0, 0, 0), -0.08)):
        c.add(p, cm.peak_bytes(p), base_t * (1 + dt))
    fixed = c.corrected_model()
    assert (fixed.seconds[:, 1] > 0).all()
    plans = list(itertools.product(range(2), repeat=N))
    unmeasured = [p for p in plans if p not in c.measured]
    assert min(c.predict(p)[1] for p in unmeasured) >= base_t
    assert any(pt.plan == KEEP for pt in exact_frontier(fixed))


def test_a_profile_that_timed_a_recompute_faster_than_keep_keeps_the_others_prior() -> None:
    """Profiling noise timed unit 0's recompute far faster than keeping it; the measured plans all
    recompute it (the exact solver builds its frontier from such a unit). The truth: recomputing
    unit 0 costs nothing extra, the rest as profiled. The slope of measured on profiled extras
    must compare like with like (the profile's extras at least zero, as the prior takes them);
    comparing with the raw extras, whose sum those plans made negative, set the slope and the
    whole prior to 0, and every unmeasured plan looked as fast as the baseline."""
    cm = _model(seed=7)
    base_t = cm.step_seconds(KEEP)
    fast = cm.seconds.copy()
    fast[0, 1] = fast[0, 0] - 5.0 * float((cm.seconds[:, 1] - cm.seconds[:, 0]).sum())  # far below keep
    noisy = cm.with_step_seconds(fast[:, :] - fast[:, [0]], base_t)
    extra = np.maximum(noisy.seconds - noisy.seconds[:, [0]], 0.0)

    def truth(p: tuple[int, ...]) -> float:
        return base_t + float(sum(extra[i, a] for i, a in enumerate(p)))

    c = MeasuredCorrection(noisy)
    c.add(KEEP, cm.peak_bytes(KEEP), base_t)
    measured = [(1, 1, 0, 0, 0, 0), (1, 0, 1, 0, 0, 0), (1, 1, 1, 0, 0, 0)]
    for p in measured:
        assert noisy.step_seconds(p) < base_t  # the profile says: faster than the baseline
        c.add(p, cm.peak_bytes(p), truth(p))
    for p in [(0, 0, 0, 1, 0, 0), (0, 0, 0, 0, 1, 1), (0, 0, 0, 1, 1, 1)]:  # units never measured
        assert c.predict(p)[1] == pytest.approx(truth(p), rel=1e-6)


def test_timing_noise_costs_the_corrected_frontier_little_at_48_units() -> None:
    """46 plans of the exact frontier measured with 2% timing noise (the truth: the recorded 48-unit
    gpt profile, extras clipped at zero): the exact frontier of the corrected model, timed by the
    truth, keeps at least 0.997 of the hypervolume the truth's own frontier has, on average over
    noise draws. A fixed ridge fitted the 96 extras to the noise; the prior's pull scales with it."""
    from pathlib import Path

    from agents.exact import exact_frontier
    from env.data.model_profile import ModelProfile
    from env.data.plan import Action
    from search.engine.archive import spread_picks
    from search.records.pareto import hypervolume, normalise

    path = Path(__file__).resolve().parents[1] / "bench" / "profiles" / "gpt_small_12_subblock.json"
    cm = CostModel(ModelProfile.model_validate_json(path.read_text()))
    keep, n = cm.action_index(Action.KEEP), cm.n_units
    base_t = cm.step_seconds([keep] * n)
    truth = cm.with_step_seconds(np.maximum(cm.seconds - cm.seconds[:, [keep]], 0.0), base_t)
    base_peak = cm.peak_bytes([keep] * n)

    def hv(plans: list[tuple[int, ...]]) -> float:
        pts = [(cm.peak_bytes(list(p)), truth.step_seconds(list(p))) for p in plans]
        return hypervolume(normalise(pts, base_peak, base_t))

    best = hv([tuple(p.plan) for p in exact_frontier(truth)])
    rng = np.random.default_rng(0)
    measured = spread_picks([tuple(q.plan) for q in exact_frontier(cm)], 46)
    ratios = []
    for _ in range(6):  # six draws of the noise
        c = MeasuredCorrection(cm)
        c.add((keep,) * n, base_peak, base_t * (1 + 0.02 * rng.standard_normal()))
        for p in measured:
            c.add(p, cm.peak_bytes(list(p)), truth.step_seconds(list(p)) * (1 + 0.02 * rng.standard_normal()))
        ratios.append(hv([tuple(q.plan) for q in exact_frontier(c.corrected_model())]) / best)
    assert np.mean(ratios) >= 0.997, ratios  # a fixed ridge of 2: 0.9944 (0.985-0.998); the prior: 0.9981


def test_measurements_move_an_extra_the_profile_timed_at_nothing() -> None:
    """The profile timed unit 0's recompute no slower than keeping it (its extra clipped to 0); the
    truth: it costs about what recomputing the other units costs. Measured plans that recompute it
    must teach the correction so: a prior of width zero held the extra at zero against every
    measurement, and each such plan looked as fast as the baseline."""
    cm = _model(seed=7)
    base_t = cm.step_seconds(KEEP)
    true_extra = np.array([0.05, 0.06, 0.04, 0.05, 0.055, 0.045])
    truth_model = cm.with_step_seconds(np.stack([np.zeros(N), true_extra], axis=1), base_t)
    cheap = true_extra.copy()
    cheap[0] = 0.0  # profiled: recomputing unit 0 adds nothing
    profiled = cm.with_step_seconds(np.stack([np.zeros(N), cheap], axis=1), base_t)
    c = MeasuredCorrection(profiled)
    c.add(KEEP, cm.peak_bytes(KEEP), base_t)
    for p in [(1, 0, 0, 0, 0, 0), (1, 1, 0, 0, 0, 0), (1, 0, 0, 1, 0, 0), (0, 1, 0, 0, 0, 0), (0, 0, 0, 1, 0, 0)]:
        c.add(p, cm.peak_bytes(p), truth_model.step_seconds(p))
    unmeasured = (1, 0, 1, 0, 0, 0)
    truth = truth_model.step_seconds(unmeasured)
    assert profiled.step_seconds(unmeasured) == pytest.approx(truth - true_extra[0])  # unit 0 for free
    # three measured plans move it most of the way from the prior's zero (the old prior: a third)
    assert c.predict(unmeasured)[1] == pytest.approx(truth, abs=0.2 * true_extra[0])

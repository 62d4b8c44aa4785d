"""Drift: each plan's time is taken relative to the all-keep plan measured beside it.

A machine's speed drifts over a search (other processes, clocks, caches), by several percent
here over minutes. Plans measured minutes apart were compared on raw medians: a plan measured in
a fast minute beat the baseline measured in a slow one and pushed it off the frontier. The
Evaluator now measures the reference (all keep) again every ``reference_every`` seconds and labels
each sample with it; the ledger compares ``paired`` times.
"""

from __future__ import annotations

import pytest

from env.data.measured import MeasuredPlan, median_seconds
from env.data.plan import Action
from env.data.types import SourceKind
from search.engine.evaluator import Evaluator
from search.engine.ledger import Ledger, SearchSetup
from search.engine.phase_clock import PhaseClock
from search.records.ranking import (
    REFERENCE_MIN_PLANS,
    REFERENCE_WINDOW,
    Ranking,
    decided_from,
    paired,
    pooled_reference,
    reference_due,
    timing_noise,
)
from search.records.store import RunStore
from tests.profiles import synthetic_profile


def _m(digest: str, actions: list[str], samples: list[float], refs: list[float], mid: str,
       peak: int = 100, source: str = "agent_0") -> MeasuredPlan:
    return MeasuredPlan(workload="synthetic", batch_shape="-", digest=digest, actions=actions, sources=[source],
                        peak_bytes=peak, live_before_bytes=0, step_seconds_samples=samples, reference_seconds=refs,
                        clock="thread-cpu", device="cpu", torch_version="t", measurement_ids=[mid])


def _three_units(*plans: str) -> tuple[SearchSetup, list[list[str]], list[str]]:
    """A 3-unit synthetic search setup, and each plan (``"RKK"``: recompute, keep, keep) as its
    action names and its digest."""
    setup = SearchSetup.from_profile(synthetic_profile(3, 2, seed=0))
    names = {"K": Action.KEEP.value, "R": Action.RECOMPUTE.value}
    acts = [[names[c] for c in p] for p in plans]
    return setup, acts, [setup.codec.digest(setup.codec.indices(a)) for a in acts]


def test_pairing_takes_each_sample_relative_to_its_reference_and_rescales() -> None:
    m = _m("p", ["keep"], [1.1, 1.2, 1.0], [1.0, 1.0, 1.0], "e:1").merged(
        _m("p", ["keep"], [0.99, 1.08, 0.9], [0.9, 0.9, 0.9], "e:2"))
    assert m.reference_seconds == [1.0] * 3 + [0.9] * 3
    p = paired(m, 2.0)
    assert p.step_seconds_samples == pytest.approx([2.2, 2.4, 2.0, 2.2, 2.4, 2.0])
    assert paired(p, 4.0).step_seconds_samples == pytest.approx([4.4, 4.8, 4.0, 4.4, 4.8, 4.0])  # rescaled, not again
    assert m.step_seconds_samples == [1.1, 1.2, 1.0, 0.99, 1.08, 0.9]  # the record itself keeps what was measured
    # a measurement without references (an older store) leaves the whole record raw
    raw = m.merged(_m("p", ["keep"], [1.5], [], "e:3"))
    assert raw.reference_seconds == [] and paired(raw, 2.0) is raw
    assert paired(m, None) is m


def test_when_a_reference_is_due_and_what_labels_the_samples_after_it() -> None:
    """References off: never; none yet: before the first plan; then only when the last is older than
    ``reference_every`` and ``REFERENCE_MIN_PLANS`` plans were measured since. A label pools the
    samples of the last references."""
    assert not reference_due(None, 0, every=0.0) and not reference_due(100.0, 100, every=0.0)
    assert reference_due(None, 0, every=30.0)
    assert not reference_due(31.0, REFERENCE_MIN_PLANS - 1, every=30.0)  # stale, but too few plans since
    assert not reference_due(29.0, 10 * REFERENCE_MIN_PLANS, every=30.0)  # many plans, but fresh
    assert reference_due(31.0, REFERENCE_MIN_PLANS, every=30.0)
    assert pooled_reference([[1.0, 1.2], [0.9], [1.1, 5.0]]) == pytest.approx(1.1)


def test_timing_noise_is_the_median_relative_spread_at_least_the_floor() -> None:
    from env.cost.correction import TIME_NOISE

    one = _m("a", ["keep"], [1.0], [], "e:1")
    assert timing_noise([]) == TIME_NOISE and timing_noise([one]) == TIME_NOISE  # nothing repeated yet
    wide = [_m(d, ["keep"], [1.0, 1.1, 1.2], [], f"e:{k}") for k, d in enumerate("bcd")]  # spread 0.2 / 1.1
    assert timing_noise(wide + [one]) == pytest.approx(0.2 / 1.1)
    tight = [_m(d, ["keep"], [1.0, 1.001], [], f"e:{k}") for k, d in enumerate("xyz")]
    assert timing_noise(tight) == TIME_NOISE


def test_the_deciding_passes_begin_after_each_evaluators_last_measurement() -> None:
    records = [_m("a", ["keep"], [1.0, 1.0], [], "e0-x:3").merged(_m("a", ["keep"], [1.0, 1.0], [], "e1-y:9")),
               _m("b", ["keep"], [1.0], [], "e0-x:5"), _m("c", ["keep"], [1.0], [], "unplaced")]
    assert decided_from(records) == {"e0-x": 6, "e1-y": 10}


def test_a_machine_that_speeds_up_no_longer_hides_which_plan_is_faster(tmp_path) -> None:
    """Two references in a slow minute (1.0 s); plan Y (85% of the memory) measured 1.01 s there; then
    the machine ran 10% faster: references at 0.9 s around plan X (90% of the memory), which measured
    0.927 s, 3% slower than the references beside it. Y is faster with less memory. On raw medians X
    (0.927) looks faster than Y (1.01) and stays on the frontier; so it does paired with the label the
    Evaluator gave it (the references before it, pooled: two slow, one fast); ranked against the
    references nearest to it on both sides (``Ranking``), X is 3% slower than the baseline and Y
    dominates it."""
    setup, (keep, x, y), (d_keep, d_x, d_y) = _three_units("KKK", "RKK", "KRK")
    slow, fast = [1.01, 1.0, 0.99], [0.91, 0.9, 0.89]

    def ledger(name: str, with_refs: bool, mid: str = "e:{}") -> Ledger:
        def refs(samples: list[float]) -> list[float]:
            return [median_seconds(samples)] * 3 if with_refs else []

        (tmp_path / name).mkdir()
        led = Ledger(setup, RunStore(tmp_path / name))  # a run folder, as the dashboard reads
        led.record(_m(d_keep, keep, slow, refs(slow), mid.format(1), peak=100, source="rule:none"))
        led.set_baseline(d_keep)
        led.record(_m(d_keep, keep, slow, refs(slow), mid.format(2), peak=100, source="rule:none"))
        led.record(_m(d_y, y, [1.02, 1.01, 1.0], refs(slow), mid.format(3), peak=85))
        led.record(_m(d_keep, keep, fast, refs(slow + fast), mid.format(4), peak=100, source="rule:none"))
        led.record(_m(d_x, x, [0.93, 0.927, 0.92], refs(slow + slow + fast), mid.format(5), peak=90))
        for n in (6, 7):
            led.record(_m(d_keep, keep, fast, refs(fast), mid.format(n), peak=100, source="rule:none"))
        return led

    raw = ledger("raw", with_refs=False)
    assert [r.digest for r in raw.frontier()] == [d_y, d_x, d_keep]  # what the search once did
    labelled = ledger("labelled", with_refs=True, mid="e-{}")  # ids that do not place them: the labels
    assert [r.digest for r in labelled.frontier()] == [d_y, d_x, d_keep]
    led = ledger("refs", with_refs=True)
    assert [r.digest for r in led.frontier()] == [d_y, d_keep]
    scale = median_seconds(slow * 2 + fast * 3)
    assert led.scale == pytest.approx(scale)  # the baseline's median over all its measurements
    # X against e:4 and e:6 (one step away) and e:7 (two); Y against e:2, e:4 and e:1
    assert led.archive.measured[d_x].step_seconds == pytest.approx(0.927 / 0.9 * scale)
    assert led.frontier()[0].step_seconds == pytest.approx(1.01 / median_seconds(slow * 2 + fast) * scale)
    # the store keeps what was measured; a resumed run ranks it the same way
    again = Ledger(setup, RunStore(tmp_path / "refs"))
    again.load_store()
    assert [r.digest for r in again.frontier()] == [d_y, d_keep]
    assert again.store.get(d_x).measurement.step_seconds == pytest.approx(0.927)
    # the dashboard, reading the store alone, shows the same times and the same frontier
    from dashboard.data import load_run

    run = load_run(tmp_path / "refs")
    assert list(run.frontier.digest) == [d_y, d_keep] and run.evaluations.paired.all()
    assert run.frontier.step_seconds.tolist() == pytest.approx([r.step_seconds for r in led.frontier()])
    assert run.baseline_seconds == pytest.approx(scale)


@pytest.mark.slow
def test_the_evaluator_measures_its_reference_again_and_labels_every_sample() -> None:
    """A real workload: the first plan is preceded by a reference measurement, a stale reference is
    measured again only after REFERENCE_MIN_PLANS plans, every sample carries the reference measured
    before it (pooled over the last REFERENCE_WINDOW references), and the reference measurements reach
    the journal (the store) as the baseline's."""
    ev = Evaluator("gpt/tiny", 0, [], ["keep", "recompute"], repeats=2, device="cpu", threads=1,
                   reference_every=1e-9)
    n = len(ev.units)
    keep = ["keep"] * n
    plans = [["recompute" if j == i % n else "keep" for j in range(n)] for i in range(REFERENCE_MIN_PLANS + 1)]
    plans[-1] = ["recompute"] * n  # distinct from the first plans
    got = [ev.evaluate(p, "agent_0") for p in plans]
    journal = ev.drain()
    refs = [m for m in journal if m.actions == keep]
    assert len(refs) == 2 and ev.n_references == 2  # before the first plan, and after REFERENCE_MIN_PLANS more
    order = [m.actions == keep for m in journal]
    assert order == [True] + [False] * REFERENCE_MIN_PLANS + [True, False]
    for m in got + refs:
        assert m.is_paired and len(m.reference_seconds) == 2
    assert all(m.reference_seconds == [refs[0].step_seconds] * 2 for m in got[:REFERENCE_MIN_PLANS])
    # the second reference pools its samples with the first's: one reference's few steps err more
    pooled = median_seconds(refs[0].step_seconds_samples + refs[1].step_seconds_samples)
    assert got[-1].reference_seconds == [pooled] * 2 and refs[1].reference_seconds == [pooled] * 2
    assert refs[0].sources == ["rule:none"]
    # the reference is not in the cache: the driver never gets back a record whose measurements the store
    # lacks in part (the store merges a record's samples whole; a resumed run once recorded some twice)
    first = ev.evaluate(keep, "rule:none")
    assert not set(first.measurement_ids) & {i for m in refs for i in m.measurement_ids}
    # the baseline measured on its own is a reference too, pooled with the last ones; references off: raw records
    own = ev.evaluate(keep, "rule:none", again=True)
    window = [refs[1], first, own][-REFERENCE_WINDOW:]
    assert own.reference_seconds == [median_seconds([x for m in window for x in m.step_seconds_samples])] * 2
    plain = Evaluator("gpt/tiny", 0, [], ["keep", "recompute"], repeats=2, device="cpu", threads=1)
    m = plain.evaluate(plans[0], "agent_0")
    assert m.reference_seconds == [] and plain.drain() == [m]


def test_a_plan_measured_faster_than_the_baseline_is_ranked_at_its_time_and_keeps_it_on_the_frontier(tmp_path) -> None:
    """Recomputing adds work: a plan that saves 2% of the memory and measured 1.5% faster than the
    baseline measured noise. Ranked by its median it pushed the baseline off the frontier (unet2d:
    the agents' top point then quoted 11% slower than the baseline); it is ranked a hair above the
    baseline's time, both stay, the store keeps what was measured, and the dashboard agrees."""
    setup, (keep, lucky, slow), (d_keep, d_lucky, d_slow) = _three_units("KKK", "KRK", "RRR")
    led = Ledger(setup, RunStore(tmp_path))
    led.record(_m(d_keep, keep, [1.0, 1.01, 0.99], [1.0] * 3, "e:1", peak=100, source="rule:none"))
    led.set_baseline(d_keep)
    led.record(_m(d_lucky, lucky, [0.985, 0.98, 0.99], [1.0] * 3, "e:2", peak=98))
    led.record(_m(d_slow, slow, [1.3, 1.31, 1.29], [1.0] * 3, "e:3", peak=60))
    front = led.frontier()
    assert [r.digest for r in front] == [d_slow, d_lucky, d_keep]
    assert front[1].step_seconds == pytest.approx(1.0) and front[1].step_seconds > front[2].step_seconds
    assert front[0].step_seconds == pytest.approx(1.3)  # slower than the baseline: as measured
    assert led.store.get(d_lucky).measurement.step_seconds == pytest.approx(0.985)
    from dashboard.data import load_run

    run = load_run(tmp_path)
    assert list(run.frontier.digest) == [d_slow, d_lucky, d_keep]


def test_the_deciding_passes_rank_the_plans_they_measured_side_by_side(tmp_path) -> None:
    """A drift that changes the plans' ratios to the baseline, not only the baseline's time (hf/gpt2:
    the all-keep step went from 928 to 840 ms and all-recompute's ratio from 1.37 to 1.51). Plan A
    (80% of the memory) measured three times in the first phase, at 1.20 of the references beside
    it; plan B (90%) once in the second, at 1.28. Ranked on all their measurements, A dominates B
    even after both are measured twice more side by side, where A measures 1.40 and B 1.30. From
    ``Ledger.decide_from_here`` on, the plans measured again are ranked on those measurements
    alone: B is on the frontier beside A; the store, a resumed run and the dashboard agree."""
    setup, (keep, a, b), (d_keep, d_a, d_b) = _three_units("KKK", "RRK", "RKK")
    slow, fast = [1.01, 1.0, 0.99], [0.91, 0.9, 0.89]

    def at(ref: list[float], ratio: float) -> list[float]:
        return [x * ratio for x in ref]

    led = Ledger(setup, RunStore(tmp_path))
    n = iter(range(1, 100))

    def rec(digest: str, actions: list[str], samples: list[float], peak: int, ref: list[float]) -> None:
        led.record(_m(digest, actions, samples, [median_seconds(ref)] * 3, f"e:{next(n)}", peak=peak,
                      source="rule:none" if digest == d_keep else "agent_0"))

    rec(d_keep, keep, slow, 100, slow)
    led.set_baseline(d_keep)
    for _ in range(3):
        rec(d_a, a, at(slow, 1.2), 80, slow)
        rec(d_keep, keep, slow, 100, slow)
    rec(d_keep, keep, fast, 100, fast)
    rec(d_b, b, at(fast, 1.28), 90, fast)
    rec(d_keep, keep, fast, 100, fast)
    assert [r.digest for r in led.frontier()] == [d_a, d_keep]
    assert led.decide_from_here() == {"e": 11}
    before = led.n_new_measurements
    for first, second in ((d_a, d_b), (d_b, d_a)):  # two passes, the second in reverse order
        for d in (first, second):
            rec(d, a if d == d_a else b, at(fast, 1.4 if d == d_a else 1.3), 80 if d == d_a else 90, fast)
        rec(d_keep, keep, fast, 100, fast)
    assert led.n_new_measurements - before == 6  # cut to the passes' measurements, each still counted
    front = led.frontier()
    assert [r.digest for r in front] == [d_a, d_b, d_keep]
    assert [r.n_measurements for r in front[:2]] == [2, 2]
    assert front[0].step_seconds / led.scale == pytest.approx(1.4, rel=0.01)
    assert front[1].step_seconds / led.scale == pytest.approx(1.3, rel=0.01)
    # ranked on every measurement (no deciding passes), A still dominates B
    every = [Ranking(led.store.baseline())(m) for m in led.store.measured()]
    assert {m.digest: m.step_seconds for m in every}[d_a] < {m.digest: m.step_seconds for m in every}[d_b]
    assert len(led.store.get(d_a).measurement.measurement_ids) == 5  # the store keeps every measurement
    again = Ledger(setup, RunStore(tmp_path))
    again.load_store()
    assert [r.digest for r in again.frontier()] == [d_a, d_b, d_keep]
    from dashboard.data import load_run

    assert list(load_run(tmp_path).frontier.digest) == [d_a, d_b, d_keep]


def test_the_first_deciding_pass_takes_the_frontiers_near_misses_and_later_passes_only_what_moved_onto_one(
        tmp_path) -> None:
    """Seven plans of a 3-unit search, measured once each (raw times, no references; noise 2%). The
    first pass takes the frontier (A, R1, the baseline), its near miss N (1.4% off), the agents'
    own frontier (A, Z, B) and not Q, which missed only the agents' frontier (1.5%), nor Y (2.7%
    off the frontier). Measured in the passes, B is slow (1.6): Q moves onto the agents' frontier
    and is measured in the second pass; R1 slows to 1.14, which leaves Y 1.3% off the
    frontier, a near miss now, but near misses are the first pass's alone, so Y is never measured
    again. The Evaluator's part (step times) is played by ``Timed``: the times are the test's."""
    from search.engine.context import RunContext
    from search.engine.phases.deciding import DECIDING_MEASUREMENTS, deciding_passes
    from search.records import meta
    from search.records.config import SearchConfig

    setup = SearchSetup.from_profile(synthetic_profile(3, 2, seed=0))
    names = {"K": Action.KEEP.value, "R": Action.RECOMPUTE.value}
    # plan: (source, peak, time in the search, time in the deciding passes)
    plans = {"KKK": ("rule:none", 100, 1.0, 1.0), "RRR": ("agent_0", 50, 1.5, 1.5), "RKK": ("rule:r1", 60, 1.1, 1.14),
             "RRK": ("rule:n", 62, 1.115, 1.115), "RKR": ("agent_1", 64, 1.45, 1.45),
             "KRR": ("rule:y", 66, 1.13, 1.13), "KRK": ("agent_2", 70, 1.3, 1.6), "KKR": ("agent_3", 72, 1.32, 1.32)}
    acts = {p: [names[c] for c in p] for p in plans}
    digest = {p: setup.codec.digest(setup.codec.indices(a)) for p, a in acts.items()}
    plan_of = {d: p for p, d in digest.items()}
    led = Ledger(setup, RunStore(tmp_path))
    ids = iter(range(1, 1000))

    def record(p: str, passes: bool) -> MeasuredPlan:
        source, peak, early, late = plans[p]
        return led.record(_m(digest[p], acts[p], [late if passes else early], [], f"e:{next(ids)}", peak=peak,
                             source=source))

    for p in plans:
        record(p, passes=False)
    led.set_baseline(digest["KKK"])

    class Timed:  # the Measurer's part the passes use: each plan measured once more, at its time in the passes
        def side_by_side(self, jobs, record_at: bool = True) -> list[MeasuredPlan]:
            assert all(job.again and not job.micro_batch for job in jobs)  # plans measured again, no peers here
            return [record(plan_of[setup.codec.digest(setup.codec.indices(job.item))], passes=True) for job in jobs]

    no_references = SearchConfig(reference_every=0.0)  # nothing closes the passes: the test's times are raw
    deciding_passes(RunContext(no_references, led, Timed(), None, 0, None))  # type: ignore[arg-type]
    passes = [[plan_of[d] for d in p] for p in led.store.read(meta.DECIDING_PASSES)]
    assert set(passes[0]) == {"RRR", "RKK", "KKK", "RRK", "RKR", "KRK"}
    done = [p for one in passes for p in one]
    assert all(done.count(p) == DECIDING_MEASUREMENTS for p in set(done))
    assert "KKR" in passes[1] and "KKR" not in passes[0]  # moved onto the agents' frontier by B's pass times
    assert "KRR" not in done  # a near miss only after the first pass
    assert [plan_of[r.digest] for r in led.frontier((SourceKind.AGENT,))] == ["RRR", "RKR", "KKR"]


class _Passes:
    """A 3-unit search whose plans read one time until the confirming passes and another in them, raw (no
    references): ``plans`` maps a plan (``"RKK"``) to (source, peak, time before, time in them). It plays the
    Measurer's part in the passes (``side_by_side``); ``ctx`` runs them."""

    def __init__(self, tmp_path, plans: dict[str, tuple[str, int, float, float]]) -> None:
        from search.engine.context import RunContext
        from search.records.config import SearchConfig

        self.plans, self.confirming = plans, False
        self.setup, acts, digests = _three_units(*plans)
        self.act, self.digest = dict(zip(plans, acts)), dict(zip(plans, digests))
        self.plan_of = {d: p for p, d in self.digest.items()}
        self.led = Ledger(self.setup, RunStore(tmp_path))
        self.ids = iter(range(1, 1000))
        for p in plans:
            self.record(p)
        self.led.set_baseline(self.digest["KKK"])
        no_references = SearchConfig(reference_every=0.0)
        self.ctx = RunContext(no_references, self.led, self, None, 0, PhaseClock(self.led.store))  # type: ignore[arg-type]

    def record(self, p: str) -> MeasuredPlan:
        source, peak, before, after = self.plans[p]
        return self.led.record(_m(self.digest[p], self.act[p], [after if self.confirming else before], [],
                                  f"e:{next(self.ids)}", peak=peak, source=source))

    evaluators = 1

    def side_by_side(self, jobs, record: bool = True) -> list[MeasuredPlan]:
        assert all(job.again and not job.micro_batch for job in jobs)  # plans measured again, no peers here
        return [self.record(self.plan_of[self.setup.codec.digest(self.setup.codec.indices(job.item))]) for job in jobs]

    def names(self, records) -> list[str]:
        return [self.plan_of[r.digest] for r in records]


def test_the_frontier_is_reported_on_its_confirming_measurements_and_what_they_push_off_is_not_shown(
        tmp_path) -> None:
    """A 3-unit search whose deciding passes chose lucky plans. A (60) measured 1.10 until it was
    on the frontier; confirmed, it measures 1.60, above D (50, 1.50): it leaves the frontier after
    one confirmation. C (65, 1.20), which A hid, is back on it and confirmed in turn, at 1.25. D is
    confirmed at 1.52. The frontier is reported at the confirmed times, not the ones that chose it,
    by the ledger, a resumed ledger and the dashboard alike; the store keeps every measurement. The
    Evaluator's part is played by ``_Passes`` (raw times, no references)."""
    from search.engine.phases.deciding import CONFIRMING_MEASUREMENTS, confirming_passes, deciding_passes
    from search.records import meta

    # plan: (source, peak, time until the confirming passes, time in them)
    run = _Passes(tmp_path, {"KKK": ("rule:none", 100, 1.0, 1.0), "RRR": ("agent_0", 50, 1.5, 1.52),
                             "RKK": ("agent_1", 60, 1.10, 1.60), "KRK": ("agent_2", 65, 1.20, 1.25)})
    setup, digest, plan_of, led, ctx = run.setup, run.digest, run.plan_of, run.led, run.ctx
    deciding_passes(ctx)
    assert run.names(led.frontier()) == ["RRR", "RKK", "KKK"]  # KRK hidden by A's 1.10
    run.confirming = True
    confirming_passes(ctx)
    confirmed = [plan_of[d] for d in led.store.read(meta.CONFIRMED)]
    assert confirmed.count("RKK") == 1  # pushed off by its first confirmation: not measured again
    assert confirmed.count("RRR") == confirmed.count("KRK") == CONFIRMING_MEASUREMENTS
    assert "KKK" not in confirmed  # the baseline's measurements are the references
    for ledger in (led, Ledger(setup, RunStore(tmp_path))):
        if ledger is not led:
            ledger.load_store()
        front = ledger.frontier()
        assert [(plan_of[r.digest], r.step_seconds) for r in front] == [
            ("RRR", pytest.approx(1.52)), ("KRK", pytest.approx(1.25)), ("KKK", pytest.approx(1.0))]
        assert [r.n_measurements for r in front[:2]] == [CONFIRMING_MEASUREMENTS] * 2
        assert ledger.archive.measured[digest["RKK"]].step_seconds == pytest.approx(1.60)
    assert len(led.store.get(digest["RRR"]).measurement.measurement_ids) == 4  # search, deciding, 2 confirming
    from dashboard.data import load_run

    assert [plan_of[d] for d in load_run(tmp_path).frontier.digest] == ["RRR", "KRK", "KKK"]
    deciding_passes(ctx)  # as a resumed run takes them: the last confirmation is over, a new one follows
    assert led.store.read(meta.CONFIRMED) is None and led.store.read(meta.CONFIRMED_FROM) is None
    assert led.store.read(meta.CONFIRMING_NOISE) is None


def test_a_plan_let_onto_the_frontier_within_noise_of_a_confirmed_one_is_neither_confirmed_nor_shown(
        tmp_path) -> None:
    """A 3-unit search (raw times, no references; noise 2%). The deciding passes rank R (50) at 1.50,
    which hides S (55, 1.535, off the frontier by more than the noise). Confirmed, R measures 1.55: S is
    on the frontier again, but at most 2% faster than R at more memory, so it is not confirmed, and the
    report shows R at its confirmed time in its place; the store's frontier keeps S."""
    from search.engine.phases.deciding import CONFIRMING_MEASUREMENTS, confirming_passes, deciding_passes
    from search.engine.shown import confirmable
    from search.engine.report import write_outputs
    from search.records import meta
    from search.records.config import SearchConfig
    from search.records.frontier_file import load_frontier

    # plan: (source, peak, time until the confirming passes, time in them)
    run = _Passes(tmp_path, {"KKK": ("rule:none", 100, 1.0, 1.0), "RRR": ("agent_0", 50, 1.50, 1.55),
                             "RRK": ("agent_0", 55, 1.535, 1.535), "KRK": ("agent_0", 65, 1.20, 1.20)})
    digest, plan_of, led, ctx = run.digest, run.plan_of, run.led, run.ctx
    deciding_passes(ctx)
    assert run.names(led.frontier()) == ["RRR", "KRK", "KKK"]
    run.confirming = True
    confirming_passes(ctx)
    confirmed = [plan_of[d] for d in led.store.read(meta.CONFIRMED)]
    assert sorted(set(confirmed)) == ["KRK", "RRR"] and confirmed.count("RRR") == CONFIRMING_MEASUREMENTS
    assert [plan_of[r.digest] for r in led.frontier()] == ["RRR", "RRK", "KRK", "KKK"]  # the store's frontier
    assert led.store.read(meta.CONFIRMING_NOISE) == pytest.approx(0.02)  # what the shown frontier is chosen by
    shown = confirmable(led.points(), set(led.store.read(meta.CONFIRMED)), 0.02, digest["KKK"])
    assert [(plan_of[r.digest], r.step_seconds) for r in shown] == [
        ("RRR", pytest.approx(1.55)), ("KRK", pytest.approx(1.20)), ("KKK", pytest.approx(1.0))]
    # the baseline is never left out, though a confirmed plan at less memory be within the noise of it
    near_base = confirmable(led.points(), set(led.store.read(meta.CONFIRMED)), 0.3, digest["KKK"])
    assert [plan_of[r.digest] for r in near_base] == ["RRR", "KRK", "KKK"]
    led.store.write(meta.RULES, {"none": digest["KKK"]})
    report = write_outputs(SearchConfig(workload="gpt/tiny"), tmp_path, led)
    assert report["left_out"]["unconfirmed"] == 1 and report["left_out"]["plans"] == 0
    frontier_file = load_frontier(tmp_path)
    assert [p.step_seconds for p in frontier_file.points] == pytest.approx([1.55, 1.20, 1.0])
    assert frontier_file.readable and frontier_file.readable["left_out"] == [digest["RRK"]]
    assert "not confirmed and left out" in (tmp_path / "report.md").read_text()


def test_a_frontier_plan_within_noise_of_the_one_kept_at_less_memory_is_not_confirmed() -> None:
    """Walking the frontier from the lowest peak up, a plan that is not confirmed is kept for confirmation only
    where it is faster than the plan kept before it by more than the noise (10% here); a confirmed plan and the
    baseline are always kept."""
    from search.engine.shown import confirmable

    def plan(digest: str, peak: int, seconds: float) -> MeasuredPlan:
        return _m(digest, [], [seconds], [], f"e:{digest}", peak=peak)

    a, b, c, d, base = (plan("a", 50, 1.50), plan("b", 55, 1.40), plan("c", 60, 1.30), plan("d", 65, 1.10),
                        plan("base", 100, 1.0))
    points = [a, b, c, d, base]
    # b is within 10% of a; c is not within 10% of a, the plan kept before it; d is not within 10% of c
    assert [r.digest for r in confirmable(points, set(), 0.10, "base")] == ["a", "c", "d", "base"]
    assert [r.digest for r in confirmable(points, {"b"}, 0.10, "base")] == ["a", "b", "d", "base"]
    assert [r.digest for r in confirmable(points, set(), 0.0, "base")] == ["a", "b", "c", "d", "base"]


def test_a_plan_is_ranked_no_faster_than_the_baseline_unless_it_ran_another_step() -> None:
    base = _m("base", ["keep"], [0.10, 0.10, 0.10], [0.10] * 3, "e-1:1")
    faster = _m("p", ["recompute"], [0.07, 0.07, 0.07], [0.10] * 3, "e-1:2")  # compiled whole, say
    rank = Ranking(base)
    assert rank(faster).step_seconds == pytest.approx(0.10)  # the floor: noise, for plans of one step
    assert rank(faster, floor=False).step_seconds == pytest.approx(0.07)  # a whole-model step keeps its time

"""Drift: each plan's time is taken relative to the all-keep plan measured beside it.

A machine's speed drifts over a search (other processes, clocks, caches), by several percent
here over minutes. Plans measured minutes apart were compared on raw medians: a plan measured in
a fast minute beat the baseline measured in a slow one and pushed it off the frontier. The
Evaluator now measures the reference (all keep) again every ``reference_every`` seconds and labels
each sample with it; the ledger compares ``paired`` times.
"""

from __future__ import annotations

import pytest

from env.plan import Action
from env.records import MeasuredPlan, paired
from search.evaluator import REFERENCE_MIN_PLANS, Evaluator
from search.ledger import Ledger, SearchSetup
from search.store import RunStore
from tests.profiles import synthetic_profile


def _m(digest: str, actions: list[str], samples: list[float], refs: list[float], mid: str,
       peak: int = 100, source: str = "agent_0") -> MeasuredPlan:
    return MeasuredPlan(workload="synthetic", batch_shape="-", digest=digest, actions=actions, sources=[source],
                        peak_bytes=peak, live_before_bytes=0, step_seconds_samples=samples, reference_seconds=refs,
                        clock="thread-cpu", device="cpu", torch_version="t", measurement_ids=[mid])


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


def test_a_machine_that_speeds_up_no_longer_pushes_the_baseline_off_the_frontier(tmp_path) -> None:
    """The resnet50 search of the last table: the baseline measured first, in a slow minute (1.0 s); a
    plan saving 10% of the memory measured later, when the machine ran 10% faster, at 0.918 s, 2% slower
    than the baseline measured beside it (0.90 s). On raw medians the plan dominates the baseline
    (0.918 < median(1.0, 0.9)); paired, it is 2% slower and both stay on the frontier."""
    prof = synthetic_profile(3, 2, seed=0)
    setup = SearchSetup.from_profile(prof)
    keep = [Action.KEEP.value] * 3
    other = [Action.RECOMPUTE.value, Action.KEEP.value, Action.KEEP.value]
    d_keep, d_other = (setup.codec.digest(setup.codec.indices(a)) for a in (keep, other))

    def ledger(with_refs: bool) -> Ledger:
        refs = (lambda r, n=3: [r] * n) if with_refs else (lambda r, n=3: [])
        (tmp_path / f"refs_{with_refs}").mkdir()
        led = Ledger(setup, RunStore(tmp_path / f"refs_{with_refs}"))  # a run folder, as the dashboard reads
        led.record(_m(d_keep, keep, [1.01, 1.0, 0.99], refs(1.0), "e:1", peak=100, source="rule:none"))
        led.set_baseline(d_keep)
        led.record(_m(d_keep, keep, [0.91, 0.9, 0.89], refs(0.9), "e:2", peak=100, source="rule:none"))
        led.record(_m(d_other, other, [0.92, 0.918, 0.91], refs(0.9), "e:3", peak=90))
        return led

    raw = ledger(with_refs=False)
    assert [r.digest for r in raw.frontier()] == [d_other]  # what the search did before
    led = ledger(with_refs=True)
    assert [r.digest for r in led.frontier()] == [d_other, d_keep]
    assert led.scale == pytest.approx(0.95)  # the baseline's median over both its measurements
    assert led.baseline().step_seconds == pytest.approx(0.95)
    assert led.frontier()[0].step_seconds == pytest.approx(0.918 / 0.9 * 0.95)
    # the store keeps what was measured; a resumed run pairs it the same way
    again = Ledger(setup, RunStore(tmp_path / "refs_True"))
    again.load_store()
    assert [r.digest for r in again.frontier()] == [d_other, d_keep]
    assert again.store.get(d_other).measurement.step_seconds == pytest.approx(0.918)
    # the dashboard, reading the store alone, shows the same paired times and the same frontier
    from dashboard.data import load_run

    run = load_run(tmp_path / "refs_True")
    assert list(run.frontier.digest) == [d_other, d_keep] and run.evaluations.paired.all()
    assert run.frontier.step_seconds.tolist() == pytest.approx([r.step_seconds for r in led.frontier()])
    assert run.baseline_seconds == pytest.approx(0.95)


@pytest.mark.slow
def test_the_evaluator_measures_its_reference_again_and_labels_every_sample() -> None:
    """A real workload: the first plan is preceded by a reference measurement, a stale reference is
    measured again only after REFERENCE_MIN_PLANS plans, every sample carries the reference measured
    before it, and the reference measurements reach the journal (the store) as the baseline's."""
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
    assert got[-1].reference_seconds == [refs[1].step_seconds] * 2
    assert refs[0].sources == ["rule:none"]
    # the baseline measured on its own is its own reference; references off: raw records
    own = ev.evaluate(keep, "rule:none", again=True)
    assert own.reference_seconds == [own.step_seconds] * 2
    plain = Evaluator("gpt/tiny", 0, [], ["keep", "recompute"], repeats=2, device="cpu", threads=1)
    m = plain.evaluate(plans[0], "agent_0")
    assert m.reference_seconds == [] and plain.drain() == [m]

"""A peer is measured beside the plan that answers it, in the same passes, also where those passes move the answer."""

from __future__ import annotations

from types import SimpleNamespace

from env.data.measured import MeasuredPlan
from env.measure.peers import Peer, PeerKind
from search.engine.ledger import Ledger
from search.engine.phases.peers import side_by_side_peers
from search.records.store import RunStore
from tests.test_drift import _m, _three_units


def test_a_peer_whose_answer_moved_after_its_passes_is_measured_again_beside_the_new_answer(tmp_path) -> None:
    """All keep at 100 bytes; plan R (recompute unit 0) at 80 bytes; plan S (recompute unit 1) at 85 bytes;
    a peer measured as itself at 90 bytes; plan T (recompute unit 2), a peer that is a plan of ours, at 88 bytes. While R is the fastest plan at no more than 90 bytes, the peer goes
    right after it, until both were measured twice; then S's measurements make S the answer, and the peer is
    measured again right after S until S too was measured twice."""
    setup, (keep, r, s, t), (d_keep, d_r, d_s, d_t) = _three_units("KKK", "RKK", "KRK", "KKR")
    led = Ledger(setup, RunStore(tmp_path))
    led.record(_m(d_keep, keep, [0.9], [], "e:1", peak=100, source="rule:none"))
    led.set_baseline(d_keep)
    led.record(_m(d_r, r, [1.1], [], "e:2", peak=80))
    led.record(_m(d_s, s, [1.3], [], "e:3", peak=85))  # slower than R at more memory: off the frontier
    peer = Peer(name="op", kind=PeerKind.TORCHTITAN_OP_SAC, params={})
    led.record_peer("op", _m("peer:op", keep, [1.2], [], "e:4", peak=90), spec=peer.model_dump(mode="json"))
    ctx = SimpleNamespace(ledger=led)
    assert [x.digest for x in led.frontier()] == [d_r, d_keep]

    assert side_by_side_peers(ctx, [d_r], [], 2) == [d_r, peer]
    assert side_by_side_peers(ctx, [], [], 2) == [d_r, peer]  # the answer put in where the passes lack it
    assert side_by_side_peers(ctx, [], [d_r, "peer:op"], 2) == [d_r, peer]
    done = [d_r, "peer:op", d_r, "peer:op"]
    assert side_by_side_peers(ctx, [], done, 2) == []  # both measured twice beside each other: done

    led.record(_m(d_s, s, [1.0, 1.0, 1.0], [], "e:5", peak=85))  # S now faster than R at no more than 90 bytes
    assert [x.digest for x in led.frontier()] == [d_r, d_s, d_keep]
    assert side_by_side_peers(ctx, [], done, 2) == [d_s, peer]
    done += [d_s, "peer:op"]
    assert side_by_side_peers(ctx, [], done, 2) == [d_s, peer]
    assert side_by_side_peers(ctx, [], done + [d_s, "peer:op"], 2) == []
    # a peer whose answer is measured often enough in these passes, but the peer itself not: the peer goes last
    assert side_by_side_peers(ctx, [d_r], [d_s, d_s], 2) == [d_r, peer]
    # a peer that is a plan of ours (plan T, off the frontier) is measured at most twice in the passes, as every
    # plan is; where its answer moved to a plan measured less, that plan is put in without it
    led.record(_m(d_t, t, [1.2], [], "e:6", peak=88))
    led.record_peer_plan("seq", d_t, "", "T as a peer")
    both = [d_s, d_s, "peer:op", "peer:op"]
    assert side_by_side_peers(ctx, [], [d_t, *both], 2) == [d_t]  # T once: measured again beside S
    assert side_by_side_peers(ctx, [], [d_t, d_t, d_s, "peer:op", "peer:op"], 2) == [d_s, peer]  # S in, T not
    assert side_by_side_peers(ctx, [], [d_t, d_t, *both], 2) == []


class _PeerPasses:
    """A 3-unit search (raw times, no references) with all keep (100 bytes, 0.9 s), plan R (recompute unit 0, 80
    bytes) and a peer measured as itself (90 bytes, answered by R). It plays the Measurer's part in the
    confirming passes: the k-th measurement of R or the peer there reads ``times(k)`` (3 steps each)."""

    evaluators = 1

    def __init__(self, tmp_path, plan_times, peer_times) -> None:
        from search.engine.context import RunContext
        from search.engine.phase_clock import PhaseClock
        from search.records.config import SearchConfig

        self.setup, (keep, r), (d_keep, self.d_r) = _three_units("KKK", "RKK")
        self.keep, self.r, self.times = keep, r, {"plan": plan_times, "peer": peer_times}
        self.led = Ledger(self.setup, RunStore(tmp_path))
        self.ids = iter(range(1, 1000))
        self.led.record(_m(d_keep, keep, [0.9] * 3, [], f"e:{next(self.ids)}", peak=100, source="rule:none"))
        self.led.set_baseline(d_keep)
        self.peer = Peer(name="op", kind=PeerKind.TORCHTITAN_OP_SAC, params={})
        self.counts = {"plan": 0, "peer": 0}
        self._plan()
        self._peer()
        self.ctx = RunContext(SearchConfig(reference_every=0.0), self.led, self, None, 0,  # type: ignore[arg-type]
                              PhaseClock(self.led.store))

    def _samples(self, who: str) -> list[float]:
        t = self.times[who](self.counts[who])
        self.counts[who] += 1
        return [t * 0.99, t, t * 1.01]

    def _plan(self) -> MeasuredPlan:
        return self.led.record(_m(self.d_r, self.r, self._samples("plan"), [], f"e:{next(self.ids)}", peak=80))

    def _peer(self) -> MeasuredPlan:
        return self.led.record_peer("op", _m("peer:op", self.keep, self._samples("peer"), [], f"e:{next(self.ids)}",
                                      peak=90), spec=self.peer.model_dump(mode="json"))

    def side_by_side(self, jobs, record: bool = True) -> list:
        return [self._peer() if isinstance(job.item, Peer) else self._plan() for job in jobs]

    def confirm(self) -> tuple[list[str], str]:
        """The confirming passes run: what they measured, in order, and the verdict on the peer."""
        from search.engine.phases.deciding import confirming_passes
        from search.records import meta
        from search.records.peer_verdicts import peer_verdicts

        confirming_passes(self.ctx)
        (v,) = peer_verdicts(self.led.peers(), self.led.frontier(), self.led.peer_plans())
        return self.led.store.read(meta.CONFIRMED), v.verdict


def test_a_peer_told_apart_from_its_answer_is_measured_beside_it_as_often_as_a_quote_before_the_verdict(
        tmp_path) -> None:
    """The confirming passes measure a peer and its answer twice each; where those measurements call the peer
    faster or slower, both are measured beside each other until each has ``VERDICT_MEASUREMENTS``. A peer whose
    first two measurements read 1.65x its answer's and whose next three read as fast as it ends within noise (the
    verdict a quote apart gives, and from there is measured no more); one that stays 1.65x ends slower; one within noise from the first is measured
    no more than any frontier plan."""
    from search.engine.phases.deciding import CONFIRMING_MEASUREMENTS
    from search.records.peer_verdicts import VERDICT_MEASUREMENTS

    first = 1  # the search's own measurement before the passes; the passes' k-th is times(first + k)
    lucky = _PeerPasses(tmp_path / "lucky", lambda k: 1.0, lambda k: 1.65 if k <= first + 1 else 1.0)
    done, verdict = lucky.confirm()
    assert done[:4] == [lucky.d_r, "peer:op", "peer:op", lucky.d_r]  # side by side, alternating which goes first
    assert CONFIRMING_MEASUREMENTS < done.count("peer:op") == done.count(lucky.d_r) <= VERDICT_MEASUREMENTS
    assert verdict == "within noise"  # once within noise, measured no more

    slower = _PeerPasses(tmp_path / "slower", lambda k: 1.0, lambda k: 1.65)
    done, verdict = slower.confirm()
    assert done.count(slower.d_r) == done.count("peer:op") == VERDICT_MEASUREMENTS
    assert verdict == "slower"
    assert set(slower.ctx.clock.seconds) == {"confirming passes", "verdict rounds"}  # the report's phases

    alike = _PeerPasses(tmp_path / "alike", lambda k: 1.0, lambda k: 1.005)
    done, verdict = alike.confirm()
    assert done.count(alike.d_r) == done.count("peer:op") == CONFIRMING_MEASUREMENTS
    assert verdict == "within noise"

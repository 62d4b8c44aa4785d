"""A peer is measured beside the plan that answers it, in the same passes, also where those passes move the answer."""

from __future__ import annotations

from types import SimpleNamespace

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

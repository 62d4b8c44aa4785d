"""Peer verdicts (``search.records.peer_verdicts``): against the strict frontier, faster or slower only beyond
both spreads, a peer that is a plan of ours shown as that plan. Torch-free and fast."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from env.data.measured import MeasuredPlan
from search.records.frontier_file import FrontierFile
from search.records.peer_verdicts import PeerVerdict, peer_verdicts

MIB = 1 << 20


def _record(digest: str, peak_mib: float, samples_ms: list[float], actions: list[str] | None = None,
            oom: bool = False) -> MeasuredPlan:
    return MeasuredPlan(workload="gpt/tiny", batch_shape="x", digest=digest, actions=actions or ["keep", "recompute"],
                        peak_bytes=int(peak_mib * MIB), live_before_bytes=0, oom=oom,
                        step_seconds_samples=[] if oom else [s / 1e3 for s in samples_ms], clock="thread-cpu",
                        device="cpu", torch_version="2.13")


LOW = _record("low", 10, [130, 131, 132, 133, 134, 135], ["recompute", "recompute"])
MID = _record("mid", 20, [110, 111, 112, 113, 114, 115])
TOP = _record("top", 30, [100, 101, 102, 103, 104, 105], ["keep", "keep"])
STRICT = [LOW, MID, TOP]


def test_a_peer_within_the_spreads_is_within_noise_though_its_median_is_lower() -> None:
    peer = _record("peer:p", 25, [105, 108, 110, 112, 114, 116])  # median 111 < ours 112.5, spreads ~4 ms
    (v,) = peer_verdicts({"p": peer}, STRICT, {"p": None})
    assert v.ours is not None and v.ours.digest == "mid" and v.ours.actions == ["keep", "recompute"]
    assert v.verdict == "within noise" and v.ratio < 1 and v.text.startswith("within noise (±")


def test_a_peer_beyond_both_spreads_is_faster_or_slower() -> None:
    fast, slow = _record("peer:f", 25, [90, 91, 92, 93, 94, 95]), _record("peer:s", 25, [150, 151, 152, 153, 154, 155])
    got = {v.peer: v for v in peer_verdicts({"f": fast, "s": slow}, STRICT, {})}
    assert got["f"].verdict == "faster"
    assert got["f"].text == f"{got['f'].ratio:.2f}x, peer faster beyond both spreads (1 and 1 measurements side by side)"
    assert got["s"].verdict == "slower" and got["s"].ratio > 1


def test_a_peer_that_is_a_plan_of_ours_is_shown_as_that_plan() -> None:
    on = peer_verdicts({"seq": MID}, STRICT, {"seq": "mid"})[0]  # on the frontier: it answers itself
    assert on.plan == "mid" and on.plan_summary == "keep 1, recompute 1" and on.verdict == "the same plan"
    off = _record("off", 20, [140, 141, 142, 143, 144, 145])  # dominated by MID at no more memory
    v = peer_verdicts({"seq": off}, STRICT, {"seq": "off"})[0]
    assert v.plan == "off" and v.ours.digest == "mid" and v.verdict == "slower"


def test_no_plan_as_low_and_out_of_memory_are_said_so() -> None:
    got = peer_verdicts({"low": _record("peer:low", 5, [200]), "oom": _record("peer:oom", 0, [], oom=True)},
                        STRICT, {})
    assert [(v.peer, v.verdict, v.ours) for v in got] == [("low", "no plan of ours this low", None),
                                                          ("oom", "out of memory", None)]


def test_verdicts_travel_in_the_frontier_file() -> None:
    verdicts = peer_verdicts({"p": _record("peer:p", 25, [90, 91, 92, 93])}, STRICT, {}, {"p": "a note"},
                             {"p": "a peer"})
    f = FrontierFile(workload="gpt/tiny", batch_shape="x", device="cpu", clock="thread-cpu", fingerprint="f",
                     units=["a", "b"], baseline={"peak_bytes": 1, "step_seconds": 0.1}, points=[], peers=verdicts)
    back = FrontierFile.model_validate_json(f.model_dump_json())
    assert back.peers == verdicts and back.peers[0].note == "a note" and back.peers[0].label == "a peer"


samples = st.lists(st.floats(50, 200), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(samples, samples)
def test_a_verdict_within_the_spreads_is_never_faster(peer_ms: list[float], ours_ms: list[float]) -> None:
    peer, ours = _record("peer:p", 20, peer_ms), _record("ours", 20, ours_ms)
    (v,) = peer_verdicts({"p": peer}, [ours], {})
    gap = abs(peer.step_seconds - ours.step_seconds)
    if gap <= max(peer.spread_seconds, ours.spread_seconds):
        assert v.verdict == "within noise"
    else:
        assert v.verdict == ("faster" if peer.step_seconds < ours.step_seconds else "slower")
    assert isinstance(v, PeerVerdict)

"""DynamicPlan: the fastest plan that fits the memory free now, per batch shape."""

from __future__ import annotations

import pytest

from env.data.plan import Action, fingerprint
from env.data.types import MIB
from env.units.find import find_units
from env.workloads.workload import load_workload
from search.records.frontier_file import (
    Baseline,
    FrontierError,
    FrontierFile,
    FrontierPoint,
    load_frontier,
    write_frontier,
)
from search.training.dynamic import DynamicPlan

W = load_workload("gpt/tiny")
UNITS = find_units(W.model)
FP = fingerprint(W.model, UNITS)
SHORT, LONG = "idx:2x16,targets:2x16", "idx:2x32,targets:2x32"


def _point(actions: dict[str, str], peak_mb: float, seconds: float, live_mb: float = 4) -> FrontierPoint:
    return FrontierPoint(plan=actions, peak_bytes=int(peak_mb * MIB), step_seconds=seconds,
                         activation_bytes=int((peak_mb - live_mb) * MIB))


def _frontier(batch_shape: str, scale: float) -> FrontierFile:
    """keep: 10 MB at 1.0 s; blocks.0 recomputed: 8 MB at 1.2 s; all recomputed: 6 MB at 1.6 s (times scale)."""
    pts = [_point({}, 10 * scale, 1.0 * scale), _point({"blocks.0": "recompute"}, 8 * scale, 1.2 * scale),
           _point({u: "recompute" for u in UNITS}, 6 * scale, 1.6 * scale)]
    return FrontierFile(workload="gpt/tiny", batch_shape=batch_shape, device="cpu", clock="wall", fingerprint=FP,
                        units=UNITS,
                        baseline=Baseline(peak_bytes=int(10 * scale * MIB), step_seconds=scale), points=pts)


def test_select_picks_the_fastest_plan_that_fits():
    dyn = DynamicPlan(_frontier(SHORT, 1.0))
    assert dyn.select(20 * MIB).point.step_seconds == 1.0
    assert dyn.select(9 * MIB).plan.actions["blocks.0"] is Action.RECOMPUTE
    assert dyn.select(9 * MIB).plan.actions["blocks.1"] is Action.KEEP  # unnamed units are keep
    assert set(dyn.select(6 * MIB).plan.actions.values()) == {Action.RECOMPUTE}
    assert dyn.select(4.5 * MIB, activation_only=True).point.peak_bytes == 8 * MIB  # 4 MB of activations fits


def test_nothing_fits_names_the_smallest_possible():
    dyn = DynamicPlan(_frontier(SHORT, 1.0))
    with pytest.raises(FrontierError) as e:
        dyn.select(5 * MIB)
    msg = str(e.value)
    assert "\n" not in msg and "fits 5.00 MB" in msg and "smallest peak is 6.00 MB (recompute 4)" in msg
    with pytest.raises(FrontierError, match="smallest activation memory is 2.00 MB"):
        dyn.select(1 * MIB, activation_only=True)


def test_switches_plan_when_the_batch_shape_changes():
    model = load_workload("gpt/tiny").model
    dyn = DynamicPlan([_frontier(SHORT, 1.0), _frontier(LONG, 2.0)])
    first = dyn.apply(model, 17 * MIB, batch_shape=SHORT)  # short batches: everything fits, keep all
    assert first.batch_shape == SHORT and dyn.current == first
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == []
    longer = dyn.apply(model, 17 * MIB, batch_shape=LONG)  # long: 20 MB no longer fits, 16 MB does
    assert longer.point.peak_bytes == 16 * MIB
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == ["blocks.0"]
    handle = dyn._handle
    assert dyn.apply(model, 17 * MIB, batch_shape=LONG) == longer and dyn._handle is handle  # unchanged: kept
    dyn.apply(model, 13 * MIB, batch_shape=LONG)  # less memory free now: recompute all
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == UNITS
    dyn.remove()
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == []


def test_batch_shape_errors_name_the_known_shapes():
    dyn = DynamicPlan([_frontier(SHORT, 1.0), _frontier(LONG, 2.0)])
    with pytest.raises(FrontierError, match=f"2 batch shapes are known \\({SHORT}, {LONG}\\); name one"):
        dyn.select(20 * MIB)
    with pytest.raises(FrontierError, match="no frontier for batch shape 'idx:9x9'; known: .*search that batch shape"):
        dyn.select(20 * MIB, batch_shape="idx:9x9")
    with pytest.raises(FrontierError, match="two frontiers for batch shape"):
        DynamicPlan([_frontier(SHORT, 1.0), _frontier(SHORT, 2.0)])
    other = _frontier(LONG, 2.0).model_copy(update={"fingerprint": "0" * 16})
    with pytest.raises(FrontierError, match="frontiers of different models"):
        DynamicPlan([_frontier(SHORT, 1.0), other])


def test_frontier_file_round_trips_sorted_by_peak(tmp_path):
    f = _frontier(SHORT, 1.0)
    f = f.model_copy(update={"points": list(reversed(f.points))})
    path = write_frontier(tmp_path, FrontierFile.model_validate(f.model_dump()))
    assert path == tmp_path / "frontier.json"
    back = load_frontier(tmp_path)
    assert [p.peak_bytes for p in back.points] == [6 * MIB, 8 * MIB, 10 * MIB]
    assert back == FrontierFile.model_validate(f.model_dump())

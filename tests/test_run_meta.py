"""The run store's meta: every key declared once and typed (search.records.meta), a value checked on
write and on read, an undeclared key or a value of the wrong type refused in one line, and stores
written before the keys were typed (plain ``json.dumps`` values) still read."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from env.data.plan_check import PlanCheck
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.unit_choice import UnitChoice
from search.records import meta
from search.records.meta import MetaKeyError, meta_key
from search.records.store import RunStore, StoreError
from search.records.throughput import CapRow, ThroughputCurve, ThroughputPoint

DATA = Path(__file__).resolve().parent / "data"
PROFILE = json.loads((DATA / "gpt_tiny_profile.json").read_text())


def _record(digest: str = "peer:hf-checkpointing", oom: bool = False) -> MeasuredPlan:
    return MeasuredPlan(workload="gpt/tiny", batch_shape="idx:2x16", digest=digest, actions=[], sources=[digest],
                        peak_bytes=1000, live_before_bytes=400, step_seconds_samples=[] if oom else [0.2, 0.21],
                        reference_seconds=[] if oom else [0.1, 0.1], clock="thread-cpu", device="cpu",
                        torch_version="t", oom=oom, measurement_ids=["evaluator_0-ab:7"], evaluators=["e@n"])


SAMPLES = {  # one value of every declared key, as a run writes it
    "store_schema_version": 3,
    "config": {"workload": "gpt/tiny", "agents": 2, "reward": "hybrid"},
    "status": "interrupted",
    "driver": {"pid": 4242, "host": "node-a"},
    "started_at": 1.5e9,
    "finished_at": 1.5e9 + 60.25,
    "profile": ModelProfile.model_validate(PROFILE),
    "unit_choice": UnitChoice(units=["blocks.0", "blocks.1"], saved_bytes=[10, 20], total_saved_bytes=40,
                              coverable_bytes=32, coverage=0.9375, mode="auto"),
    "headroom": "no plan over these units can lower the peak by more than 5%",
    "units": ["blocks.0", "blocks.1"],
    "fingerprint": "3f2a",
    "evaluators": [{"name": "evaluator_0", "label": "evaluator_0@n", "node": "n", "device": "cpu, 1 threads",
                    "pid": 7, "restarts": 1, "alive": True, "warm_up_steps": 12, "rank_pids": [8, 9]}],
    "events": ["evaluator_0 died in the measurement of plan (keep 4) at micro-batch 16 (ActorDiedError: The actor "
               "died unexpectedly before finishing this task.); restarted; the configuration is measured again"],
    "fsdp": {"ranks": 2, "backend": "gloo", "sharded": ["", "blocks.0", "blocks.1"], "peers": "not under FSDP"},
    "max_measurements": 33,
    "measurement_mode": "exclusive: agents wait while 1 Evaluator(s) measure, as they would share CPU cores",
    "agents": [{"name": "agent_0", "budget_bytes": 123456}],
    "rules": {"none": "d0", "all": "d1"},
    "baseline_digest": "d0",
    "baseline_by_evaluator": {"evaluator_0@n": {"peak_bytes": 1000, "step_seconds": 0.1, "clock": "wall"}},
    "peers": {"hf-checkpointing": {"record": _record(), "note": ""},
              "compile-budget-0.0": {"record": _record("peer:compile-budget-0.0", oom=True), "note": "a bug"}},
    "whole_model": {"d1": _record("d1")},
    "exact_relative": 0.005,
    "exact": ["d1", "d2"],
    "answer_rounds": [{"proposed": 3, "measured": 2}, {"proposed": 0, "measured": 0}],
    "decided_from": {"evaluator_0-ab": 11},
    "deciding_passes": [["d1", "d0"], ["d0", "d1"]],
    "remeasured": ["d1", "d0", "d0", "d1"],
    "confirmed_from": {"evaluator_0-ab": 15},
    "confirmed": ["d1", "d1"],
    "confirming_noise": 0.055,
    "gate": {"d1": PlanCheck(digest="d1", passed=True, error=0.0, tolerance=1e-3),
             "d2": PlanCheck(digest="d2", passed=False, error=0.5, tolerance=1e-3, culprits=["blocks.1"],
                             causes=["draws random numbers from numpy's global generator"])},
    "batch_scaling": {"d1": [{"batch_size": 1, "peak_bytes": 500, "step_seconds": float("inf"), "oom": True,
                              "clock": "wall"},
                             {"batch_size": 2, "peak_bytes": 900, "step_seconds": 0.2}]},
    "batch_size": 2,
    "phase_seconds": {"Ray start": 2.5, "profile": 4.0, "training": 30.25},
    "evaluator_seconds": {"plans": 12.5, "references": 3.0, "plan_measurements": 40.0,
                          "reference_measurements": 6.0},
    "throughput_profiles": {8: ModelProfile.model_validate(PROFILE)},
    "throughput_measured": [{"micro_batch": 8, "record": _record("d1")}],
    "throughput": ThroughputCurve(
        caps=[CapRow(cap_bytes=5000, answer=ThroughputPoint.of(_record("d1"), "ours", "keep 2", 8, None, 0, 16, [])),
              CapRow(cap_bytes=100, why="no plan measured fits 0.0 MiB")],
        micro_batches=[1, 2, 4, 8], default_micro_batch=2, tokens_per_sample=16, quote_rounds=2),
}


def test_every_key_is_declared_once_with_a_docstring_and_a_sample_here():
    assert set(meta.KEYS) == set(SAMPLES)  # a new key gets a sample above, so its round trip is tested
    assert len(meta.KEYS) == 39
    for name, key in meta.KEYS.items():
        assert key.name == name and meta_key(name) is key and key.doc.strip()


def test_every_key_round_trips_through_a_store_and_reads_back_typed(tmp_path):
    with RunStore(tmp_path) as s:
        for name, value in SAMPLES.items():
            s.write(meta_key(name), value)
    with RunStore(tmp_path, readonly=True) as s:
        got = {name: s.read(meta_key(name)) for name in SAMPLES}
    assert got == SAMPLES
    assert isinstance(got["profile"], ModelProfile) and isinstance(got["unit_choice"], UnitChoice)
    assert isinstance(got["peers"]["hf-checkpointing"]["record"], MeasuredPlan)
    assert got["peers"]["hf-checkpointing"]["record"].step_seconds == pytest.approx(0.205)


def test_a_key_never_written_reads_as_declared(tmp_path):
    with RunStore(tmp_path) as s:
        assert s.read(meta.RULES) == {} and s.read(meta.EXACT) == [] and s.read(meta.PEERS) == {}
        assert s.read(meta.PROFILE) is None and s.read(meta.DECIDED_FROM) is None and s.read(meta.STATUS) is None
        assert s.read(meta.MEASUREMENT_MODE) == ""
        assert s.read(meta.STORE_SCHEMA_VERSION) == 3  # every store says its schema


def test_an_unknown_key_is_refused_in_one_line(tmp_path):
    with RunStore(tmp_path) as s:
        for attempt in (lambda: s.set_meta("notes", ["x"]), lambda: s.get_meta("nope"), lambda: meta_key("Status")):
            with pytest.raises(MetaKeyError) as e:
                attempt()
            msg = str(e.value)
            assert "\n" not in msg and "unknown run meta key" in msg and "search/records/meta.py" in msg
            assert "baseline_digest" in msg  # the keys there are
        assert s.get_meta("status") is None  # the string door reads a declared key as read() does
        s.set_meta("status", "finished")
        assert s.read(meta.STATUS) == "finished"


def test_a_value_of_the_wrong_type_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    with RunStore(tmp_path) as s:
        s.write(meta.RULES, {"none": "d0"})
        for key, bad in ((meta.RULES, {"none": 3}), (meta.STATUS, "done"), (meta.DRIVER, {"pid": "x", "host": "h"}),
                         (meta.PROFILE, {"units": []})):
            with pytest.raises(StoreError) as e:
                s.write(key, bad)
            msg = str(e.value)
            assert "\n" not in msg and f"run meta '{key.name}' must be" in msg
        assert s.read(meta.RULES) == {"none": "d0"} and s.read(meta.STATUS) is None


def _raw_meta(path: Path, values: dict[str, str]) -> None:
    """Meta rows as a store written before the keys were typed holds them (plain json.dumps text)."""
    with sqlite3.connect(path / "store.sqlite") as conn:
        conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", list(values.items()))


def test_a_store_written_before_the_keys_were_typed_still_reads(tmp_path):
    RunStore(tmp_path).close()
    old = {"profile": PROFILE, "headroom": None, "status": "finished", "rules": {"none": "d0"},
           "peers": {"hf-checkpointing": {"record": _record().model_dump(mode="json"), "note": ""}},
           "evaluators": [{"name": "evaluator_0", "label": "e@n", "node": "n", "device": "cpu", "pid": 1,
                           "restarts": 0, "alive": True}],  # before warm-up steps were reported
           "batch_scaling": {"d1": [{"batch_size": 1, "peak_bytes": 5, "step_seconds": float("inf")}]},
           "notes": ["a key no run writes any more"]}
    _raw_meta(tmp_path, {k: json.dumps(v) for k, v in old.items()})
    with RunStore(tmp_path, readonly=True) as s:
        assert s.read(meta.PROFILE) == ModelProfile.model_validate(PROFILE)
        assert s.read(meta.HEADROOM) is None and s.read(meta.STATUS) == "finished"
        assert s.read(meta.PEERS)["hf-checkpointing"]["record"] == _record()
        assert s.read(meta.EVALUATORS)[0]["restarts"] == 0
        assert s.read(meta.BATCH_SCALING)["d1"][0]["step_seconds"] == float("inf")


def test_a_damaged_value_is_refused_on_read_in_one_line(tmp_path):
    RunStore(tmp_path).close()
    _raw_meta(tmp_path, {"rules": json.dumps(["none", "d0"]), "units": "not json"})
    with RunStore(tmp_path, readonly=True) as s:
        for key, what in ((meta.RULES, "dict[str, str]"), (meta.UNITS, "not JSON")):
            with pytest.raises(StoreError) as e:
                s.read(key)
            msg = str(e.value)
            assert "\n" not in msg and f"meta '{key.name}'" in msg and what in msg and "start a new run" in msg

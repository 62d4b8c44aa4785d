"""Plans: JSON round-trip, stable digests, and one-line refusals of plans that do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env.data.errors import PlanError
from env.data.plan import SCHEMA_VERSION, Action, Plan, check_plan, fingerprint, parse_action
from env.runtime.apply import apply_actions, plan_for
from env.units.find import find_units
from env.workloads.workload import load_workload
from tests.test_workloads import one_line_error


@pytest.fixture(scope="module")
def gpt():
    w = load_workload("gpt/tiny")
    return w.model, find_units(w.model)


def test_json_round_trip_and_digest(gpt, tmp_path: Path) -> None:
    model, units = gpt
    plan = plan_for(model, units, ["recompute", "keep", "selective", "recompute"])
    again = Plan.load(plan.save(tmp_path / "plan.json"))
    assert again == plan and again.digest == plan.digest
    assert json.loads(plan.to_json())["actions"]["blocks.2"] == "selective"
    assert plan.summary() == "recompute 2, keep 1, selective 1"
    other = plan_for(model, units, ["recompute", "keep", "selective", "keep"])
    assert other.digest != plan.digest


def test_fingerprint_depends_on_shapes_not_on_weights() -> None:
    a, b = load_workload("gpt/tiny", seed=0).model, load_workload("gpt/tiny", seed=1).model
    wide = load_workload("gpt/tiny?d_model=64").model
    units = find_units(a)
    assert fingerprint(a, units) == fingerprint(b, units) != fingerprint(wide, units)


def test_a_plan_for_another_model_is_refused(gpt) -> None:
    model, units = gpt
    other = load_workload("gpt/tiny?d_model=64").model
    plan = plan_for(other, units, [Action.RECOMPUTE] * len(units))
    with pytest.raises(PlanError) as e:
        apply_actions(model, plan, units)
    one_line_error(e, "plan was made for another model", plan.fingerprint, "search this model again")
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_plan_naming_a_missing_unit_is_refused(gpt) -> None:
    model, units = gpt
    plan = Plan(fingerprint=fingerprint(model, units), actions={"blocks.9": Action.RECOMPUTE, "blocks.0": Action.KEEP})
    with pytest.raises(PlanError) as e:
        check_plan(plan, model)
    one_line_error(e, "unit 'blocks.9' which GPT does not have", "strict=False")
    with apply_actions(model, plan, strict=False) as handle:
        assert handle.skipped == ["blocks.9"] and handle.applied == {}


def test_an_unknown_action_names_the_choices(gpt) -> None:
    model, units = gpt
    with pytest.raises(PlanError) as e:
        parse_action("checkpoint")
    one_line_error(e, "unknown action 'checkpoint'", "keep, recompute, selective, offload, chain")
    text = json.dumps({"schema_version": SCHEMA_VERSION, "fingerprint": "x", "actions": {"blocks.0": "remat"}})
    with pytest.raises(PlanError) as e:
        Plan.from_json(text)
    one_line_error(e, "unknown action 'remat' for unit 'blocks.0'", "keep, recompute")


def test_one_action_per_unit(gpt) -> None:
    model, units = gpt
    with pytest.raises(PlanError) as e:
        plan_for(model, units, [Action.KEEP])
    one_line_error(e, "1 actions for 4 units", "one action per unit")


@pytest.mark.parametrize("text, words", [
    ("{not json", ("is not JSON", "export it again")),
    ('{"schema_version": 1}', ("not a checkpoint plan", "no 'actions'")),
    ('{"schema_version": 99, "fingerprint": "x", "actions": {}}', ("schema version 99", "upgrade")),
    ('{"schema_version": 1, "fingerprint": 5, "actions": {}}', ("not a valid plan", "fingerprint")),
])
def test_bad_plan_files(text: str, words: tuple[str, ...]) -> None:
    with pytest.raises(PlanError) as e:
        Plan.from_json(text, source="plan file 'p.json'")
    one_line_error(e, "plan file 'p.json'", *words)


def test_a_missing_plan_file(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as e:
        Plan.load(tmp_path / "none.json")
    one_line_error(e, "none.json' does not exist")


def test_the_codec_converts_plans_without_changing_their_digest() -> None:
    from env.data.codec import PlanCodec

    units, fp = ["blocks.0", "blocks.1", "blocks.2"], "abc123"
    codec = PlanCodec(units, ["keep", "recompute", "selective"], fp)
    idx = (1, 0, 2)
    assert codec.names(idx) == ("recompute", "keep", "selective")
    assert codec.indices(codec.names(idx)) == idx
    assert codec.digest(idx) == Plan.from_list(units, list(codec.names(idx)), fp).digest == codec.plan(idx).digest
    assert codec.digest([1, 0, 2]) == codec.digest(idx)  # lists and tuples alike
    assert codec.uniform("keep") == (0, 0, 0)
    with pytest.raises(PlanError) as e:
        codec.indices(["keep", "offload", "keep"])
    one_line_error(e, "action 'offload' is not one this run searches", "keep, recompute, selective")
    with pytest.raises(PlanError) as e:
        codec.digest((0, 1))
    one_line_error(e, "2 actions for 3 units")


# ---------------------------------------------------------------------------------------------
# Chains: 'chain' continues the region of the unit before it

UNITS4 = ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
V1_PLAN = """{"schema_version": 1, "fingerprint": "3f2a9c0d1e2b4a5f", "actions": {"blocks.0": "recompute",
  "blocks.1": "keep", "blocks.2": "selective", "blocks.3": "recompute"}}"""


def test_a_plan_file_of_version_1_loads_with_its_digest_and_json_unchanged() -> None:
    plan = Plan.from_json(V1_PLAN)
    assert plan.digest == "a15e6b401867e3f6"  # as every version before chains computed it
    assert plan.schema_version == 1 and json.loads(plan.to_json())["schema_version"] == 1
    assert Plan.from_json(plan.to_json()) == plan


def test_a_chained_plan_round_trips_as_version_2(tmp_path: Path) -> None:
    plan = Plan.from_list(UNITS4, ["recompute", "chain", "chain", "keep"], "fp")
    data = json.loads(plan.to_json())
    assert data["schema_version"] == 2 < SCHEMA_VERSION  # 3 adds chunked, 4 light
    assert data["actions"] == {"blocks.0": "recompute", "blocks.1": "chain", "blocks.2": "chain", "blocks.3": "keep"}
    again = Plan.load(plan.save(tmp_path / "chained.json"))
    assert again == plan and again.digest == plan.digest
    assert again.digest != Plan.from_list(UNITS4, ["recompute"] * 3 + ["keep"], "fp").digest
    assert plan.summary() == "chain 2, recompute 1, keep 1"


def test_a_light_plan_round_trips_as_version_4_and_older_readers_are_told_to_upgrade(tmp_path: Path) -> None:
    plan = Plan.from_list(UNITS4, ["light", "selective", "keep", "light"], "fp")
    data = json.loads(plan.to_json())
    assert data["schema_version"] == 4 < SCHEMA_VERSION
    again = Plan.load(plan.save(tmp_path / "light.json"))
    assert again == plan and again.digest == plan.digest and again.actions["blocks.0"] is Action.LIGHT
    assert Plan.from_list(UNITS4, ["recompute", "chain", "light", "keep"], "fp").schema_version == 4
    assert Plan.from_list(UNITS4, ["selective", "keep", "keep", "keep"], "fp").schema_version == 1  # as before


def test_a_block_plan_round_trips_as_version_5_and_older_readers_are_told_to_upgrade(tmp_path: Path) -> None:
    plan = Plan.from_list(UNITS4, ["block", "block", "light", "keep"], "fp")
    data = json.loads(plan.to_json())
    assert data["schema_version"] == 5 == SCHEMA_VERSION
    again = Plan.load(plan.save(tmp_path / "block.json"))
    assert again == plan and again.actions["blocks.0"] is Action.BLOCK
    data["schema_version"] = 6
    (tmp_path / "newer.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="reads versions 1, 2, 3, 4, 5; upgrade ckpt-search"):
        Plan.load(tmp_path / "newer.json")


def test_an_unknown_action_to_search_is_one_line_naming_the_actions() -> None:
    from env.data.errors import CkptSearchError
    from search.records.config import SearchConfig

    with pytest.raises(CkptSearchError) as e:
        SearchConfig(actions=["keep", "lite"]).validate()
    one_line_error(e, "--actions lite is not an action", "selective, offload, chain, chunked, light")
    assert SearchConfig(actions=["keep", "light"]).validate().actions == ["keep", "light"]
    assert "light" not in SearchConfig().actions  # searched where asked for: each profiled action costs steps


def test_regions_are_a_recompute_and_the_chains_after_it() -> None:
    from env.data.plan import regions

    assert regions(["recompute", "chain", "chain", "keep", "recompute", "recompute", "chain"]) == [(0, 3), (5, 7)]
    assert regions(["recompute", "recompute", "keep"]) == []


@pytest.mark.parametrize("actions, words", [
    (["chain", "keep", "keep", "keep"], ("unit 'blocks.0' is 'chain' but is the first unit", "recompute")),
    (["keep", "chain", "keep", "keep"], ("unit 'blocks.1' is 'chain' after 'blocks.0', which is 'keep'", "recompute")),
    (["recompute", "selective", "chain", "keep"], ("'blocks.2' is 'chain' after 'blocks.1', which is 'selective'",)),
])
def test_a_chain_that_continues_no_region_is_refused_in_one_line(actions: list[str], words: tuple[str, ...]) -> None:
    with pytest.raises(PlanError) as e:
        Plan.from_list(UNITS4, actions, "fp")
    one_line_error(e, *words)
    text = json.dumps({"schema_version": 2, "fingerprint": "fp", "actions": dict(zip(UNITS4, actions))})
    with pytest.raises(PlanError) as e:
        Plan.from_json(text, source="plan file 'p.json'")
    one_line_error(e, "plan file 'p.json'", *words)


def test_the_codec_speaks_chain() -> None:
    from env.data.codec import PlanCodec

    codec = PlanCodec(UNITS4, ["keep", "recompute", "selective", "chain"], "fp")
    idx = codec.indices(["recompute", "chain", "chain", "keep"])
    assert idx == (1, 3, 3, 0)
    assert codec.plan(idx) == Plan.from_list(UNITS4, ["recompute", "chain", "chain", "keep"], "fp")
    assert codec.digest(idx) == codec.plan(idx).digest
    with pytest.raises(PlanError) as e:
        codec.plan((0, 3, 0, 0))
    one_line_error(e, "'blocks.1' is 'chain' after 'blocks.0'")

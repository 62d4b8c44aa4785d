"""PlanSource: who proposed a plan, made and read in one place, stored as the same strings as ever."""

from __future__ import annotations

import json
import pickle

import pytest

from env.data.errors import PlanError
from env.data.measured import MeasuredPlan
from env.data.types import PlanSource, SourceKind


@pytest.mark.parametrize("text, kind, name, index", [
    ("rule:none", SourceKind.RULE, "none", None),
    ("rule:segments_2", SourceKind.RULE, "segments_2", None),
    ("agent_0", SourceKind.AGENT, "agent_0", 0),
    ("agent_12", SourceKind.AGENT, "agent_12", 12),
    ("exact", SourceKind.EXACT, "exact", None),
    ("peer:compile-budget-0.5", SourceKind.PEER, "compile-budget-0.5", None),
])
def test_each_stored_form_parses_and_formats_back_to_itself(text, kind, name, index):
    s = PlanSource(text)
    assert s == text and str(s) == text and json.dumps(s) == json.dumps(text)
    assert s.kind is kind and s.name == name
    if index is None:
        with pytest.raises(PlanError) as e:
            _ = s.index
        assert "\n" not in str(e.value) and "not an agent's" in str(e.value)
    else:
        assert s.index == index
    assert pickle.loads(pickle.dumps(s)).kind is kind  # travels to Ray actors
    assert PlanSource(s) is s


def test_the_constructors_make_the_stored_strings():
    assert PlanSource.rule("every_2") == "rule:every_2" and PlanSource.agent(3) == "agent_3"
    assert PlanSource.EXACT == "exact" and PlanSource.peer("hf-checkpointing") == "peer:hf-checkpointing"
    assert [PlanSource(str(PlanSource.agent(i))).index for i in range(3)] == [0, 1, 2]


def test_a_record_keeps_its_sources_as_strings():
    m = MeasuredPlan(workload="w", batch_shape="b", digest="d", actions=["keep"], sources=[PlanSource.rule("none")],
                     peak_bytes=1, live_before_bytes=0, step_seconds_samples=[1.0], clock="wall", device="cpu",
                     torch_version="t").proposed_by(PlanSource.agent(1))
    again = MeasuredPlan.model_validate_json(m.model_dump_json())
    assert again.sources == ["rule:none", "agent_1"]
    assert [PlanSource(s).kind for s in again.sources] == [SourceKind.RULE, SourceKind.AGENT]


@pytest.mark.parametrize("bad", ["agent", "agent_", "agent_x", "rule:", "rule:a b", "peer:", "Exact", "", "nsga2"])
def test_a_string_of_no_known_form_is_refused_in_one_line(bad):
    with pytest.raises(PlanError) as e:
        PlanSource(bad)
    msg = str(e.value)
    assert "\n" not in msg and repr(bad) in msg and "rule:<name>, agent_<i>, exact, peer:<name>" in msg

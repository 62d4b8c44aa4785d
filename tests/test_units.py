"""Decision units: found per built-in, finer on request, or named by globs; bad names fail on one line."""

from __future__ import annotations

import pytest
import torch.nn as nn

from env.data.errors import UnitError
from env.units.find import find_units
from env.workloads.workload import load_workload
from tests.test_workloads import one_line_error

EXPECTED_BLOCKS = {
    "gpt/tiny": [f"blocks.{i}" for i in range(4)],
    "cnn/tiny": [f"features.{i}" for i in range(5)],  # stem + 2 stages x 2 blocks
    "lstm/tiny": [f"layers.{i}" for i in range(3)],
    "mlp/tiny": [f"blocks.{i}" for i in range(4)],
}


@pytest.mark.parametrize("spec", sorted(EXPECTED_BLOCKS))
def test_default_units_are_the_repeated_blocks(spec: str) -> None:
    assert find_units(load_workload(spec).model) == EXPECTED_BLOCKS[spec]


def test_sub_block_units_are_the_children_with_parameters() -> None:
    units = find_units(load_workload("gpt/tiny?n_layer=2").model, granularity="sub-block")
    assert units == [f"blocks.{i}.{c}" for i in range(2) for c in ("ln_1", "attn", "ln_2", "mlp")]


def test_globs_stay_within_one_name_and_double_star_spans_depth() -> None:
    model = load_workload("gpt/tiny").model
    assert find_units(model, patterns=["blocks.*"]) == EXPECTED_BLOCKS["gpt/tiny"]
    assert find_units(model, patterns=["blocks.*.mlp"]) == [f"blocks.{i}.mlp" for i in range(4)]
    assert find_units(model, patterns=["**.attn"]) == [f"blocks.{i}.attn" for i in range(4)]
    # named out of order: returned in the model's order, once each
    assert find_units(model, patterns=["blocks.2", "blocks.0", "blocks.[02]"]) == ["blocks.0", "blocks.2"]


def test_a_pattern_matching_nothing_suggests_names_and_syntax() -> None:
    with pytest.raises(UnitError) as e:
        find_units(load_workload("gpt/tiny").model, patterns=["block.*"])
    one_line_error(e, "unit pattern 'block.*' matches no module of GPT", "'blocks.*'", "blocks.1")


def test_overlapping_units_are_refused() -> None:
    with pytest.raises(UnitError) as e:
        find_units(load_workload("gpt/tiny").model, patterns=["blocks.0", "blocks.0.attn"])
    one_line_error(e, "units overlap", "'blocks.0' contains 'blocks.0.attn'", "one level only")


def test_unknown_granularity() -> None:
    with pytest.raises(UnitError) as e:
        find_units(load_workload("mlp/tiny").model, granularity="layer")
    one_line_error(e, "unknown granularity 'layer'", "block, sub-block")


def test_a_model_without_repeated_blocks_asks_for_units() -> None:
    with pytest.raises(UnitError) as e:
        find_units(nn.Linear(3, 3))
    one_line_error(e, "Linear has no nn.ModuleList or nn.Sequential", "name the units yourself")

"""One markdown table writer (``search.records.markdown``) for the run report and BENCHMARKS.md."""

from __future__ import annotations

import pytest

from search.records.markdown import table, table_lines


def test_a_table_aligns_numbers_right_by_default_and_as_asked() -> None:
    assert table(("plan", "peak MiB"), [("keep", 1.5), ("recompute", 0.75)]) == (
        "| plan | peak MiB |\n|---|---:|\n| keep | 1.5 |\n| recompute | 0.75 |")
    assert table_lines(("a", "b", "c"), [(1, "", "x")], "rll") == ["| a | b | c |", "|---:|---|---|", "| 1 |  | x |"]


def test_an_alignment_of_another_width_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="align 'lr' gives 2 columns for a header of 3") as e:
        table(("a", "b", "c"), [], "lr")
    assert "\n" not in str(e.value)

"""How the dashboard writes numbers: readable units, one or two decimals, signed changes."""

from __future__ import annotations

import math

from dashboard import fmt
from env.data.types import MIB


def test_sizes_durations_and_changes() -> None:
    assert fmt.size(125.776 * MIB) == "125.8 MiB" and fmt.size(1.9365 * MIB) == "1.94 MiB"
    assert fmt.size(812.34 * 1024) == "0.793 MiB" and fmt.size(80 * 2**30) == "80.00 GiB"
    assert fmt.size(None) == fmt.size(math.nan) == "n/a"
    assert fmt.duration(0.01013) == "10.1 ms" and fmt.duration(0.004271) == "4.27 ms" and fmt.duration(2.345) == "2.35 s"
    assert fmt.change(0.625) == "-37.5%" and fmt.change(1.2) == "+20.0%" and fmt.change(1.0) == "±0.0%"
    assert fmt.change(1.00004) == "±0.0%" and fmt.change(math.nan) == "n/a"
    assert fmt.size_unit(3e6) == ("MiB", MIB) and fmt.size_unit(1e5) == ("MiB", MIB)
    assert [fmt.decimals_for(v) for v in (1.94, 125.7, 80_000)] == [2, 1, 0]


def test_messages_are_plain_text_and_one_line() -> None:
    from pydantic import BaseModel, ValidationError

    from dashboard.data import one_line

    assert fmt.plain("a $5 cap and $6 more, C:\\runs") == "a \\$5 cap and \\$6 more, C:\\\\runs"  # no maths rendered

    class Point(BaseModel):
        peak_bytes: int

    try:
        Point.model_validate({"peak_bytes": "lots"})
    except ValidationError as e:
        line = one_line(e)
    assert line.startswith("peak_bytes: ") and "\n" not in line and "type=" not in line  # no pydantic type dump

"""The markdown table: one writer for the run report (``search.engine.report``) and the benchmarks'
BENCHMARKS.md (``bench/views``)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A markdown table. ``align`` gives each column ``l`` (left) or ``r`` (right); by default the
    first column is left and the others right, as numbers read best. A cell is shown with ``str``."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"align {align!r} gives {len(align)} columns for a header of {len(header)}; give one "
                         "letter (l or r) per column")
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def table_lines(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> list[str]:
    """``table``'s lines, for a document built as a list of lines."""
    return table(header, rows, align).split("\n")

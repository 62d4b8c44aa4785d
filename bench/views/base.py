"""What a result's view is, and the pieces every view uses: the markdown table (the library's,
``search.records.markdown``), the clock line, units.

A ``View`` renders one result file (``bench/results/<name>.json``) everywhere it is shown: its
section of BENCHMARKS.md (intro, summary bullets, tables), the rows it gives the README's
headline table (``headlines``), and what its script prints when it finishes. No torch here: the
report and the README test read results on any machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from env.data.types import MIB
from search.records.markdown import table  # noqa: F401 - the views' table writer, the library's

Result = dict[str, Any]

# CPU step times measured before this were taken without flushing denormal floats
# (env.measure.measurement.steady_numerics); docs/measurement.md, "Benchmark history", says what that did.
DENORMALS_FLUSHED_SINCE = "2026-12-01 04:31:00"


@dataclass(frozen=True)
class Headline:
    """One row of the README's table: what was measured, the number, how it was timed."""

    what: str
    figure: str  # the number, with its spread or range where the result has one
    measured: str  # the clock and the machine's load it was taken under


@dataclass(frozen=True)
class View:
    """How one result is shown: its BENCHMARKS.md section and its README headline rows."""

    name: str  # the result file's stem
    title: str  # the BENCHMARKS.md section heading
    intro: str  # what the section shows and how it was measured
    command: str  # what writes the result
    table: Callable[[Result], str]  # the section's body: tables and notes in markdown
    summary: Callable[[Result], list[str]] | None = None  # the section's short findings, one line each
    headlines: Callable[[Result], list[Headline]] | None = None  # its rows in the README's table

    def body(self, result: Result) -> str:
        """The section's body: the summary bullets, then the tables (what the script prints too)."""
        bullets = [f"- {line}" for line in self.summary(result)] if self.summary else []
        return "\n".join([*bullets, *([""] if bullets else []), self.table(result).rstrip()])

    @property
    def anchor(self) -> str:
        """The section's link target in BENCHMARKS.md (GitHub's heading slug)."""
        return re.sub(r"[^\w\- ]", "", self.title.lower()).replace(" ", "-")


def mib(n_bytes: float) -> float:
    """Bytes in MiB (2**20 bytes), the unit every memory figure is shown in."""
    return n_bytes / MIB


def timed_before_flushing(result: Result) -> bool:
    """True for a CPU result whose step times were measured before denormals were flushed."""
    device = str(result.get("machine", {}).get("device", "cpu"))
    return device.startswith("cpu") and str(result.get("written_at", "")) < DENORMALS_FLUSHED_SINCE


def load_of(result: Result) -> float | None:
    """The 1-minute load average the result's machine line recorded."""
    m = result.get("machine") or {}
    load = m.get("load_average_1_5_15") or [m.get("load_average_1m")]
    return load[0]


def measured(result: Result, clock: str | None = None, load: float | None = None, timed: bool = True) -> str:
    """The clock and load a figure was taken under, for a headline row (``load``: one recorded apart
    from the machine line, as per-row loads are; ``timed``: False for a figure of memory alone,
    which the denormals did not touch)."""
    load = load_of(result) if load is None else load
    words = [clock or result.get("clock") or "", f"load {load:.1f}" if isinstance(load, (int, float)) else ""]
    if timed and timed_before_flushing(result):
        words.append("before denormals were flushed")
    return ", ".join(w for w in words if w)


def span(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """``lo to hi`` of ``values`` (one value when they are all equal)."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo} to {hi}"

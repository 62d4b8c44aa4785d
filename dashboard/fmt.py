"""How the dashboard writes numbers: sizes in MiB (GiB where large), times in ms or s, changes as percents.

One or two decimals everywhere: a step time is noisy to a few percent (docs/measurement.md),
and a peak read to the byte says nothing a reader can use beyond three significant digits.
"""

from __future__ import annotations

import math

from env.data.types import MIB

GIB = 1024 * MIB


def _missing(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def size(nbytes: float | None) -> str:
    """One unit family, about three significant digits: ``0.793 MiB``, ``1.94 MiB``, ``125.8 MiB``, ``3.21 GiB``
    (n/a when unknown)."""
    if _missing(nbytes):
        return "n/a"
    b = float(nbytes)  # type: ignore[arg-type]
    if abs(b) < MIB:
        return f"{b / MIB:.3f} MiB"
    if abs(b) < GIB:
        return f"{b / MIB:.2f} MiB" if abs(b) < 10 * MIB else f"{b / MIB:.1f} MiB"
    return f"{b / GIB:.2f} GiB"


def size_unit(largest_bytes: float) -> tuple[str, float]:
    """(name, bytes per unit) to show a column of sizes whose largest is ``largest_bytes``: MiB, GiB where large."""
    return ("MiB", float(MIB)) if largest_bytes < GIB else ("GiB", float(GIB))


def duration(seconds: float | None) -> str:
    """``4.27 ms``, ``13.4 ms``, ``2.35 s`` (n/a when unknown)."""
    if _missing(seconds):
        return "n/a"
    s = float(seconds)  # type: ignore[arg-type]
    if abs(s) >= 1.0:
        return f"{s:.2f} s"
    return f"{s * 1e3:.2f} ms" if abs(s) < 0.01 else f"{s * 1e3:.1f} ms"


def change(ratio: float | None) -> str:
    """A ratio to the baseline as a signed change: 0.625 -> ``-37.5%``, 1.2 -> ``+20.0%``, 1.0 -> ``±0.0%``."""
    if _missing(ratio):
        return "n/a"
    pct = (float(ratio) - 1) * 100  # type: ignore[arg-type]
    return "±0.0%" if round(pct, 1) == 0 else f"{pct:+.1f}%"


def decimals_for(largest: float) -> int:
    """Decimals that give a value up to ``largest`` about three significant digits (0 to 2)."""
    return 2 if largest < 10 else (1 if largest < 1000 else 0)


def plain(text: str) -> str:
    """Text shown as it is in Streamlit's markdown: a ``$`` is a dollar sign, never the start of maths."""
    return text.replace("\\", "\\\\").replace("$", "\\$")

"""Which plan the dashboard shows: chosen by a memory budget, a click on the chart or a list.

The selected plan's digest lives in ``st.session_state[SELECTED]``; the three controls write
it through the callbacks here, so the last one the user touched wins. Pure helpers (no
Streamlit) come first so tests can call them directly.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import plotly.graph_objects as go

from dashboard.data import RunData, select_plan
from env.data.types import MIB

SELECTED = "selected_digest"
BUDGET = "budget_mib"
CHART = "frontier_chart"
CLICK_SEEN = "click_seen"
PICK = "plan_pick"
RUN = "shown_run"


def digest_from_selection(points: Sequence[Mapping[str, Any]], fig: go.Figure) -> str | None:
    """The plan digest of the first selected point (its customdata, or looked up in the figure)."""
    for p in points:
        custom = p.get("customdata")
        if isinstance(custom, (list, tuple)) and custom:
            custom = custom[0]
        if isinstance(custom, str) and custom:
            return custom
        curve, index = p.get("curve_number"), p.get("point_index", p.get("point_number"))
        if curve is not None and index is not None and curve < len(fig.data):
            data = fig.data[curve].customdata
            if data is not None and index < len(data):
                return str(data[index])
    return None


def budget_range(run: RunData) -> tuple[float, float]:
    """(lowest, highest) memory budget in MiB the slider offers: the frontier's span up to the baseline."""
    low = float(run.frontier.peak_bytes.min()) / MIB
    high = max(float(run.frontier.peak_bytes.max()), run.baseline_peak_bytes) / MIB
    return low, high if high > low else low * 1.01


def budget_step(low: float, high: float) -> float:
    """A slider step giving about 200 positions, rounded to a readable value."""
    raw = (high - low) / 200
    for step in (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0):
        if step >= raw:
            return step
    return 10.0


def digest_under_budget(run: RunData, budget_mib: float) -> str | None:
    row = select_plan(run.frontier, budget_mib * MIB + 0.5)
    return None if row is None else str(row.digest)


def reset_for(state: Any, run: RunData) -> None:
    """A newly shown run starts with the fastest plan under the baseline's memory."""
    if state.get(RUN) == (run.run_id, len(run.frontier)) and state.get(SELECTED) in set(run.evaluations.digest):
        return
    low, high = budget_range(run)
    state[RUN] = (run.run_id, len(run.frontier))
    state[BUDGET] = high
    state[SELECTED] = digest_under_budget(run, high)
    state[CLICK_SEEN] = None

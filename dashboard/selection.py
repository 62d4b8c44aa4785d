"""Which plan the dashboard shows: one selection, shared by the budget slider, the chart and the list.

The selected plan's digest lives in ``state[SELECTED]``, the budget in ``state[BUDGET]`` (MiB)
and how the plan was chosen in ``state[HOW]``. Each control writes all three through the
callbacks here, before the page is drawn, so the last control touched wins and the others
follow: a budget selects the fastest frontier plan within it; a click on the chart or a pick
from the list selects that plan and moves the budget to its peak.

A run opens on the fastest frontier plan that saves at least half of the most any frontier
plan saves (``START_SHARE``): a useful trade-off on every model, where the all-keep plan
(the fastest) would show nothing, and the lowest plan is usually the slowest.
Pure functions (no Streamlit) first, so tests call them directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, MutableMapping, Sequence

import plotly.graph_objects as go

from dashboard import fmt
from dashboard.data import RunData, select_plan
from env.data.types import MIB

SELECTED = "selected_digest"
BUDGET = "budget_mib"
CHART = "frontier_chart"
PICK = "plan_pick"
RUN = "shown_run"
HOW = "selected_how"  # start | budget | chart | list
NO_PLAN = "chart_no_plan"  # set when a click on the chart hit only points without a plan (peers)

START_SHARE = 0.5  # the first view: the fastest plan saving at least this share of the largest saving


def digests_from_selection(points: Sequence[Mapping[str, Any]], fig: go.Figure | None = None) -> list[str]:
    """The plan digests of selected chart points (their customdata, or looked up in the figure), in order."""
    found: list[str] = []
    for p in points:
        custom = p.get("customdata")
        if isinstance(custom, (list, tuple)) and custom:
            custom = custom[0]
        if not (isinstance(custom, str) and custom) and fig is not None:
            curve, index = p.get("curve_number"), p.get("point_index", p.get("point_number"))
            data = fig.data[curve].customdata if curve is not None and curve < len(fig.data) else None
            custom = str(data[index]) if data is not None and index is not None and index < len(data) else None
        if isinstance(custom, str) and custom and custom not in found:
            found.append(custom)
    return found


def digest_from_selection(points: Sequence[Mapping[str, Any]], fig: go.Figure | None = None) -> str | None:
    """The first selected point's plan digest (None: the points carry no plan, e.g. peers)."""
    found = digests_from_selection(points, fig)
    return found[0] if found else None


def fastest_of(run: RunData, digests: Sequence[str]) -> str | None:
    """Of several selected plans (a box selection), the fastest measured one; fewer bytes breaks ties."""
    ev = run.evaluations
    rows = ev.loc[ev.digest.isin(list(digests)) & ev.measured].sort_values(["step_seconds", "peak_bytes"])
    return None if rows.empty else str(rows.iloc[0].digest)


def budget_step(low: float, high: float, decimals: int = 4) -> float:
    """A slider step giving about 200 positions, rounded to a readable value no finer than ``decimals``."""
    raw = max((high - low) / 200, 10.0 ** -decimals)
    for step in (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0):
        if step >= raw - 1e-12:
            return step
    return 10.0


@dataclass(frozen=True)
class BudgetSlider:
    """The budget slider's range and stops, in MiB: the frontier's smallest peak up to the baseline's,
    with about three significant digits. The top is rounded up to a whole number of steps: a slider
    stops only at ``low + k * step``, and its last stop must still hold the baseline."""

    low: float
    high: float
    step: float
    decimals: int

    @classmethod
    def of(cls, run: RunData) -> "BudgetSlider":
        low = float(run.frontier.peak_bytes.min()) / MIB
        high = max(float(run.frontier.peak_bytes.max()), run.baseline_peak_bytes) / MIB
        high = high if high > low else low * 1.01
        decimals = fmt.decimals_for(high)
        step = budget_step(low, high, decimals)
        return cls(low, low + math.ceil((high - low) / step - 1e-9) * step, step, decimals)


def budget_range(run: RunData) -> tuple[float, float]:
    """(lowest, highest) memory budget in MiB the slider offers."""
    slider = BudgetSlider.of(run)
    return slider.low, slider.high


def digest_under_budget(run: RunData, budget_mib: float) -> str | None:
    row = select_plan(run.frontier, budget_mib * MIB + 0.5)
    return None if row is None else str(row.digest)


def start_plan(run: RunData) -> str | None:
    """The plan a run opens on: the fastest frontier plan saving at least ``START_SHARE`` of the
    largest saving any frontier plan reaches (the fastest plan when none saves anything)."""
    if run.frontier.empty:
        return None
    most = 1 - float(run.frontier.peak_bytes.min()) / run.baseline_peak_bytes
    target = run.baseline_peak_bytes * (1 - START_SHARE * most) if most > 0 else float(run.frontier.peak_bytes.max())
    row = select_plan(run.frontier, target + 0.5)
    return str(row.digest) if row is not None else str(run.frontier.iloc[0].digest)


def peak_mib(run: RunData, digest: str) -> float:
    """A plan's measured peak in MiB, clamped into the slider's range."""
    low, high = budget_range(run)
    peak = float(run.evaluations.loc[run.evaluations.digest == digest, "peak_bytes"].iloc[0]) / MIB
    return min(max(peak, low), high)


def select(state: MutableMapping[str, Any], run: RunData, digest: str | None, how: str) -> None:
    """Make ``digest`` the selection; the budget follows it to its peak."""
    if digest is None or not (run.evaluations.digest == digest).any():
        return
    state[SELECTED], state[HOW] = digest, how
    state[BUDGET] = peak_mib(run, digest)


def reset_for(state: MutableMapping[str, Any], run: RunData) -> None:
    """A newly shown run (or one whose frontier just appeared) opens on ``start_plan``; while the user
    has not chosen, a growing frontier moves the start with it; a chosen plan stays selected."""
    if run.frontier.empty:
        state[RUN], state[SELECTED], state[HOW] = run.run_id, None, "start"
        return
    low, high = budget_range(run)
    if state.get(RUN) == run.run_id and state.get(HOW) not in (None, "start"):  # the user chose
        state[BUDGET] = min(max(float(state.get(BUDGET, high)), low), high)
        return
    state[RUN] = run.run_id
    select(state, run, start_plan(run), "start")


def on_budget(state: MutableMapping[str, Any], run: RunData) -> None:
    """The slider moved: the fastest frontier plan within the budget (None: no plan fits)."""
    state[SELECTED], state[HOW] = digest_under_budget(run, float(state[BUDGET])), "budget"


def on_chart(state: MutableMapping[str, Any], run: RunData) -> None:
    """Points clicked or boxed on the chart: the fastest plan among them (peers carry no plan)."""
    event = state.get(CHART) or {}
    points = list((event.get("selection") or {}).get("points") or [])
    digest = fastest_of(run, digests_from_selection(points))
    state[NO_PLAN] = bool(points) and digest is None
    select(state, run, digest, "chart")


def on_pick(state: MutableMapping[str, Any], run: RunData) -> None:
    """A plan picked from the list."""
    select(state, run, state.get(PICK), "list")


def from_url(state: MutableMapping[str, Any], run: RunData, plan: str | None, budget: str | None) -> None:
    """A shared link's selection: its plan when the run has it, else its budget (MiB); else nothing changes."""
    if plan and (run.evaluations.digest == plan).any():
        select(state, run, plan, "list")
        return
    try:
        mib = float(budget) if budget else math.nan
    except ValueError:
        return
    if not math.isnan(mib) and not run.frontier.empty:
        low, high = budget_range(run)
        state[BUDGET] = min(max(mib, low), high)
        on_budget(state, run)


def to_url(state: Mapping[str, Any], params: MutableMapping[str, Any]) -> None:
    """Write the selection into the URL's query parameters (``plan`` and ``budget``), so the view can be shared."""
    if state.get(SELECTED):
        params["plan"] = str(state[SELECTED])
    elif "plan" in params:
        del params["plan"]
    if state.get(BUDGET) is not None:
        params["budget"] = f"{float(state[BUDGET]):.6g}"

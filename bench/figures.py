"""The figures of BENCHMARKS.md (``bench/plots/*.png``), one function per result that has them.

Each figure carries a caption naming the machine and device its numbers were measured on and the
result file they come from. ``FIGURES`` maps a result's name to its function (result, folder) ->
the PNG file names written.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bench.common import Result, machine_label  # noqa: E402
from bench.views.base import mib  # noqa: E402
from bench.views.peers import COMPILE_BUDGET_PEER, budget_peaks, compile_budgets  # noqa: E402

METHOD_COLORS = {"agents (search run)": "tab:blue", "agents' own plans": "tab:cyan", "random": "tab:orange",
                 "NSGA-II": "tab:green", "rules": "tab:red", "exact (measured)": "black"}


def caption(fig: Figure, result: Result, name: str) -> None:
    """The machine line every figure carries."""
    machine = result.get("machine")
    where = f"Measured on {machine_label(machine)}" if machine else "Machine not recorded"
    text = f"{where}; bench/results/{name}.json"
    width = int(fig.get_figwidth() * 17)  # characters of 6-point text per line
    fig.text(0.01, 0.005, textwrap.fill(text, width), fontsize=6, color="0.35", ha="left", va="bottom")


def save(fig: Figure, plots: Path, stem: str) -> str:
    plots.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(plots / f"{stem}.png", dpi=110)
    plt.close(fig)
    return f"{stem}.png"


def _grid(n: int, width: float = 4.2, height: float = 3.4) -> tuple[Figure, list[Any]]:
    cols = min(n, 2) if n > 1 else 1
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


# ---------------------------------------------------------------------------------------------
# Figures, one function per result

def fig_search_quality(r: Result, plots: Path) -> list[str]:
    wl = r["workloads"]
    fig, axes = _grid(len(wl))
    for ax, w in zip(axes, wl):
        for name, m in w["methods"].items():
            if name == "agents' own plans" or not m["frontier"]:
                continue
            pts = sorted((p["peak_ratio"], p["time_ratio"]) for p in m["frontier"])
            ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", marker="o", ms=3,
                    lw=2 if name.startswith("exact") else 1.2, color=METHOD_COLORS.get(name),
                    label=f"{name} ({m['hypervolume']:.3f})")
        ax.set(title=f"{w['label']}: {w['workload']}", xlabel="peak / baseline", ylabel="step time / baseline")
        ax.legend(fontsize=6)
    caption(fig, r, "search_quality")
    names = [save(fig, plots, "search_quality_frontiers")]
    fig, axes = _grid(len(wl))
    for ax, w in zip(axes, wl):
        exact = w["methods"]["exact (measured)"]["hypervolume"]
        for name, m in w["methods"].items():
            if name in ("rules", "exact (measured)") or not m["hypervolume_curve"]:
                continue
            ax.plot(range(1, len(m["hypervolume_curve"]) + 1), m["hypervolume_curve"], label=name,
                    color=METHOD_COLORS.get(name))
        ax.axhline(0.99 * exact, color="black", ls="--", lw=1, label="99% of exact (measured)")
        ax.set(title=w["label"], xlabel="measured evaluations", ylabel="hypervolume")
        ax.legend(fontsize=6)
    caption(fig, r, "search_quality")
    return names + [save(fig, plots, "search_quality_curves")]


def fig_premium(r: Result, plots: Path, name: str = "premium") -> list[str]:
    wl = r["workloads"]
    fig, axes = _grid(len(wl))
    for ax, w in zip(axes, wl):
        front, kind = w.get("searched_frontier_selection", w.get("searched_frontier")), w["saving"] + "_saving"
        ax.plot([100 * p[kind] for p in front], [100 * p["slowdown"] for p in front], "o",
                color="0.6", ms=4, label="searched (exact frontier, measured)")
        for rule, p in w["rules"].items():
            if rule != "none":
                ax.plot(100 * p[kind], 100 * p["slowdown"], "x", color="tab:red", ms=4)
        ax.plot([], [], "x", color="tab:red", label="rules")
        for (claim, c), color in zip(w["cited"].items(), ("tab:blue", "tab:green")):
            if kind != "activation_saving":
                break  # the cited ranges are of activation memory
            (x0, x1), (y0, y1) = c["cited_saving_pct"], c["cited_slowdown_pct"]
            ax.add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, alpha=0.3, color=color, label=f"cited: {claim}"))
        for key, t in w["targets"].items():
            if t["reachable"]:
                p = t["searched"]
                ax.plot(100 * p[kind], 100 * p["slowdown"], "*", ms=10, label=f"searched >= {key}")
        what = "peak memory" if kind == "peak_saving" else "activation memory"
        ax.set_title(f"{w['architecture']}\n{w['workload']}", fontsize=8)
        ax.set(xlabel=f"{what} saved (%)",
               ylabel="step time added (%)")
        ax.legend(fontsize=6)
    caption(fig, r, name)
    return [save(fig, plots, name)]


def fig_search_cost(r: Result, plots: Path) -> list[str]:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for n_actions in sorted({row["n_actions"] for row in r["scaling"]}):
        rows = [row for row in r["scaling"] if row["n_actions"] == n_actions]
        solved = [row for row in rows if "exact_seconds" in row]
        label = f"{n_actions} actions"
        a1.plot([x["n_units"] for x in solved], [x["exact_seconds"] for x in solved], "o-", label=label)
        a2.plot([x["n_units"] for x in rows], [x["env_steps_per_second"] for x in rows], "o-", label=label)
    a1.set(xscale="log", yscale="log", xlabel="decision units", ylabel="exact solve (s)", title="exact solver")
    a2.set(xscale="log", xlabel="decision units", ylabel="env steps / s (model mode)", title="environment")
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    caption(fig, r, "search_cost")
    return [save(fig, plots, "search_cost_scaling")]


def fig_measured_table(r: Result, plots: Path) -> list[str]:
    rows = [x for x in r["rows"] if x["plan"] != "none"]
    labels = [f"{x['workload']}\n{x['plan']}" for x in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(rows)), 3.8))
    xs = range(len(rows))
    ax.bar([i - 0.2 for i in xs], [x["activation_saving_pct"] for x in rows], 0.4, label="activation memory saved (%)")
    ax.bar([i + 0.2 for i in xs], [x["slowdown_pct"] for x in rows], 0.4, label="step time added (%)")
    ax.set_xticks(list(xs), labels, fontsize=6, rotation=60, ha="right")
    ax.legend(fontsize=7)
    caption(fig, r, "measured_table")
    return [save(fig, plots, "measured_table")]


def fig_fidelity(r: Result, plots: Path, name: str = "fidelity") -> list[str]:
    wl = r["workloads"]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(wl)), 3.6))
    xs = range(len(wl))
    for k, (key, lab) in enumerate([("peak_median_abs_error", "peak, median"), ("peak_max_abs_error", "peak, max"),
                                    ("time_median_abs_error", "time, median"), ("time_max_abs_error", "time, max")]):
        ax.bar([i + 0.2 * (k - 1.5) for i in xs], [100 * w[key] for w in wl], 0.2, label=lab)
    ax.set_xticks(list(xs), [w["workload"] for w in wl], fontsize=7)
    ax.set(ylabel="|predicted - measured| / measured (%)", title="cost model against measure()")
    ax.legend(fontsize=7)
    caption(fig, r, name)
    return [save(fig, plots, name)]


def fig_frontier_table(r: Result, plots: Path) -> list[str]:
    wl = r["workloads"]
    fig, axes = _grid(len(wl))
    for ax, w in zip(axes, wl):
        pts = [(p["peak_ratio"], p["time_ratio"]) for p in w["frontier"]]
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", marker="o", ms=3, color="black", label="exact")
        rules = [(x["peak_ratio"], x["time_ratio"]) for n, x in w["rules"].items() if not n.startswith("random")]
        ax.plot([p[0] for p in rules], [p[1] for p in rules], "x", color="tab:red", label="rules")
        ax.set(title=f"{w['workload']} (cost model)", xlabel="peak / baseline", ylabel="step time / baseline")
        ax.legend(fontsize=7)
    machine = r.get("machine", {})
    caption(fig, {"machine": machine}, "frontier_table")
    return [save(fig, plots, "frontier_table")]


def _searched_peers(w: Result) -> list[Result]:
    """A workload's peers as the search measured them (name, peak, step time): the figure shows those."""
    return [{"peer": p["peer"], **p["measured"]} for p in w["peers"] if p.get("measured")]


def fig_peers(r: Result, plots: Path, name: str = "peers") -> list[str]:
    """Per workload: our measured frontier, and torch.compile's peak and time against its memory budget."""
    wl = r["workloads"]
    fig, axes = _grid(len(wl))
    for ax, w in zip(axes, wl):
        b = w["baseline"]
        front = [(p["peak_bytes"] / b["peak_bytes"], p["step_seconds"] / b["step_seconds"]) for p in w["frontier"]]
        ax.step([x for x, _ in front], [y for _, y in front], where="post", marker="o", ms=3, color="black",
                label="searched frontier")
        searched = _searched_peers(w)
        budgets = compile_budgets(searched)
        xs = [p["peak_bytes"] / b["peak_bytes"] for _, p in budgets]
        ys = [p["step_seconds"] / b["step_seconds"] for _, p in budgets]
        ax.plot(xs, ys, "s-", color="tab:purple", ms=4, lw=0.8, label="compile budget (label: budget)")
        for (budget, _), x, y in zip(budgets, xs, ys):
            ax.annotate(f"{budget:.1f}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
        others = [p for p in searched if not p["peer"].startswith(COMPILE_BUDGET_PEER) and not p.get("oom")]
        ax.plot([p["peak_bytes"] / b["peak_bytes"] for p in others], [p["step_seconds"] / b["step_seconds"] for p in others],
                "x", color="tab:red", label="the other peers")
        ax.set(title=f"{w['workload']} ({'compiled' if w['compiled'] else 'eager'})", xlabel="peak / baseline",
               ylabel="step time / baseline")
        ax.legend(fontsize=6)
    caption(fig, r, name)
    saved = [save(fig, plots, name)]
    fig, axes = _grid(1, width=5.0)
    for w in wl:
        peaks = budget_peaks(_searched_peers(w))
        if peaks:
            axes[0].plot([b for b, _ in peaks], [m / mib(w["baseline"]["peak_bytes"]) for _, m in peaks], "o-",
                         ms=3, label=w["workload"])
    axes[0].set(title="torch.compile: peak against its memory budget", xlabel="budget",
                ylabel="peak / the run's baseline peak")
    axes[0].legend(fontsize=6)
    caption(fig, r, name)
    return saved + [save(fig, plots, f"{name}_budget_peak")]


Figures = Callable[[Result, Path], list[str]]
FIGURES: dict[str, Figures] = {
    "peers": fig_peers,
    "peers_compiled": lambda r, p: fig_peers(r, p, "peers_compiled"),
    "search_quality": fig_search_quality,
    "premium": fig_premium,
    "search_cost": fig_search_cost,
    "frontier_table": fig_frontier_table,
    "measured_table": fig_measured_table,
    "fidelity": fig_fidelity,
    "gpu_fidelity": lambda r, p: fig_fidelity(r, p, "gpu_fidelity"),
    "gpu_premium": lambda r, p: fig_premium(r, p, "gpu_premium"),
}

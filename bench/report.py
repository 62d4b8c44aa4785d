"""BENCHMARKS.md and bench/plots/*.png, generated from every bench/results/*.json.

    python bench/report.py                     # rewrites BENCHMARKS.md and the plots
    python bench/report.py --results DIR --out OUT.md --plots DIR

Each section's table comes from its bench script's own ``markdown()`` (one formatter per
result), each figure names the machine and device its numbers were measured on, and a result
that is missing is listed with the command that produces it. The GPU section ("On a GPU") is
there only when ``bench/gpu.py`` has written ``gpu_*.json`` results. Never edit BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PLOTS_DIR, RESULTS_DIR, ROOT, machine_label, read_results  # noqa: E402
from bench.readme_numbers import (  # noqa: E402
    COMPILE_BUDGET_PEER,
    budget_peaks,
    compile_budgets,
    timed_before_flushing,
    update_readme,
)
from search.engine.report import peers_markdown  # noqa: E402

Result = dict[str, Any]
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


def fig_peers(r: Result, plots: Path, name: str = "peers") -> list[str]:
    """Per workload: our measured frontier, and torch.compile's peak and time against its memory budget."""
    wl = r["workloads"]
    fig, axes = _grid(len(wl))
    for ax, w in zip(axes, wl):
        b = w["baseline"]
        front = [(p["peak_bytes"] / b["peak_bytes"], p["step_seconds"] / b["step_seconds"]) for p in w["frontier"]]
        ax.step([x for x, _ in front], [y for _, y in front], where="post", marker="o", ms=3, color="black",
                label="searched frontier")
        budgets = compile_budgets(w["peers"])
        xs = [p["peak_bytes"] / b["peak_bytes"] for _, p in budgets]
        ys = [p["step_seconds"] / b["step_seconds"] for _, p in budgets]
        ax.plot(xs, ys, "s-", color="tab:purple", ms=4, lw=0.8, label="compile budget (label: budget)")
        for (budget, _), x, y in zip(budgets, xs, ys):
            ax.annotate(f"{budget:.1f}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
        others = [p for p in w["peers"] if not p["peer"].startswith(COMPILE_BUDGET_PEER) and not p["oom"]]
        ax.plot([p["peak_bytes"] / b["peak_bytes"] for p in others], [p["step_seconds"] / b["step_seconds"] for p in others],
                "x", color="tab:red", label="HF / checkpoint_sequential")
        ax.set(title=f"{w['workload']} ({'compiled' if w['compiled'] else 'eager'})", xlabel="peak / baseline",
               ylabel="step time / baseline")
        ax.legend(fontsize=6)
    caption(fig, r, name)
    saved = [save(fig, plots, name)]
    fig, axes = _grid(1, width=5.0)
    for w in wl:
        peaks = budget_peaks(w["peers"])
        if peaks:
            axes[0].plot([b for b, _ in peaks], [m / (w["baseline"]["peak_bytes"] / 2**20) for _, m in peaks], "o-",
                         ms=3, label=w["workload"])
    axes[0].set(title="torch.compile: peak against its memory budget", xlabel="budget",
                ylabel="peak / the run's baseline peak")
    axes[0].legend(fontsize=6)
    caption(fig, r, name)
    return saved + [save(fig, plots, f"{name}_budget_peak")]


# ---------------------------------------------------------------------------------------------
# Sections: result name -> title, what it shows, its table, its figures, the command behind it

def _table(module: str, key: str | None) -> Callable[[Result], str]:
    """The bench script's own ``markdown()`` on the result (or on ``result[key]``)."""
    def render(r: Result) -> str:
        import importlib

        md = importlib.import_module(f"bench.{module}").markdown
        return md(r[key] if key else r)
    return render


def _env_speed(r: Result) -> str:
    return (f"| workload | units x actions | env steps/s | with action masks |\n|---|---|---:|---:|\n"
            f"| {r['workload']} | {r['n_units']} x {r['n_actions']} | {r['steps_per_second']} "
            f"| {r['steps_per_second_with_masks']} |\n")


def _default_run(r: Result) -> str:
    b = r["baseline"]
    out = [f"`{r['command']}` on `{r['workload']}` ({r['units']} units): {r['wall_seconds']:.0f} s by the wall clock, "
           f"{r['evaluations']} plans evaluated, {r['measured']} measured; step times by the {r['clock']} clock. "
           f"{r.get('measurement_mode', '')}.", "",
           "| peak MiB | saving | step ms | slowdown | found by |", "|---:|---:|---:|---:|---|"]
    for p in r["frontier"]:
        out.append(f"| {p['peak_bytes'] / 2**20:.1f} | {1 - p['peak_bytes'] / b['peak_bytes']:.0%} | "
                   f"{p['step_seconds'] * 1e3:.1f} | {p['step_seconds'] / b['step_seconds'] - 1:+.0%} | "
                   f"{', '.join(p['found_by'])} |")
    if r.get("peers"):
        out += ["", *peers_markdown(r["peers"])]
    return "\n".join(out) + "\n"


def _agents_scale(r: Result) -> str:
    out = ["| profile | units | reference | HV / reference | cloning only | step time at 20 budgets vs reference "
           "(mean / max) | rules beyond | training s |", "|---|---:|---|---:|---:|---|---|---:|"]
    for x in r["rows"]:
        beyond = ", ".join(x["rules_beyond"]) if x.get("rules_beyond") else "none"
        out.append(f"| {x['profile']} | {x['n_units']} | {x['reference']}, {x['reference_points']} points | "
                   f"{x['hv_ratio']:.4f} | {x['clone_only_hv_ratio']:.4f} | {x['coverage_mean']:.5f} / "
                   f"{x['coverage_max']:.4f} | {beyond} | {x['train_seconds']:.1f} |")
    return "\n".join(out) + "\n"


def _evaluator_pool(r: Result) -> str:
    out = ["| round | Evaluators | plans | wall s | measurements/min | per Evaluator | load |",
           "|---:|---:|---:|---:|---:|---|---:|"]
    for row in r["rounds"]:
        out.append(f"| {row['round']} | {row['evaluators']} | {row['plans']} | {row['wall_seconds']:.1f} | "
                   f"{row['measurements_per_minute']:.1f} | {', '.join(f'{v}' for v in row['per_evaluator'].values())} | "
                   f"{row['load_average_1']:.1f} |")
    med = r["measurements_per_minute_median"]
    out += ["", f"Median: {med['1']:.1f} measurements/min with one Evaluator, {med['2']:.1f} with two "
                f"({r['speedup_2_over_1']:.2f}x)."]
    if r.get("plain_processes"):
        plain = r["plain_measurements_per_minute_median"]
        out += ["", "The ceiling: the same plans in plain processes (no Ray, no queue), started together.", "",
                "| round | processes | wall s | measurements/min | s a measurement | of it timed steps | load |",
                "|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {p['round']} | {p['processes']} | {p['wall_seconds']:.1f} | {p['measurements_per_minute']:.1f} | "
                f"{p['mean_measurement_seconds']:.3f} | {p['mean_timed_step_seconds']:.3f} | {p['load_average_1']:.1f} |"
                for p in r["plain_processes"]]
        out += ["", f"Median: {plain['1']:.1f} and {plain['2']:.1f} measurements/min "
                    f"({r['plain_speedup_2_over_1']:.2f}x); the pool with two Evaluators reaches "
                    f"{r['pool_over_plain_with_2']:.2f} of two plain processes."]
    for s in r.get("default_search", []):
        out.append(f"Default search with `--evaluators {s['evaluators']}`: {s['wall_seconds']:.0f} s ({s['summary']}).")
    return "\n".join(out) + "\n"


SECTIONS: list[tuple[str, str, str, Callable[[Result], str], Callable[..., list[str]] | None, str]] = [
    ("default_run", "The default run", "The README's first command, defaults only, with the peers it measures "
     "beside the search.", _default_run, None, "python bench/default_run.py"),
    ("peers", "Side by side with what users pick instead", "Peers measured by the search's own Evaluator in the "
     "same run as the searched plans (eager steps); against each, our fastest frontier plan at no more memory, "
     "chosen on the search's measurements. The table quotes fresh measurements: one Evaluator apart from the "
     "search times the baseline, every peer and every chosen plan of ours alike, in interleaved rounds (spread: "
     "max - min of a plan's samples; a ratio whose difference is within the two spreads says so). The figure "
     "shows the search's own measurements. Compile budgets below 1.0 on models with dropout do not keep the "
     "gradients in torch 2.13 (the note says so).",
     _table("peers", None), fig_peers, "python bench/peers.py"),
    ("peers_compiled", "Peers, compiled training", "As above with `--compile`: every plan applied, then the model "
     "compiled; compile time is reported apart.", _table("peers", None),
     lambda r, p: fig_peers(r, p, "peers_compiled"), "python bench/peers.py --compile"),
    ("agents_search", "The agents in the real search", "Each row one `python -m search.run` (hybrid reward, 4 "
     "agents, mostly `--no-warm-start`: every plan the agents measure is their own find; the search ranks plans on "
     "times paired with the all-keep step measured beside them, never faster than the baseline), then a quote apart from "
     "the search: the agents' own frontier, as many exact-solver plans (profiled cost model), the rules and "
     "recompute-every-expert-unit, each remeasured alike in interleaved rounds, and the exact plans once more as "
     "a control. Agents' frontier hypervolume over the exact plans', the rules no agent plan dominates (with how "
     "much slower the agents' fastest plan at no more memory is), the fastest fitting plans at 20 budgets, and "
     "the agents' fastest plan at the expert plan's memory against it. The quote's noise is the control's: how "
     "far apart the two quotes of the same exact plan lie (95th percentile); a difference within it is one the "
     "quote cannot tell from measurement alone. A rule the quote puts beyond that band is measured again beside "
     "the agents' plan it was compared with, in a second quote of as many rounds; it counts as beyond only where "
     "both quotes say so (rows quoted before the second quote existed show the first's verdict).",
     _table("agents_search", None),
     None, "python bench/agents_search.py"),
    ("agents_scale", "Agents at 6 to 96 units (cost model)", "Budget-conditioned agents cloned from the exact solver, "
     "then PPO, against the exact frontier on the cost model.", _agents_scale, None,
     "python bench/agents_scale.py"),
    ("dynamic", "Dynamic checkpointing", "Batches of varying sequence length under one memory cap: the plan chosen "
     "per batch shape by `search.DynamicPlan` (one search per shape) against the one static plan that fits the "
     "longest shape, on the same sequence of batches.", _table("dynamic", None), None, "python bench/dynamic.py"),
    ("evaluator_pool", "Measurements in parallel", "The same plans through one and two CPU Evaluators "
     "(alternating rounds, wall clock), and the default search's wall time with each.", _evaluator_pool, None,
     "python bench/evaluator_pool.py"),
    ("search_quality", "Search quality at equal measurement budgets",
     "Hypervolume (search.records.pareto: memory and time over the all-keep baseline, reference (1.1, 2.0)) of the "
     "measured frontier each method finds with the same number of measured plans, every plan measured through "
     "one Evaluator in one process, frontier plans measured once more at the end. \"agents (search run)\" is "
     "`python -m search.run --reward hybrid --no-warm-start` with its budget (the rules it always measures "
     "count against it); \"exact (measured)\" is the yardstick: the exact solver's frontier on the profile, "
     "each plan measured. Workloads run at the bench's small sizes (bench/common.py) so that each fits ~5 "
     "minutes on 2 cores.",
     _table("search_quality", None), fig_search_quality, "python bench/search_quality.py"),
    ("search_quality_seed1", "Search quality, a second seed", "The same comparison on gpt and cnn with seed 1 "
     "(other weights, batch and agent seeds), to show how much of a single run's verdict is timing noise.",
     _table("search_quality", None), None,
     "python bench/search_quality.py --workloads gpt cnn --seed 1 --out bench/results/search_quality_seed1.json"),
    ("premium", "The checkpointing premium", "Memory saved and step time paid, measured, per architecture. "
     "\"Searched\" plans are the fastest measured exact-frontier plan reaching the saving (of the whole peak unless "
     "the table says activation), chosen on selection measurements; every quoted plan, searched and rule alike, is "
     "then measured afresh the same number of times, interleaved, and only those measurements are quoted. The cited figures are the commonly quoted ranges, of activation memory; "
     "\"holds\" means the measured plan is at least as good on both.",
     _table("premium", None), fig_premium, "python bench/premium.py"),
    ("search_cost", "What a search costs", "Env and PPO throughput, measurement rate, and growth of the exact "
     "solver and the env with the number of decision units (synthetic profiles).",
     _table("search_cost", None), fig_search_cost, "python bench/search_cost.py"),
    ("frontier_table", "Exact frontier against the rules (cost model)", "Predictions from one profile per workload.",
     _table("frontier_table", "workloads"), fig_frontier_table, "python bench/frontier_table.py"),
    ("measured_table", "Standard plans, measured", "Every built-in workload at its default size.",
     _table("measured_table", "rows"), fig_measured_table, "python bench/measured_table.py"),
    ("fidelity", "Cost-model fidelity", "Predicted against measured peak and step time on random plans.",
     _table("fidelity", "workloads"), fig_fidelity, "python bench/fidelity.py"),
    ("units_table", "Decision units on library models",
     "Units from the old rule (children of the largest ModuleList/Sequential), an expert's and the automatic "
     "choice (env.units.choice), each measured as all-recompute against all-keep: units, share of the saved "
     "activation bytes they hold, saving of the step's whole peak.",
     _table("units_table", "rows"), None, "python bench/units_table.py"),
    ("env_speed", "Env speed", "Env steps per second in model mode, one core, no agent.", _env_speed, None,
     "python bench/env_speed.py"),
]


# ---------------------------------------------------------------------------------------------
# The GPU section: only when bench/gpu.py has written results

def _gpu_tests(r: Result) -> str:
    lines = ["| passed | failed | skipped |", "|---:|---:|---:|", f"| {r['passed']} | {r['failed']} | {r['skipped']} |"]
    failed = [t["test"] for t in r["tests"] if t["outcome"] in ("failure", "error")]
    return "\n".join(lines + ([""] + [f"- failed: `{t}`" for t in failed] if failed else []))


def _gpu_offload(r: Result) -> str:
    out = []
    for w in r["workloads"]:
        out += [f"`{w['workload']}` ({w['n_units']} units, batch {w['batch_shape']}; "
                f"{w['offloaded_bytes_per_step'] / 2**20:.0f} MiB offloaded a step)", "",
                "| plan | peak saved | activation memory saved | step time | step ms | spread ms |",
                "|---|---:|---:|---:|---:|---:|"]
        out += [f"| {x['plan']} | {100 * x['peak_saving']:.0f}% | {100 * x['activation_saving']:.0f}% "
                f"| {100 * x['slowdown']:+.1f}% | {1e3 * x['step_seconds']:.1f} | {1e3 * x['spread_seconds']:.1f} |"
                for x in w["rows"]]
        out.append("")
    return "\n".join(out)


def _gpu_search(r: Result) -> str:
    stopped = "stopped at the budget (resumable)" if r["stopped_at_budget"] else f"exit code {r['exit_code']}"
    out = [f"`python -m {r['command']}`: {stopped} after {r['wall_seconds']:.0f} s; the run wrote "
           + ", ".join(f"`{f}`" for f in r["run_files"]) + "."]
    if r.get("report_md"):  # the run's own report, its headings under this section's
        out += ["", *[("###" + line if line.startswith("#") else line) for line in r["report_md"].splitlines()]]
    return "\n".join(out)


GPU_COMMAND = "python bench/gpu.py"
GPU_SECTIONS: list[tuple[str, str, str, Callable[[Result], str], Callable[..., list[str]] | None]] = [
    ("gpu_tests", "GPU tests", "`pytest -m gpu`: measurement, profile and OOM on CUDA, offload, gradients.",
     _gpu_tests, None),
    ("gpu_fidelity", "Cost-model fidelity on a GPU", "Predicted against measured peak and step time on random "
     "plans, at the built-in default sizes.", _table("fidelity", "workloads"),
     lambda r, p: fig_fidelity(r, p, "gpu_fidelity")),
    ("gpu_premium", "The checkpointing premium on a GPU", "As on the CPU, at the built-in default sizes.",
     _table("premium", None), lambda r, p: fig_premium(r, p, "gpu_premium")),
    ("gpu_offload", "Offload on a GPU", "Every unit offloaded with copies on a side stream (`env.runtime.offload`) against "
     "the blocking `save_on_cpu`, recompute and keep, measured in interleaved rounds.", _gpu_offload, None),
    ("gpu_search", "A default search on a GPU", "`python -m search.run --device cuda`, time-boxed.", _gpu_search, None),
]


def gpu_section(results: dict[str, Result], plots: Path, md_dir: Path) -> list[str]:
    """'## On a GPU' with each gpu_* result present, or nothing when bench/gpu.py has not run."""
    if not any(name.startswith("gpu_") for name in results):
        return []
    out = ["## On a GPU", ""]
    summary = results.get("gpu_summary")
    if summary:
        steps = "; ".join(f"{k} {v['status']}" + (f" ({v['why']})" if v.get("why") else "")
                          for k, v in summary["steps"].items())
        out += [f"`{GPU_COMMAND}` on {summary['device']}, {summary.get('written_at', '')}: {steps}.", ""]
    for name, title, intro, table, figs in GPU_SECTIONS:
        if name in results:
            r = results[name]
            out += section(name, title, f"{intro} Clock: {r['clock']}.", table, figs,
                           GPU_COMMAND, r, plots, md_dir, level="###")
    return out


def section(name: str, title: str, intro: str, table: Callable[[Result], str], figs: Callable[..., list[str]] | None,
            command: str, result: Result | None, plots: Path, md_dir: Path, level: str = "##") -> list[str]:
    out = [f"{level} {title}", ""]
    if result is None:
        return out + [f"Not measured yet: run `{command}`.", ""]
    where = (f"Measured on {machine_label(result['machine'])}" if result.get("machine")
             else "This result does not record the machine it ran on (rerun to record it)")
    when = f", {result['written_at']}" if result.get("written_at") else ""
    if timed_before_flushing(result):
        when += " (step times taken before CPU denormals were flushed: read them as drifting with process age)"
    out += [intro, "", f"{where}{when}; `{command}`.", ""]
    try:
        out += [table(result).rstrip(), ""]
        pngs = figs(result, plots) if figs else []
    except (KeyError, TypeError, IndexError) as e:  # a result older than its script's current format
        return out + [f"`bench/results/{name}.json` does not have the fields its script now writes "
                      f"({type(e).__name__}: {e}); rerun `{command}`.", ""]
    for png in pngs:
        path = (plots / png).resolve()
        rel = path.relative_to(md_dir.resolve()) if path.is_relative_to(md_dir.resolve()) else path
        out += [f"![{title}]({rel.as_posix()})", ""]
    return out


def build(results: dict[str, Result], plots: Path, md_path: Path) -> str:
    lines = ["# Benchmarks", "",
             "Generated by `python bench/report.py` from `bench/results/*.json`; do not edit by hand. "
             "Timings on a shared 2-core CPU are noisy: the same plan measured 10-20% apart at different times of "
             "one run, and more between runs, even timed by the measuring thread's CPU time. Compare ratios "
             "measured in one run, and read each number with the machine it names.", ""]
    known = {s[0] for s in SECTIONS}
    for name, title, intro, table, figs, command in SECTIONS:
        lines += section(name, title, intro, table, figs, command, results.get(name), plots, md_path.parent)
    lines += gpu_section(results, plots, md_path.parent)
    other = sorted(n for n in set(results) - known if not n.startswith("gpu_"))
    if other:
        lines += ["## Other results", "", "Present in bench/results but not rendered here: "
                  + ", ".join(f"`{n}.json`" for n in other) + ".", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of result JSON files")
    ap.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md", help="markdown file to write")
    ap.add_argument("--plots", type=Path, default=PLOTS_DIR, help="folder for the PNG figures")
    ap.add_argument("--readme", default=None,
                    help="README whose generated numbers block is rewritten from the same results (default: this "
                         "repository's README.md when --results is bench/results, else none; '-': none)")
    args = ap.parse_args(argv)
    results = read_results(args.results)
    text = build(results, args.plots, args.out)
    args.out.write_text(text)
    print(args.out)
    readme = args.readme or (str(ROOT / "README.md") if args.results.resolve() == RESULTS_DIR.resolve() else "-")
    if readme != "-":
        update_readme(Path(readme), results)
        print(readme)


if __name__ == "__main__":
    main()

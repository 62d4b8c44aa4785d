"""Views of what a search does and costs: the default run, search quality, measurements in
parallel, the search's costs, the env's speed, dynamic checkpointing."""

from __future__ import annotations

import statistics

from bench.common import machine_label
from bench.views.base import Headline, Result, View, measured, mib, span, table
from search.engine.report import peers_markdown, time_lines


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


# --------------------------------------------------------------------------------------------- default_run

def peer_rows(rows: list[Result]) -> list[str]:
    """A report's peers table (``search.engine.report.peers_markdown``); results written before the verdicts
    (``search.records.peer_verdicts``) existed show each peer against ours at no more memory as measured then."""
    if "verdict" in rows[0]:
        return peers_markdown(rows)
    return table(("peer", "peak MiB", "step ms", "ours at no more memory: MiB / ms"),
                 [(p["peer"], f"{mib(p['peak_bytes']):.1f}", f"{p['step_seconds'] * 1e3:.1f}",
                   f"{mib(p['ours_peak_bytes']):.1f} / {p['ours_step_seconds'] * 1e3:.1f}" if p.get("ours_peak_bytes")
                   else "none") for p in rows if not p["oom"]], "lrrl").split("\n")


def default_run_table(r: Result) -> str:
    b = r["baseline"]
    rows = [(f"{mib(p['peak_bytes']):.1f}", f"{1 - p['peak_bytes'] / b['peak_bytes']:.0%}", f"{p['step_seconds'] * 1e3:.1f}",
             f"{p['step_seconds'] / b['step_seconds'] - 1:+.0%}", ", ".join(p["found_by"])) for p in r["frontier"]]
    out = [f"`{r['command']}` on `{r['workload']}` ({r['units']} units): {r['wall_seconds']:.0f} s by the wall clock, "
           f"{r['evaluations']} plans evaluated, {r['measured']} measured; step times by the {r['clock']} clock. "
           f"{r.get('measurement_mode', '')}.", "",
           table(["peak MiB", "saving", "step ms", "slowdown", "found by"], rows, "rrrrl")]
    if r.get("peers"):
        out += ["", *peer_rows(r["peers"])]
    # the run's own phase clock (``time.perf_counter`` in the driver), as its report.md shows it
    out += [line.replace("## ", "#### ") for line in time_lines(r.get("phase_seconds") or {},
                                                             r.get("evaluator_seconds") or {}, b["step_seconds"])]
    if r.get("against"):
        out += ["", *_against_table(r["against"])]
    return "\n".join(out)


def _against_table(a: Result) -> list[str]:
    """This tree's default search beside an earlier revision's, run by run, with where the time went."""
    runs = a["runs"]
    phases = list(dict.fromkeys(k for x in runs for k in (x["phase_seconds"] or {})))
    rows = [[x["tree"], x["round"], f"{x['load_average_before'][0]:.1f}", f"{x['wall_seconds']:.0f}", x["measured"],
             int((x["evaluator_seconds"] or {}).get("plan_measurements", 0)), f"{x['hypervolume']['frontier']:.3f}",
             *(f"{(x['phase_seconds'] or {}).get(k, 0.0):.1f}" for k in phases)] for x in runs]
    med = a["median_wall_seconds"]
    return [f"#### Side by side with {a['revision']}", "",
            f"The same default search from this tree and from revision `{a['revision']}`, {a['rounds']} rounds "
            "alternating which goes first (wall clock; the phases by the driver's phase clock; load: the 1-minute "
            "load average before each run). Median wall seconds: " +
            ", ".join(f"{k} {v:.0f}" for k, v in med.items()) + ".", "",
            table(["tree", "round", "load", "wall s", "plans measured", "measurements", "hypervolume", *phases],
                  [list(map(str, row)) for row in rows], "lrrrrrr" + "r" * len(phases))]


def _lowest(r: Result) -> tuple[Result, Result]:
    return r["frontier"][0], r["baseline"]


def default_run_summary(r: Result) -> list[str]:
    low, b = _lowest(r)
    out = [f"The default `python -m search.run` took {r['wall_seconds']:.0f} s: {r['evaluations']} plans evaluated, "
           f"{r['measured']} measured, a {len(r['frontier'])}-point frontier from {mib(b['peak_bytes']):.1f} MiB "
           f"({b['step_seconds'] * 1e3:.0f} ms a step) down to {mib(low['peak_bytes']):.1f} MiB "
           f"({low['peak_bytes'] / b['peak_bytes'] - 1:+.0%} memory, {low['step_seconds'] / b['step_seconds'] - 1:+.0%} time)."]
    if r.get("against"):
        a, med = r["against"], r["against"]["median_wall_seconds"]
        out.append(f"Side by side with revision `{a['revision']}` ({a['rounds']} rounds, alternating): median "
                   f"{med['this']:.0f} s against {med[a['revision']]:.0f} s ({med['this'] / med[a['revision']]:.2f}x).")
    return out


def default_run_headlines(r: Result) -> list[Headline]:
    low, b = _lowest(r)
    return [Headline(f"Default search (`{r['workload']}`): its lowest plan",
                     f"{low['peak_bytes'] / b['peak_bytes'] - 1:+.0%} peak for {low['step_seconds'] / b['step_seconds'] - 1:+.0%} "
                     f"step time; {r['wall_seconds']:.0f} s, {r['measured']} plans measured", measured(r))]


# --------------------------------------------------------------------------------------------- compiled_search

def compiled_search_table(r: Result) -> str:
    rows = []
    for row in r["rows"]:
        low, b = row["lowest"], row["baseline"]
        phases = row.get("phase_seconds") or {}
        rows.append((row["mode"], row["round"], row["inductor_cache"] or "-", f"{row['wall_seconds']:.0f}",
                     f"{phases.get('rules', 0.0):.0f}", row["measured"], f"{row['hypervolume']:.3f}",
                     f"{b['step_seconds'] * 1e3:.0f}", f"{mib(low['peak_bytes']):.1f}",
                     f"{low['step_seconds'] / b['step_seconds'] - 1:+.0%}", f"{row['load_average_before'][0]:.1f}"))
    out = [f"Eager: `{r['command_eager']}`; compiled: `{r['command_compiled']}`. Wall seconds by the wall clock "
           f"around the CLI; step times by the {r['rows'][0]['clock']} clock; load: the 1-minute load average "
           "before each run.", "",
           table(["search", "round", "inductor cache", "wall s", "rules s", "plans measured", "hypervolume",
                  "baseline ms", "lowest MiB", "its slowdown", "load"], [list(map(str, x)) for x in rows],
                 "lrlrrrrrrrr")]
    compiled = [row for row in r["rows"] if row["mode"] == "compiled" and row.get("peers")]
    if compiled:
        out += ["", "Peers beside the last compiled search (compiled whole, as their users compile them):", "",
                *peer_rows(compiled[-1]["peers"])]
    return "\n".join(out)


def compiled_search_summary(r: Result) -> list[str]:
    eager = [row for row in r["rows"] if row["mode"] == "eager"]
    compiled = [row for row in r["rows"] if row["mode"] == "compiled"]
    lines = [f"`--compile` measured {span([c['measured'] for c in compiled], '{:.0f}')} plans in "
             f"{span([c['wall_seconds'] for c in compiled], '{:.0f}')} s"]
    if eager:
        lines[0] += (f"; the eager search beside it {span([e['measured'] for e in eager], '{:.0f}')} plans in "
                     f"{span([e['wall_seconds'] for e in eager], '{:.0f}')} s: compiled / eager wall time "
                     f"{span(r['wall_ratio_per_round'], '{:.2f}')} (median {r['wall_ratio_median']:.2f}).")
    return lines


def compiled_search_headlines(r: Result) -> list[Headline]:
    if r.get("wall_ratio_median") is None:
        return []
    compiled = [row for row in r["rows"] if row["mode"] == "compiled"]
    return [Headline(f"A compiled search (`--compile`, `{r['workload']}`) against the eager one",
                     f"{r['wall_ratio_median']:.2f}x the wall time (rounds {span(r['wall_ratio_per_round'], '{:.2f}')}), "
                     f"{span([c['measured'] for c in compiled], '{:.0f}')} plans measured",
                     measured(r, "wall"))]


# --------------------------------------------------------------------------------------------- reported_vs_quote

def _plan_words(plan: dict) -> str:
    counts: dict[str, int] = {}
    for a in plan.values():
        counts[a] = counts.get(a, 0) + 1
    return ", ".join(f"{a} {n}" for a, n in counts.items())


def reported_vs_quote_table(r: Result) -> str:
    rows = [(f"{mib(x['peak_bytes']):.2f}", _plan_words(x["plan"]), x["search_measurements"],
             f"{x['reported_ratio']:.3f}", f"{x['quoted_ratio']:.3f}", span(x["quoted_ratio_rounds"]),
             f"{x['error']:+.1%}") for x in r["rows"]]
    return "\n".join([
        f"`{r['command']}` ({r['units']} units, {r['search_wall_seconds']:.0f} s), then each frontier plan and the "
        f"baseline quoted apart in {r['rounds']} side-by-side rounds; step times by the {r['clock']} clock; load "
        f"{r['load_average_search'][0]:.1f} before the search, {r['load_average_quote'][0]:.1f} before the quote.",
        "", table(["peak MiB", "plan", "search measurements", "reported / baseline", "quoted / baseline",
                   "quote's rounds", "error"], [list(map(str, x)) for x in rows], "rlrrrrr")])


def reported_vs_quote_summary(r: Result) -> list[str]:
    return [f"{r['within_goal']} of {len(r['rows'])} frontier plans reported within {r['goal']:.0%} of their "
            f"side-by-side quote; the largest error {r['max_abs_error']:.1%}."]


def reported_vs_quote_headlines(r: Result) -> list[Headline]:
    return [Headline(f"Reported time ratios against a quote apart ({r['units']}-unit search)",
                     f"{r['within_goal']} of {len(r['rows'])} frontier plans within {r['goal']:.0%}; "
                     f"largest error {r['max_abs_error']:.1%}", measured(r, r["clock"], r["load_average_quote"][0]))]


# --------------------------------------------------------------------------------------------- search_quality

AGENTS, AGENTS_OWN, SEARCHES = "agents (search run)", "agents' own plans", ("random", "NSGA-II", "rules")


def search_quality_table(result: Result) -> str:
    """Per workload: each method's hypervolume, its ratio to the measured exact frontier's, the
    evaluations it needed to reach 99% of that, then the verdict the bench drew."""
    out = []
    for w in result["workloads"]:
        rows = [(name, f"{m['evaluations']} ({m['distinct_plans']})", f"{m['hypervolume']:.4f}", _num(m["ratio_to_exact"]),
                 m["evaluations_to_99pct_of_exact"] or "not reached", _num(m["hypervolume_at_agents_evaluations"]),
                 len(m["frontier"])) for name, m in w["methods"].items()]
        out += [f"**{w['label']}** (`{w['workload']}`, {w['n_units']} units x {len(w['actions'])} actions = "
                f"{w['plans_in_space']} plans; baseline {mib(w['baseline']['peak_bytes']):.1f} MiB, "
                f"{w['baseline']['step_seconds'] * 1e3:.1f} ms a step)", "",
                table(["method", "evaluations (distinct)", "hypervolume", "/ exact", "evaluations to 99% of exact",
                       "hypervolume at the search's count", "frontier points"], rows), "",
                f"Exact frontier's hypervolume on the cost model (predicted): {w['exact_predicted_hypervolume']:.4f}. "
                f"{w['new_measurements']} measurements in {w['wall_seconds']:.0f} s"
                + (f"; measured on {machine_label(w['machine'])}" if "machine" in w else "") + ".", ""]
        out += [f"- {v}" for v in w["verdict"]] + [""]
    return "\n".join(out)


def search_quality_summary(r: Result) -> list[str]:
    out = []
    for w in r["workloads"]:
        m = w["methods"]
        ratio = m[AGENTS_OWN]["ratio_to_exact"]  # None where the exact solver's measured plans span no hypervolume
        own = (f" (their own plans {ratio:.3f} of the exact solver's plans, measured)" if ratio is not None
               else " (the exact solver's measured plans span no hypervolume to compare with)")
        out.append(f"`{w['workload']}` ({w['n_units']} units), hypervolume at {m['random']['evaluations']} measured "
                   f"plans each: PPO agents {m['agents (search run)']['hypervolume']:.3f}{own}, random "
                   f"{m['random']['hypervolume']:.3f}, NSGA-II {m['NSGA-II']['hypervolume']:.3f}, rules "
                   f"{m['rules']['hypervolume']:.3f}.")
    return out



def search_quality_headlines(r: Result) -> list[Headline]:
    first = r["workloads"][0]
    m = first["methods"]
    ahead = sum(all(w["methods"][AGENTS]["hypervolume"] > w["methods"][k]["hypervolume"] for k in SEARCHES)
                for w in r["workloads"])
    return [Headline(f"Search quality (`{first['workload']}`): hypervolume at {m['random']['evaluations']} measured plans",
                     f"agents {m[AGENTS]['hypervolume']:.3f}, random {m['random']['hypervolume']:.3f}, NSGA-II "
                     f"{m['NSGA-II']['hypervolume']:.3f}, rules {m['rules']['hypervolume']:.3f}; agents highest on "
                     f"{ahead} of {len(r['workloads'])} workloads",
                     measured(first, first["baseline"].get("clock", "clock not recorded")))]


# --------------------------------------------------------------------------------------------- evaluator_pool

def evaluator_pool_table(r: Result) -> str:
    rows = [(row["round"], row["evaluators"], row["plans"], f"{row['wall_seconds']:.1f}", f"{row['measurements_per_minute']:.1f}",
             ", ".join(f"{v}" for v in row["per_evaluator"].values()), f"{row['load_average_1']:.1f}") for row in r["rounds"]]
    med = r["measurements_per_minute_median"]
    out = [table(["round", "Evaluators", "plans", "wall s", "measurements/min", "per Evaluator", "load"], rows, "rrrrrlr"),
           "", f"Median: {med['1']:.1f} measurements/min with one Evaluator, {med['2']:.1f} with two "
               f"({r['speedup_2_over_1']:.2f}x)."]
    if r.get("plain_processes"):
        plain = r["plain_measurements_per_minute_median"]
        rows = [(p["round"], p["processes"], f"{p['wall_seconds']:.1f}", f"{p['measurements_per_minute']:.1f}",
                 f"{p['mean_measurement_seconds']:.3f}", f"{p['mean_timed_step_seconds']:.3f}", f"{p['load_average_1']:.1f}")
                for p in r["plain_processes"]]
        out += ["", "The ceiling: the same plans in plain processes (no Ray, no queue), started together.", "",
                table(["round", "processes", "wall s", "measurements/min", "s a measurement", "of it timed steps", "load"],
                      rows), "",
                f"Median: {plain['1']:.1f} and {plain['2']:.1f} measurements/min ({r['plain_speedup_2_over_1']:.2f}x); "
                f"the pool with two Evaluators reaches {r['pool_over_plain_with_2']:.2f} of two plain processes."]
    for s in r.get("default_search", []):
        out.append(f"Default search with `--evaluators {s['evaluators']}`: {s['wall_seconds']:.0f} s ({s['summary']}).")
    return "\n".join(out)


def evaluator_pool_headlines(r: Result) -> list[Headline]:
    med, rounds = r["measurements_per_minute_median"], r["rounds"]
    per_round = [x["measurements_per_minute"] for x in rounds if x["evaluators"] == 2]
    figure = (f"{r['speedup_2_over_1']:.2f}x the measurements a minute of one ({med['1']:.1f} and {med['2']:.1f}; "
              f"two: {span(per_round, '{:.1f}')} over {len(per_round)} rounds)")
    if r.get("plain_processes"):
        figure += f"; two plain processes {r['plain_speedup_2_over_1']:.2f}x"
    load = statistics.median(x["load_average_1"] for x in rounds)
    return [Headline("Two CPU Evaluators against one", figure, measured(r, "wall clock", load))]


# --------------------------------------------------------------------------------------------- search_cost

def search_cost_table(result: Result) -> str:
    """Env speed, measurements/s, PPO throughput, then the growth table."""
    env = result["env_speed"]
    out = [f"Env steps/s in model mode (`{env['workload']}`, {env['n_units']} units, from {env['source']}): "
           f"{env.get('steps_per_second') or '-'} plain, {env['steps_per_second_with_masks']:.0f} with action masks.", "",
           table(["workload", "units", "s a measurement", "measurements/s", "median step s"],
                 [(f"`{r['workload']}`", r["n_units"], f"{r['seconds_per_measurement']:.2f}",
                   f"{r['measurements_per_second']:.2f}", f"{r['median_step_seconds']:.3f}") for r in result["measurements"]]),
           "", table(["PPO Ray workers (2 CPUs)", "env steps/s, all workers", "per worker"],
                     [(r["workers"], f"{r['env_steps_per_second']:.0f}", f"{r['env_steps_per_second'] / r['workers']:.0f}")
                      for r in result["ppo"]], "rrr"), ""]
    rows = [(r["n_units"], r["n_actions"], f"{r['plans']:.3g}",
             f"{r['exact_seconds']:.3f}" if "exact_seconds" in r else r["exact_note"], r.get("exact_frontier_size", "-"),
             f"{r['env_steps_per_second']:.0f}") for r in result["scaling"]]
    out.append(table(["units", "actions", "plans", "exact solve s", "exact frontier points", "env steps/s"], rows, "rrrrrr"))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- env_speed

def env_speed_table(r: Result) -> str:
    return table(["workload", "units x actions", "env steps/s", "with action masks"],
                 [(r["workload"], f"{r['n_units']} x {r['n_actions']}", r["steps_per_second"],
                   r["steps_per_second_with_masks"])], "llrr")


# --------------------------------------------------------------------------------------------- dynamic

def dynamic_table(r: Result) -> str:
    lengths = [str(n) for n in r["lengths"]]
    rows = [(name, *(f"{r[name]['peaks_mb'][n]:.1f}" for n in lengths), f"{r['median_seconds'][name]:.2f}")
            for name in ("static", "dynamic")]
    return "\n".join([
        f"`{r['workload']}`, {r['steps']} batches of {', '.join(lengths)} tokens, cap {r['cap_mb']:.1f} MiB, "
        f"{r['rounds']} rounds, {r['clock']} clock.", "",
        table(["plan", *(f"peak at {n} tokens, MiB" for n in lengths), "total s (median)"], rows), "",
        f"Dynamic over static: {r['dynamic_over_static']:.3f} of the total step time (medians over the rounds); "
        f"both under the cap: {'yes' if r['both_under_cap'] else 'NO'}."])


def dynamic_headlines(r: Result) -> list[Headline]:
    per_round = [d / s for d, s in zip(r["dynamic"]["totals_seconds"], r["static"]["totals_seconds"])]
    lengths = "/".join(str(n) for n in r["lengths"])
    return [Headline(f"A plan per batch shape (`DynamicPlan`, {lengths} tokens) against one static plan",
                     f"{r['dynamic_over_static']:.3f} of its step time (rounds {span(per_round)}); "
                     f"both under the {r['cap_mb']:.1f} MiB cap: {'yes' if r['both_under_cap'] else 'no'}",
                     measured(r, "thread-cpu"))]


VIEWS = [
    View("default_run", "The default run", "The README's first command, defaults only, with the peers it measures "
         "beside the search.", "python bench/default_run.py", default_run_table, default_run_summary,
         default_run_headlines),
    View("compiled_search", "A compiled search", "`python -m search.run --compile` (each unit's variant compiled "
         "once and reused by every plan, `--compile-scope units`) beside the eager search, one after the other in "
         "each round; the first compiled run compiles into an empty inductor cache.",
         "python bench/compiled_search.py", compiled_search_table, compiled_search_summary, compiled_search_headlines),
    View("reported_vs_quote", "Reported times against a quote", "Every frontier plan's time over the baseline's as "
         "the search reports it, against the same plans and the baseline measured again apart from the search, "
         "side by side.", "python bench/reported_vs_quote.py", reported_vs_quote_table, reported_vs_quote_summary,
         reported_vs_quote_headlines),
    View("search_quality", "Search quality at equal measurement budgets",
         "Hypervolume (search.records.pareto: memory and time over the all-keep baseline, reference (1.1, 2.0)) of the "
         "measured frontier each method finds with the same number of measured plans, every plan measured through "
         "one Evaluator in one process, frontier plans measured once more at the end. \"agents (search run)\" is "
         "`python -m search.run --reward hybrid --no-warm-start` with its budget (the rules it always measures "
         "count against it); \"exact (measured)\" is the yardstick: the exact solver's frontier on the profile, "
         "each plan measured. Workloads run at the bench's small sizes (bench/workloads.py) so that each fits ~5 "
         "minutes on 2 cores.", "python bench/search_quality.py", search_quality_table, search_quality_summary,
         search_quality_headlines),
    View("search_quality_seed1", "Search quality, a second seed", "The same comparison on gpt and cnn with seed 1 "
         "(other weights, batch and agent seeds), to show how much of a single run's verdict is timing noise.",
         "python bench/search_quality.py --workloads gpt cnn --seed 1 --out bench/results/search_quality_seed1.json",
         search_quality_table, search_quality_summary),
    View("evaluator_pool", "Measurements in parallel", "The same plans through one and two CPU Evaluators "
         "(alternating rounds, wall clock), and the default search's wall time with each.",
         "python bench/evaluator_pool.py", evaluator_pool_table, headlines=evaluator_pool_headlines),
    View("dynamic", "Dynamic checkpointing", "Batches of varying sequence length under one memory cap: the plan chosen "
         "per batch shape by `search.DynamicPlan` (one search per shape) against the one static plan that fits the "
         "longest shape, on the same sequence of batches.", "python bench/dynamic.py", dynamic_table,
         headlines=dynamic_headlines),
    View("search_cost", "What a search costs", "Env and PPO throughput, measurement rate, and growth of the exact "
         "solver and the env with the number of decision units (synthetic profiles).", "python bench/search_cost.py",
         search_cost_table),
    View("env_speed", "Env speed", "Env steps per second in model mode, one core, no agent.",
         "python bench/env_speed.py", env_speed_table),
]

"""Views of what plans save and cost: the checkpointing premium, the standard plans measured, the
cost model's fidelity, the exact frontier against the rules, and the decision units."""

from __future__ import annotations

from typing import Any

from bench.views.base import Headline, Result, View, measured, mib, span, table

UNIT_SETS = ("blocks", "expert", "auto")


# --------------------------------------------------------------------------------------------- premium

def _saving_row(name: str, r: Result) -> list[Any]:
    spread = (f" (IQR {r['spread_seconds'] * 1e3:.1f}, {r['n_measurements']}x{r['n_timed_steps'] // max(1, r['n_measurements'])})"
              if "spread_seconds" in r else "")
    return [name, f"{100 * r['peak_saving']:.0f}%", f"{100 * r['activation_saving']:.0f}%", f"{100 * r['slowdown']:+.0f}%",
            f"{r['step_seconds'] * 1e3:.1f}{spread}"]


def _premium_workload(w: Result) -> list[str]:
    b, what = w["baseline"], "peak" if w["saving"] == "peak" else "activation"
    rows = [_saving_row("every unit recomputed", w["uniform"]["all"]),
            _saving_row("every unit selective", w["uniform"]["all_selective"])]
    for key, t in w["targets"].items():
        name = f"searched, >= {key} {what} saving"
        rows.append(_saving_row(name, t["searched"]) if t["reachable"] else
                    [name, f"unreachable: the most any searched plan saves is {100 * t['max_searched_saving']:.1f}%", "", "", ""])
    cited = [(f"{claim} ({'every unit selective' if claim == 'selective' else 'every unit recomputed'})",
              f"{c['cited_saving_pct'][0]}-{c['cited_saving_pct'][1]}%, +{c['cited_slowdown_pct'][0]}-{c['cited_slowdown_pct'][1]}%",
              f"{c['measured_activation_saving_pct']:.0f}%, {c['measured_slowdown_pct']:+.0f}%", c["memory"], c["time"],
              "yes" if c["holds"] else "no") for claim, c in w["cited"].items()]
    out = [f"**{w['architecture']}** (`{w['workload']}`, {w['n_units']} units; baseline {mib(b['peak_bytes']):.1f} MiB peak "
           f"of which {mib(b['activation_bytes']):.1f} MiB activations, {b['step_seconds'] * 1e3:.1f} ms a step)", "",
           table(["plan", "peak saved", "activation memory saved", "step time",
                  "step ms (IQR ms, measurements x timed steps)"], rows), "",
           table(["cited claim", "cited: memory saved, slower", "measured here", "memory", "time", "holds?"], cited, "llllll")]
    # the rules against the searched plan at 50%, or at the highest target reached below it
    reached = [k for k in ("50%", "30%") if w["targets"].get(k, {}).get("reachable")]
    if reached:
        t = w["targets"][reached[0]]
        cells = [f"{name} {r['time_ratio_to_searched']:.2f}x" if r["reaches"] else f"{name} (saves only {100 * r['saving']:.1f}%)"
                 for name, r in t["rules"].items() if name != "none"]
        out += ["", f"At >= {reached[0]} {what} saving, each rule's step time over the searched plan's "
                    f"({t['searched']['step_seconds'] * 1e3:.1f} ms):", "", "; ".join(cells) + "."]
    return out + [""]


def premium_table(result: Result) -> str:
    """Per architecture: savings and cost of the uniform and searched plans, the cited figures
    against these, and the rules at 50% saving against the searched plan."""
    return "\n".join(line for w in result["workloads"] for line in _premium_workload(w))


def _rules_at_half(half: Result) -> str:
    ranked = sorted((v["time_ratio_to_searched"], name) for name, v in half["rules"].items() if v["reaches"] and name != "none")
    reaching = [f"{name} {ratio:.2f}x" for ratio, name in ranked[:4]]
    if len(ranked) > 4:
        reaching.append(f"{len(ranked) - 4} more rules {ranked[4][0]:.2f}x or slower")
    return ", ".join(reaching) if reaching else "none"


def premium_summary(r: Result) -> list[str]:
    out = []
    for w in r["workloads"]:
        full, half = w["uniform"]["all"], w["targets"].get("50%", {})
        line = (f"{w['architecture']} (`{w['workload']}`): recomputing every unit saves {full['peak_saving']:.0%} of "
                f"the peak ({full['activation_saving']:.0%} of activations) for {full['slowdown']:+.0%}")
        if half.get("reachable"):
            s = half["searched"]
            line += (f"; the searched plan at >= 50% saves {s['peak_saving']:.0%} for {s['slowdown']:+.0%}, and the "
                     f"rules reaching 50% take {_rules_at_half(half)} its time")
        else:
            line += f"; no searched plan reaches 50% (most: {half.get('max_searched_saving', 0):.0%})"
        n = w["baseline"].get("n_measurements")
        out.append(line + (f"; every quoted plan measured {n} times afresh, interleaved" if n else "") + ".")
    return out


def premium_headlines(r: Result) -> list[Headline]:
    w = r["workloads"][0]
    full, half, when = w["uniform"]["all"], w["targets"].get("50%", {}), measured(r, w.get("clock"))
    out = [Headline(f"Recomputing every unit, {w['architecture']} (`{w['workload']}`)",
                    f"{-full['peak_saving']:+.0%} peak ({-full['activation_saving']:+.0%} activations) for "
                    f"{full['slowdown']:+.0%} step time (IQR {1e3 * full['spread_seconds']:.0f} ms of "
                    f"{1e3 * full['step_seconds']:.0f})", when)]
    if half.get("reachable"):
        s = half["searched"]
        out.append(Headline(f"The searched plan at >= 50% peak saving (`{w['workload']}`)",
                            f"{-s['peak_saving']:+.0%} peak for {s['slowdown']:+.0%} step time; the rules reaching 50% "
                            f"take {_rules_at_half(half)} its time", when))
    return out


# --------------------------------------------------------------------------------------------- measured_table

def measured_table_table(result: Result) -> str:
    rows = [(r["workload"], r["plan"], f"{r['peak_mb']:.1f}", f"{r['activation_mb']:.1f}", f"{r['peak_saving_pct']:+.0f}%",
             f"{r['activation_saving_pct']:+.0f}%", f"{r['step_seconds']:.3f} ({r['spread_seconds']:.3f})",
             f"{r['slowdown_pct']:+.0f}%", f"{r['slowdown_min_pct']:+.0f}%") for r in result["rows"]]
    return table(["workload", "plan", "peak MiB", "activation MiB", "peak saving", "activation saving", "step s (IQR)",
                  "slowdown (median)", "slowdown (fastest)"], rows, "llrrrrrrr")


# --------------------------------------------------------------------------------------------- fidelity

def fidelity_table(result: Result) -> str:
    rows = [(r["workload"], r["n_plans"], f"{100 * r['peak_max_abs_error']:.2f}% / {100 * r['peak_median_abs_error']:.2f}%",
             f"{100 * r['peak_within_target']:.0f}%",
             f"{100 * r['time_max_abs_error']:.1f}% / {100 * r['time_median_abs_error']:.1f}%",
             f"{100 * r['time_median_signed_error']:+.1f}%", f"{100 * r['time_within_target']:.0f}%",
             f"{100 * r['time_ratio_max_abs_error']:.1f}% / {100 * r['time_ratio_median_abs_error']:.1f}%",
             f"{100 * r['median_relative_spread']:.1f}%") for r in result["workloads"]]
    return table(["workload", "plans", "peak err max / median", "peak within 5%", "time err max / median", "time bias",
                  "time within 10%", "slowdown err max / median", "time IQR/median"], rows)


def fidelity_headlines(r: Result) -> list[Headline]:
    wl = r["workloads"]
    return [Headline(f"Cost model against measured, {sum(w['n_plans'] for w in wl)} random plans on {len(wl)} workloads",
                     f"peak error median {span([100 * w['peak_median_abs_error'] for w in wl], '{:.2f}')}%; step time "
                     f"error median {span([100 * w['time_median_abs_error'] for w in wl], '{:.1f}')}% (measured spread "
                     f"{span([100 * w['median_relative_spread'] for w in wl], '{:.0f}')}%)",
                     measured(r, wl[0].get("clock", "thread-cpu")))]


# --------------------------------------------------------------------------------------------- frontier_table

def frontier_table_table(result: Result) -> str:
    wl = result["workloads"]
    lines = [("units x actions", lambda r: f"{r['n_units']} x {len(r['actions'])}"),
             ("exact frontier points", lambda r: str(r["frontier_size"])),
             ("exact hypervolume", lambda r: f"{r['hypervolume']:.4f}"),
             ("rules' hypervolume", lambda r: f"{r['rules_hypervolume']:.4f}"),
             ("lowest peak / baseline", lambda r: f"{r['lowest_peak_ratio']:.3f}"),
             ("solve seconds", lambda r: f"{r['solve_seconds']:.3f}")]
    rows = [[name, *(f(r) for r in wl)] for name, f in lines]
    rows.append(["**extra step time at equal memory**", *([""] * len(wl))])
    for n in dict.fromkeys(n for r in wl for n in r["rules"]):
        rows.append([n, *(f"{r['rules'][n]['extra_time'] * 100:+.1f}% (mem {r['rules'][n]['peak_ratio']:.3f})"
                          if n in r["rules"] else "" for r in wl)])
    return table(["", *(r["workload"] for r in wl)], rows, "l" * (len(wl) + 1))


# --------------------------------------------------------------------------------------------- units_table

def units_table_table(result: Result) -> str:
    rows = [(r["workload"], *(f"{r[s]['n_units']}, {r[s]['coverage']:.0%}, {r[s]['peak_saving_pct']:.0f}%" for s in UNIT_SETS))
            for r in result["rows"]]
    return table(["model", *(f"{s}: units, coverage, peak saving" for s in UNIT_SETS)], rows)


def units_table_headlines(r: Result) -> list[Headline]:
    rows = r["rows"]

    def saving(unit_set: str) -> str:
        return span([x[unit_set]["peak_saving_pct"] for x in rows], "{:.0f}") + "%"

    return [Headline(f"Decision units found automatically, {len(rows)} library models: peak saved by recomputing all",
                     f"{saving('auto')}; an expert's units {saving('expert')}, the old rule's {saving('blocks')}",
                     measured(r, "peaks exact (profiler memory events)", timed=False))]



def chains_table(r: Result) -> str:
    out = []
    for w in r["workloads"]:
        peaks = w["peaks_bytes"]
        out += [f"`{w['workload']}` at {w['unit_rule']} units ({w['units']} units, {w['links']} that chain onto the "
                "one before), peaks measured (profiler memory events):", "",
                table(["plan", "peak MiB"], [(name, f"{mib(b):.2f}") for name, b in peaks.items()]), "",
                "The exact solver on this workload's profile (CPU seconds, median, one thread):", "",
                table(["chain", "relative step", "seconds", "frontier points", "lowest predicted MiB"],
                      [("yes" if s["chain"] else "no", s["relative"], f"{s['cpu_seconds']:.2f}", s["points"],
                        f"{mib(s['lowest_predicted_peak_bytes']):.2f}") for s in w["solver"]]), ""]
    return "\n".join(out)


def chains_headlines(r: Result) -> list[Headline]:
    out = []
    for w in r["workloads"]:
        peaks = w["peaks_bytes"]
        peers = {k: v for k, v in peaks.items() if k.startswith("checkpoint-sequential")}
        if not peers:
            continue
        best = min(peers, key=peers.get)
        out.append(Headline(f"Chain regions, `{w['workload']}` at {w['units']} {w['unit_rule']} units: lowest peak",
                            f"{mib(peaks['chain where units chain']):.2f} MiB chained; {best} {mib(peers[best]):.2f}, "
                            f"recompute every unit {mib(peaks['recompute every unit']):.2f}",
                            measured(r, "peaks exact (profiler memory events)", timed=False)))
    return out

def warmup_table(r: Result) -> str:
    rows = [(f"`{x['workload']}`", x["micro_batch"], x["plan"], x["measurements"],
             f"{x['first_ms']['1']:.1f}", f"{x['rest_ms']['1']:.1f}", f"{x['first_over_rest_one_warmup']:.3f}",
             f"{x['one_over_two_warmups']:.3f}") for x in r["rows"]]
    timing = table(["workload", "micro-batch", "plan", "measurements", "first timed ms, one warm-up",
                    "later timed ms, one warm-up", "first / later", "one warm-up / two"], rows, "lrlrrrrr")
    if not r.get("peak_rows"):
        return timing
    peaks = [(f"`{x['workload']}`", x["micro_batch"], x["item"], x["measurements"], f"{x['peak_mib']:.2f}",
              "yes" if x["same_bytes"] else "**no**", f"{x['seconds']['1']:.2f}", f"{x['seconds']['0']:.2f}")
             for x in r["peak_rows"]]
    return timing + "\n\nThe peak alone, with one warm-up step before the memory step and with none:\n\n" + table(
        ["workload", "micro-batch", "plan or peer", "measurements each", "peak MiB", "same bytes",
         "s, one warm-up", "s, none"], peaks, "lrlrrlrr")


def warmup_summary(r: Result) -> list[str]:
    rows = r["rows"]
    return [f"after one warm-up step, the first timed step / the later ones: "
            f"{span([x['first_over_rest_one_warmup'] for x in rows])}; a plan's median with one warm-up / with two: "
            f"{span([x['one_over_two_warmups'] for x in rows])} ({r['processes']} processes measuring at once; "
            f"{measured(r, r['clock'])})"] + ([
            f"the peak alone without a warm-up step read the same bytes as with one in "
            f"{sum(x['same_bytes'] for x in peaks)} of {len(peaks)} (workload, micro-batch, plan or peer)s, "
            f"in {span([x['seconds']['0'] / x['seconds']['1'] for x in peaks])} of the seconds "
            f"({measured(r, 'wall clock')})"] if (peaks := r.get("peak_rows")) else [])


VIEWS = [
    View("chains", "Chain regions", "Recomputing a run of units as one region (`chain`) against recomputing each unit "
         "and against `checkpoint_sequential`, measured; the exact solver's lowest predicted peak and cost with and "
         "without chain.", "python bench/chains.py", chains_table, headlines=chains_headlines),
    View("premium", "The checkpointing premium", "Memory saved and step time paid, measured, per architecture. "
         "\"Searched\" plans are the fastest measured exact-frontier plan reaching the saving (of the whole peak unless "
         "the table says activation), chosen on selection measurements; every quoted plan, searched and rule alike, is "
         "then measured afresh the same number of times, interleaved, and only those measurements are quoted. The cited "
         "figures are the commonly quoted ranges, of activation memory; \"holds\" means the measured plan is at least "
         "as good on both.", "python bench/premium.py", premium_table, premium_summary, premium_headlines),
    View("frontier_table", "Exact frontier against the rules (cost model)", "Predictions from one profile per workload.",
         "python bench/frontier_table.py", frontier_table_table),
    View("measured_table", "Standard plans, measured", "Every built-in workload at its default size.",
         "python bench/measured_table.py", measured_table_table),
    View("fidelity", "Cost-model fidelity", "Predicted against measured peak and step time on random plans.",
         "python bench/fidelity.py", fidelity_table, headlines=fidelity_headlines),
    View("warmup", "Warm-up steps at another micro-batch",
         "Each plan measured with one warm-up step and with two before its timed steps, its peak taken from a "
         "measurement before, as a throughput search measures a plan again (env.measure.micro_batch.WARMUP); then "
         "the peak alone with one warm-up step and with none, as the search finds micro-batches by peaks "
         "(AtMicroBatch.warmup_for).",
         "python bench/warmup.py", warmup_table, warmup_summary),
    View("units_table", "Decision units on library models",
         "Units from the old rule (children of the largest ModuleList/Sequential), an expert's and the automatic "
         "choice (env.units.choice), each measured as all-recompute against all-keep: units, share of the saved "
         "activation bytes they hold, saving of the step's whole peak.", "python bench/units_table.py",
         units_table_table, headlines=units_table_headlines),
]

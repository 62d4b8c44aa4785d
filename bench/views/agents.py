"""Views of the agents: in the real search, quoted on fresh measurements (``agents_search``), and on
the cost model at 6 to 96 units (``agents_scale``)."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from bench.views.base import Headline, Result, View, measured, span, table


def _rules(names: list[str]) -> str:
    """Rule names, the all-keep rule ``none`` spelled as the baseline; no rule at all as such."""
    return ", ".join("none (the baseline)" if n == "none" else n for n in names) or "no rule"


def rules_beyond(row: Result) -> tuple[str, str]:
    """The rules beyond the agents' frontier, each with how much slower the agents' fastest plan at
    no more memory is, and those of them beyond the quote's noise: in both quotes, with what the second
    said of each (``bench.agents_search.confirm``), or in the one quote of a row quoted before the
    second existed (a row analysed before the control existed says so)."""
    by = row.get("rules_beyond_by")
    if by is None:
        return _rules(row["rules_beyond_agents"]), "not analysed: no control"
    cells = [f"{_rules([n])} ({'no agent plan fits' if m is None else f'agents +{100 * m:.1f}%'})" for n, m in by.items()]
    again = row.get("rules_confirmed_by")
    if again is None:  # quoted before the second quote existed: the first quote's verdict alone
        return ", ".join(cells) or "no rule", _rules(row["rules_beyond_noise"])
    gone = [f"{_rules([n])} (agents {100 * again[n]:+.1f}% there)" for n in row["rules_beyond_noise"]
            if n in again and n not in row["rules_beyond_confirmed"]]
    far = _rules(row["rules_beyond_confirmed"]) + (" in both quotes" if row["rules_beyond_confirmed"] else "")
    return ", ".join(cells) or "no rule", far + (f"; within it in the second quote: {', '.join(gone)}" if gone else "")


def control_cell(row: Result) -> str:
    """The control's hypervolume ratio and the quote's noise band; rows quoted before the control have none."""
    c = row.get("control")
    if not c or c["hv_ratio"] is None:
        return "not quoted"
    noise = row.get("quote_noise")
    return f"{c['hv_ratio']:.3f}" + (f" (noise {100 * noise:.1f}%)" if noise is not None else "")


def coverage_summary(row: Result) -> dict[str, Any]:
    """The 20 budgets of a row in a few numbers: where both fit, their time ratio and who is faster beyond the noise."""
    both = [c for c in row["coverage"] if "agents_over_exact" in c]
    ratios = [c["agents_over_exact"] for c in both]
    return {"budgets": len(row["coverage"]), "both_fit": len(both),
            "mean_ratio": float(np.mean(ratios)) if ratios else None, "worst_ratio": max(ratios) if ratios else None,
            "agents_faster_beyond_noise": sum(1 for c in both if c.get("beyond_noise") and c["agents_over_exact"] < 1),
            "exact_faster_beyond_noise": sum(1 for c in both if c.get("beyond_noise") and c["agents_over_exact"] > 1)}


def _search_row(r: Result) -> list[Any]:
    c, x = coverage_summary(r), r["expert"]
    mean = f"{c['mean_ratio']:.3f}, {c['worst_ratio']:.3f}" if c["mean_ratio"] is not None else "n/a"
    at_x = (f"{x['agents_over_expert']:.3f} ({x['units']} units, {x['peak_mb']:.1f} MiB)"
            if x["agents_over_expert"] is not None else f"no agent plan fits {x['peak_mb']:.1f} MiB")
    ratio = f"{r['agents_over_exact']:.3f}" if r["agents_over_exact"] is not None else "n/a"
    beyond, far = rules_beyond(r)
    return [f"`{r['flags']}`", r["units"], f"{r['wall_seconds']:.0f}", f"{r['hv_agents_own']:.4f}",
            f"{r['hv_exact_measured']:.4f}", ratio, beyond, far, mean,
            f"{c['agents_faster_beyond_noise']} / {c['exact_faster_beyond_noise']} of {c['both_fit']}", at_x,
            control_cell(r), f"{r['load_average_1']:.1f}"]


def agents_search_table(result: Result) -> str:
    header = ["search", "units", "search s", "agents' own HV", "exact plans' HV", "agents / exact",
              "rules beyond the agents' frontier (agents' time over the rule's)",
              "of them beyond the quote's noise (both quotes)", "20 budgets: agents' time / exact's (mean, worst)",
              "agents faster / slower beyond the noise", "at the expert plan's memory: agents' time / its",
              "control: exact plans / themselves", "load"]
    out = [table(header, [_search_row(r) for r in result["rows"]], "lrrrrrllllllr")]
    history = earlier_runs(result)
    if history:
        out += ["", "Earlier runs of these rows (agents' own HV over the exact plans', by the commit they ran on; "
                    "the table above quotes the latest):", "", *history]
    return "\n".join(out)


def earlier_runs(result: Result) -> list[str]:
    """Per row, the hypervolume ratio of its earlier runs that name their commit (``earlier_runs``)."""
    out = []
    for row in result["rows"]:
        runs = [(e["commit"], e["agents_over_exact"], run.get("written_at") or "?")
                for run in result.get("earlier_runs", []) for e in run.get("rows", [])
                if isinstance(e, dict) and e.get("flags") == row["flags"] and e.get("commit")
                and e.get("agents_over_exact") is not None]
        if runs:
            out.append(f"- `{row['flags']}`: " + ", ".join(f"{x:.3f} ({c}, {when[:10]})" for c, x, when in runs)
                       + f"; now {row['agents_over_exact']:.3f} ({row.get('commit', '?')})")
    return out


def agents_search_summary(r: Result) -> list[str]:
    out = []
    for row in r["rows"]:
        beyond, far = rules_beyond(row)
        refs = (f", the baseline measured {row['search_baseline_measurements']} times as the reference"
                if row.get("search_paired") else "")
        out.append(f"`search.run {row['flags']}` ({row['units']} units, {row['measured']} measured{refs}, "
                   f"{row['wall_seconds']:.0f} s): the agents' own plans reach {row['agents_over_exact']:.3f} of the "
                   f"exact plans' hypervolume, both remeasured {row['quote']['samples_per_plan']} times apart from the "
                   f"search; beyond the agents' own frontier: {beyond}; beyond the quote's noise: {far}"
                   + (f"; the exact plans quoted twice, against themselves: {control_cell(row)}" if row.get("control") else "")
                   + f" ({row['clock']} clock, load {row['load_average_1']:.1f}"
                   + (f", commit {row['commit']}" if row.get("commit") else "") + ").")
    return out


def agents_search_headlines(r: Result) -> list[Headline]:
    rows = r["rows"]
    ratios = [x["agents_over_exact"] for x in rows if x["agents_over_exact"] is not None]
    far = sum(bool(x.get("rules_beyond_confirmed", x.get("rules_beyond_noise"))) for x in rows)
    units = [x["units"] for x in rows]
    loads = [x["load_average_1"] for x in rows]
    return [Headline(f"Agents in the real search ({len(rows)} searches, {min(units)}-{max(units)} units): their own plans' "
                     "hypervolume over the exact solver's, both measured afresh",
                     f"{span(ratios)} (median {statistics.median(ratios):.3f}); a rule beyond their frontier by more "
                     f"than the quote's noise in {far} of {len(rows)}",
                     measured(r, rows[0]["clock"], statistics.median(loads)))]


def agents_scale_table(r: Result) -> str:
    rows = [(x["profile"], x["n_units"], f"{x['reference']}, {x['reference_points']} points", f"{x['hv_ratio']:.4f}",
             f"{x['clone_only_hv_ratio']:.4f}", f"{x['coverage_mean']:.5f} / {x['coverage_max']:.4f}",
             ", ".join(x["rules_beyond"]) if x.get("rules_beyond") else "none", f"{x['train_seconds']:.1f}")
            for x in r["rows"]]
    out = [table(["profile", "units", "reference", "HV / reference", "cloning only",
                  "step time at 20 budgets vs reference (mean / max)", "rules beyond", "training s"], rows, "lrlrrllr")]
    if r.get("compare_48"):
        out += ["", "At 48 layered units, cloning against PPO alone:", "",
                table(["design", "timesteps", "HV / reference", "step time at 20 budgets (mean / max)", "rules beyond",
                       "training s"],
                      [(x["design"], x["timesteps"], f"{x['hv_ratio']:.4f}",
                        f"{x['coverage_mean']:.4f} / {x['coverage_max']:.4f}", len(x["rules_beyond"]),
                        f"{x['train_seconds']:.1f}") for x in r["compare_48"]])]
    h = r.get("hybrid")
    if h:
        out += ["", f"The hybrid loop at {h['n_units']} units, on a stand-in measured model ({h['per_round']} plans "
                    f"measured a round): HV / reference {span([x['hv_ratio'] for x in h['rounds']], '{:.4f}')} over "
                    f"{len(h['rounds'])} rounds, finally {h['final']['hv_ratio']:.4f}; the uncorrected exact plans "
                    f"{h['uncorrected_exact_plans']['hv_ratio']:.4f}."]
    return "\n".join(out)


def agents_scale_headlines(r: Result) -> list[Headline]:
    units = [x["n_units"] for x in r["rows"]]
    return [Headline(f"Agents on the cost model, {min(units)}-{max(units)} units: hypervolume over the exact frontier's",
                     f"{span([x['hv_ratio'] for x in r['rows']], '{:.4f}')} over {len(units)} profiles",
                     measured(r, "cost model"))]


VIEWS = [
    View("agents_search", "The agents in the real search", "Each row one `python -m search.run` (hybrid reward, 4 "
         "agents, mostly `--no-warm-start`: every plan the agents measure is their own find; the search ranks plans on "
         "times paired with the all-keep step measured beside them, never faster than the baseline), then a quote apart "
         "from the search: the agents' own frontier, as many exact-solver plans (profiled cost model), the rules and "
         "recompute-every-expert-unit, each remeasured alike in interleaved rounds, and the exact plans once more as "
         "a control. Agents' frontier hypervolume over the exact plans', the rules no agent plan dominates (with how "
         "much slower the agents' fastest plan at no more memory is), the fastest fitting plans at 20 budgets, and "
         "the agents' fastest plan at the expert plan's memory against it. The quote's noise is the control's: how "
         "far apart the two quotes of the same exact plan lie (95th percentile); a difference within it is one the "
         "quote cannot tell from measurement alone. A rule the quote puts beyond that band is measured again beside "
         "the agents' plan it was compared with, in a second quote of as many rounds; it counts as beyond only where "
         "both quotes say so (rows quoted before the second quote existed show the first's verdict).",
         "python bench/agents_search.py", agents_search_table, agents_search_summary, agents_search_headlines),
    View("agents_scale", "Agents at 6 to 96 units (cost model)", "Budget-conditioned agents cloned from the exact "
         "solver, then PPO, against the exact frontier on the cost model.", "python bench/agents_scale.py",
         agents_scale_table, headlines=agents_scale_headlines),
]

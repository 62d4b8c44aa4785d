"""The agents in the real search, measured: their own plans against the exact solver's plans.

    python bench/agents_search.py                # the rows below, ~25 min on 2 cores
    python bench/agents_search.py --quick        # gpt/tiny only, for the smoke test

Each row is one ``python -m search.run`` with its defaults (hybrid reward, 4 agents, warm start
on so that the exact solver's plans are measured beside the agents', unless the row says
``--no-warm-start``), timed by the wall clock. From its ``report.json``: the hypervolume of the
agents' own measured plans over the exact plans' measured hypervolume (baseline-normalised), the
rules that no plan of the agents weakly dominates (measured), units, measurements and wall time.
Writes ``bench/results/agents_search.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import run_search, write_result  # noqa: E402

ROWS: list[list[str]] = [
    ["--workload", "gpt/small"],
    ["--workload", "gpt/small?n_layer=12", "--units", "sub-blocks"],
    ["--workload", "gpt/small?n_layer=12", "--units", "sub-blocks", "--no-warm-start"],
    ["--workload", "gpt/small?n_layer=24", "--units", "sub-blocks"],
    ["--workload", "hf/t5"],
    ["--workload", "diffusers/unet2d"],
]
QUICK: list[list[str]] = [["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "256", "--max-measurements", "12"]]


def beyond_agents(report: dict[str, Any]) -> list[str]:
    """Rules (measured) that no agent-proposed frontier plan weakly dominates."""
    mine = [p for p in report["frontier"] if any(s.startswith("agent") for s in p["found_by"])]
    return [r["rule"] for r in report["rules"]
            if not any(p["peak_bytes"] <= r["peak_bytes"] and p["step_seconds"] <= r["step_seconds"] for p in mine)]


def run(flags: Sequence[str]) -> dict[str, Any]:
    rep, wall = run_search(["--no-batch-scaling", "--peers", "none", *flags])
    hv = rep["hypervolume"]
    row = {"flags": " ".join(flags), "workload": rep["workload"], "units": rep["units"], "measured": rep["measured"],
           "evaluations": rep["evaluations"], "wall_seconds": wall, "clock": rep["clock"],
           "hv_frontier": hv["frontier"], "hv_agents_own": hv["agents_only"], "hv_exact_measured": hv["exact_measured"],
           "agents_over_exact": hv["agents_over_exact"], "rules_beyond_agents": beyond_agents(rep),
           "load_average_1": os.getloadavg()[0]}
    print(f"{row['flags']}: {row['units']} units, agents/exact {row['agents_over_exact']}, "
          f"rules beyond {row['rules_beyond_agents']}, {wall:.0f} s", file=sys.stderr)
    return row


def _rules(names: list[str]) -> str:
    """Rule names, the all-keep rule ``none`` spelled as the baseline; no rule at all as such."""
    return ", ".join("none (the baseline)" if n == "none" else n for n in names) or "no rule"


def markdown(result: dict[str, Any]) -> str:
    out = ["| search | units | measured | agents' own HV | exact plans' HV (measured) | agents / exact | rules beyond "
           "the agents' own frontier | wall s |", "|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in result["rows"]:
        ratio = f"{r['agents_over_exact']:.3f}" if r["agents_over_exact"] is not None else "n/a (no warm start)"
        out.append(f"| `{r['flags']}` | {r['units']} | {r['measured']} | {r['hv_agents_own']:.4f} | "
                   f"{r['hv_exact_measured']:.4f} | {ratio} | {_rules(r['rules_beyond_agents'])} | "
                   f"{r['wall_seconds']:.0f} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, help="result file (default bench/results/agents_search.json)")
    args = ap.parse_args(argv)
    rows = [run(flags) for flags in (QUICK if args.quick else ROWS)]
    result = {"rows": rows}
    print(markdown(result))
    print(write_result("agents_search", result, args.out))


if __name__ == "__main__":
    main()

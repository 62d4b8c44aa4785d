"""The times a search reports against the same plans timed side by side afterwards.

    python bench/reported_vs_quote.py            # gpt/small?n_layer=12 at sub-block units (48), 5 rounds
    python bench/reported_vs_quote.py --quick    # gpt/tiny with tiny budgets, 2 rounds: the smoke test

A user reads a plan's step time off the frontier as a ratio to the baseline's ("recompute 48:
+31%"); that ratio is what they trade memory for. This runs ``python -m search.run`` with
``--flags``, takes the frontier it reports (``report.json``: the points frontier.json, the report
and the dashboard show, with their times as the search ranked them), and then quotes every one of
those plans and the baseline apart from the search: a fresh Evaluator in this process, warmed up as
the search's are, measures them in ``--rounds`` rounds (forward, then backward: a drift over a
round reaches every plan alike), each measurement the search's repeats of timed steps. A plan's
quoted ratio is the median over rounds of its median step over the baseline's median step in the
same round (the baseline's own frontier point is 1.0 both ways and left out). Per plan: reported ratio, quoted ratio (and its range over rounds) and the error
``reported / quoted - 1``. Clock: the measuring thread's CPU time (``thread-cpu``), as the search
measures; the search's wall time by ``time.perf_counter``; the load average before each part.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from env.data.rounds import serpentine  # noqa: E402
from bench.measuring import run_search  # noqa: E402
from env.data.errors import CkptSearchError  # noqa: E402
from env.data.measured import MeasuredPlan  # noqa: E402
from env.data.types import MIB  # noqa: E402

FULL_FLAGS = ["--workload", "gpt/small?n_layer=12", "--units", "sub-blocks"]
QUICK_FLAGS = ["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "256", "--chunk-timesteps", "128",
               "--max-measurements", "10", "--repeats", "1", "--no-batch-scaling", "--peers", "none"]
GOAL = 0.05  # a reported ratio within 5% of its quote


def options(ap) -> None:  # type: ignore[no-untyped-def]
    ap.add_argument("--flags", nargs="+", default=FULL_FLAGS, help="the search's flags (after python -m search.run)")
    ap.add_argument("--rounds", type=int, default=5, help="side-by-side rounds of the quote")


def quote(run_dir: Path, frontier: list[dict], rounds: int) -> tuple[dict[str, list[MeasuredPlan]], list[str]]:
    """Every frontier plan and the baseline measured in ``rounds`` serpentine rounds by a fresh Evaluator."""
    from search.engine.evaluator import Evaluator
    from search.records.store import RunStore

    cfg = json.loads((run_dir / "config.json").read_text())
    with RunStore(run_dir, readonly=True) as store:
        units = list(store.get_meta("profile").units)
    ev = Evaluator(cfg["workload"], int(cfg["seed"]), units, cfg["actions"], int(cfg["repeats"]), "cpu",
                   int(cfg["measure_threads"]) or None, name="quote")
    if list(ev.units) != units:
        raise CkptSearchError(f"{cfg['workload']}: the quoting Evaluator resolved other units than the search's")
    keep = ["keep"] * len(units)
    plans = {"baseline": keep, **{_label(p, k): [p["plan"][u] for u in units] for k, p in enumerate(frontier)
                                  if [p["plan"][u] for u in units] != keep}}  # the baseline is quoted once a round
    names = list(plans)
    ev.warm_up()
    got: dict[str, list[MeasuredPlan]] = {n: [] for n in names}
    for r in range(rounds):
        for name in serpentine(names, r):
            got[name].append(ev.evaluate(plans[name], "quote", again=True))
    return got, units


def _label(point: dict, k: int) -> str:
    return f"{k}: {point['peak_bytes'] / MIB:.2f} MiB"


def _median(ms: list[MeasuredPlan]) -> float:
    return statistics.median(s for m in ms for s in m.step_seconds_samples)


def measure(run: Run) -> None:
    args = run.args
    flags = QUICK_FLAGS if args.quick else list(args.flags)
    with tempfile.TemporaryDirectory(prefix="bench_quote_") as tmp:
        load_search = os.getloadavg()
        report, wall = run_search(flags, Path(tmp))
        frontier, base = report["frontier"], report["baseline"]
        load_quote = os.getloadavg()
        got, units = quote(Path(tmp) / "run", frontier, args.rounds)
    base_rounds = [m.step_seconds for m in got["baseline"]]
    rows = []
    for k, p in enumerate(frontier):
        if _label(p, k) not in got:
            continue  # the baseline itself: 1.0 reported and quoted, by definition
        ms = got[_label(p, k)]
        per_round = [m.step_seconds / b for m, b in zip(ms, base_rounds)]
        quoted = statistics.median(per_round)
        reported = p["step_seconds"] / base["step_seconds"]
        rows.append({"plan": p["plan"], "found_by": p["found_by"], "peak_bytes": p["peak_bytes"],
                     "quoted_peak_bytes": ms[0].peak_bytes, "reported_ratio": reported,
                     "search_measurements": p["n_measurements"], "quoted_ratio": quoted,
                     "quoted_ratio_rounds": per_round, "pooled_ratio": _median(ms) / _median(got["baseline"]),
                     "error": reported / quoted - 1})
    run.result.update({"command": "python -m search.run " + " ".join(flags), "units": len(units),
                       "search_wall_seconds": wall, "clock": report["clock"], "rounds": args.rounds,
                       "baseline_search_seconds": base["step_seconds"],
                       "baseline_quote_seconds": statistics.median(base_rounds),
                       "paired": report.get("paired"), "references": report.get("references"),
                       "load_average_search": load_search, "load_average_quote": load_quote, "rows": rows,
                       "max_abs_error": max(abs(r["error"]) for r in rows), "goal": GOAL,
                       "within_goal": sum(abs(r["error"]) <= GOAL for r in rows)})


BENCH = Bench("reported_vs_quote", __doc__, options=options, quick={"rounds": 2})

if __name__ == "__main__":
    main(BENCH, measure)

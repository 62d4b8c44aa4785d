"""A compiled search against an eager one: ``python -m search.run --compile`` beside ``python -m search.run``.

    python bench/compiled_search.py              # gpt/small, 2 rounds: about 15 minutes on 2 cores
    python bench/compiled_search.py --quick      # gpt/tiny, tiny budgets, the compiled search only: the smoke test

Each round runs the eager search, then the same search with ``--compile`` (``--compile-scope units``:
each unit's variant compiled once and reused by every plan), one after the other, so both see the
same load. The first compiled run compiles with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR``
a fresh folder: what a first search on a machine pays); later ones reuse that cache, as a user's
second search does. Clocks: each run's wall time by ``time.perf_counter`` around the CLI (what a
user waits); step times by the clock the search measures with (``thread-cpu`` on CPU). Kept per
run: plans measured, hypervolume of the measured frontier, the run's phase clock, its frontier,
the peers measured beside it (compiled whole, as their users compile them) and the load average before it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from bench.measuring import run_search  # noqa: E402

QUICK_FLAGS = ["--agents", "2", "--timesteps", "256", "--chunk-timesteps", "128", "--max-measurements", "8", "--peers", "none",
               "--repeats", "1", "--no-batch-scaling"]


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workload", default="gpt/small", help="workload of both searches")
    ap.add_argument("--rounds", type=int, default=2, help="eager-then-compiled rounds")
    ap.add_argument("--compile-scope", default="units", choices=("units", "model"), help="what --compile compiles")
    ap.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                    help="run the eager search before each compiled one (--no-eager: the compiled search only)")
    ap.add_argument("--cold", action=argparse.BooleanOptionalAction, default=True,
                    help="compile the first round into an empty inductor cache (--no-cold: the machine's cache)")


def _run(flags: list[str], cache: str | None) -> tuple[dict, float, tuple[float, float, float]]:
    load = os.getloadavg()
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # the CLI's subprocess (and its Ray workers) inherit it
    try:
        report, wall = run_search(flags)
    finally:
        if cache and previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        elif cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous  # type: ignore[assignment]
    return report, wall, load


def _row(mode: str, round_: int, report: dict, wall: float, load: tuple[float, float, float],
         cache: str) -> dict:
    frontier, base = report["frontier"], report["baseline"]
    return {"mode": mode, "round": round_, "wall_seconds": wall, "measured": report["measured"],
            "evaluations": report["evaluations"], "hypervolume": report["hypervolume"]["frontier"],
            "baseline": base, "lowest": frontier[0], "frontier_points": len(frontier), "clock": report["clock"],
            "phase_seconds": report.get("phase_seconds"), "evaluator_seconds": report.get("evaluator_seconds"),
            "frontier": frontier, "peers": report.get("peers"),
            "inductor_cache": cache, "load_average_before": load}


def measure(run: Run) -> None:
    args = run.args
    base_flags = ["--workload", "gpt/tiny" if args.quick else args.workload] + (QUICK_FLAGS if args.quick else [])
    compiled_flags = [*base_flags, "--compile", "--compile-scope", args.compile_scope]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench_inductor_") as cold:
        for k in range(args.rounds):
            if args.eager:
                report, wall, load = _run(base_flags, None)
                rows.append(_row("eager", k, report, wall, load, ""))
            # with --cold, round 0 compiles into an empty inductor cache and later rounds reuse what it left
            report, wall, load = _run(compiled_flags, cold if args.cold else None)
            rows.append(_row("compiled", k, report, wall, load, "machine's" if not args.cold else
                             "empty" if k == 0 else "warm"))
    eager = [r["wall_seconds"] for r in rows if r["mode"] == "eager"]
    compiled = [r["wall_seconds"] for r in rows if r["mode"] == "compiled"]
    ratios = [c / e for c, e in zip(compiled, eager)]
    run.result.update({"workload": base_flags[1], "command_eager": "python -m search.run " + " ".join(base_flags),
                       "command_compiled": "python -m search.run " + " ".join(compiled_flags), "rows": rows,
                       "wall_ratio_per_round": ratios,
                       "wall_ratio_median": statistics.median(ratios) if ratios else None})


BENCH = Bench("compiled_search", __doc__, options=options, quick={"rounds": 1, "eager": False, "cold": False})

if __name__ == "__main__":
    main(BENCH, measure)

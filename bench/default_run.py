"""The default run, as the README's first command starts it: ``python -m search.run``, defaults only.

    python bench/default_run.py                               # a few minutes on 2 cores
    python bench/default_run.py --against 9de9323 --rounds 2  # side by side with an earlier revision
    python bench/default_run.py --quick                       # gpt/tiny with tiny budgets, for the smoke test

Runs the CLI in a subprocess into a temporary folder and keeps what its ``report.json`` says
(evaluations, measurements, the frontier, the peers, the units, where the wall time went by
phase). Clocks: the run's wall time by ``time.perf_counter`` around the subprocess (what a user
waits); the frontier's step times by the clock the search measures with (named in the result,
``thread-cpu`` on CPU). The load average before each run is recorded beside it.

``--against REV`` answers "is it faster than it was" on a machine whose speed moves by 20% from
one hour to the next: the same default search from this tree and from ``REV`` (a detached git
worktree of this repository, on ``PYTHONPATH`` so that the driver and its Ray workers import
that revision's code, with this environment's packages), ``--rounds`` rounds alternating which
goes first. The file's top-level figures are this tree's first run; ``against`` holds every run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, BenchError  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from bench.measuring import run_search  # noqa: E402

QUICK_FLAGS = ["--workload", "gpt/tiny", "--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128",
               "--max-measurements", "12", "--repeats", "1", "--no-batch-scaling"]
KEPT = ("workload", "batch_shape", "device", "clock", "units", "evaluations", "measured", "baseline", "frontier",
        "hypervolume", "rules", "peers", "events", "measurement_mode", "unit_choice", "headroom", "phase_seconds",
        "evaluator_seconds")


@contextmanager
def revision(rev: str) -> Iterator[Path]:
    """A detached worktree of this repository at ``rev``, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench_default_run_") as tmp:
        tree = Path(tmp) / "tree"
        done = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BenchError(f"--against {rev}: git worktree add failed: {done.stderr.strip()[-300:]}; "
                             "give a commit of this repository")
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def one_run(flags: list[str], tree: Path | None) -> dict[str, Any]:
    """One default search, from this tree or from ``tree``: its report's figures, wall seconds and load."""
    load_before = os.getloadavg()
    report, wall = run_search(flags, cwd=tree)
    return {"wall_seconds": wall, "load_average_before": load_before, **{k: report.get(k) for k in KEPT}}


def measure(run: Run) -> None:
    args = run.args
    flags = QUICK_FLAGS if args.quick else []
    run.result["command"] = "python -m search.run " + " ".join(flags)
    if not args.against:
        run.result.update(one_run(flags, None))
        return
    runs: list[dict[str, Any]] = []
    with revision(args.against) as tree:
        for r in range(args.rounds):
            for who in (("this", args.against) if r % 2 == 0 else (args.against, "this")):
                row = one_run(flags, None if who == "this" else tree)
                runs.append({"tree": who, "round": r, **{k: row[k] for k in (
                    "wall_seconds", "load_average_before", "measured", "hypervolume", "phase_seconds",
                    "evaluator_seconds")}})
                if who == "this" and "workload" not in run.result:
                    run.result.update(row)
                print(f"{who}: {row['wall_seconds']:.0f} s", file=sys.stderr)
    walls = {who: [x["wall_seconds"] for x in runs if x["tree"] == who] for who in ("this", args.against)}
    run.result["against"] = {"revision": args.against, "rounds": args.rounds, "runs": runs,
                             "median_wall_seconds": {k: statistics.median(v) for k, v in walls.items()}}


def options(ap: Any) -> None:
    ap.add_argument("--against", default="", help="an earlier revision (a commit) to run side by side with this tree")
    ap.add_argument("--rounds", type=int, default=2, help="with --against: rounds of one run each, alternating order")


BENCH = Bench("default_run", __doc__, options)

if __name__ == "__main__":
    main(BENCH, measure)

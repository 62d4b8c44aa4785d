"""The default run, as the README's first command starts it: ``python -m search.run``, defaults only.

    python bench/default_run.py            # a few minutes on 2 cores
    python bench/default_run.py --quick    # gpt/tiny with tiny budgets, for the smoke test

Runs the CLI in a subprocess into a temporary folder and keeps what its ``report.json`` says
(evaluations, measurements, the frontier, the peers, the units). Clocks: the run's wall time by
``time.perf_counter`` around the subprocess (what a user waits); the frontier's step times by the
clock the search measures with (named in the result, ``thread-cpu`` on CPU). One run, on whatever
else the machine does: the load average before, during and after is recorded beside it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from bench.measuring import run_search  # noqa: E402

QUICK_FLAGS = ["--workload", "gpt/tiny", "--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128",
               "--max-measurements", "12", "--repeats", "1", "--no-batch-scaling"]
KEPT = ("workload", "batch_shape", "device", "clock", "units", "evaluations", "measured", "baseline", "frontier",
        "hypervolume", "rules", "peers", "events", "measurement_mode", "unit_choice", "headroom", "phase_seconds",
        "evaluator_seconds")


def measure(run: Run) -> None:
    flags = QUICK_FLAGS if run.args.quick else []
    load_before = os.getloadavg()
    report, wall = run_search(flags)
    run.result.update({"command": "python -m search.run " + " ".join(flags), "wall_seconds": wall,
                       "load_average_before": load_before, **{k: report.get(k) for k in KEPT}})


BENCH = Bench("default_run", __doc__)

if __name__ == "__main__":
    main(BENCH, measure)

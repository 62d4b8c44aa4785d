"""The default run, as the README's first command starts it: ``python -m search.run``, defaults only.

    python bench/default_run.py            # a few minutes on 2 cores
    python bench/default_run.py --quick    # gpt/tiny with tiny budgets, for the smoke test

Runs the CLI in a subprocess into a temporary folder, times it by the wall clock, and keeps
what its ``report.json`` says (evaluations, measurements, the frontier, the peers, the units).
Writes ``bench/results/default_run.json``; the README's numbers quote it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import run_search, write_result  # noqa: E402

QUICK = ["--workload", "gpt/tiny", "--agents", "2", "--timesteps", "256", "--chunk-timesteps", "128",
         "--max-measurements", "12", "--repeats", "1", "--no-batch-scaling"]


def run(extra: Sequence[str]) -> dict[str, Any]:
    load_before = os.getloadavg()
    report, wall = run_search(extra)
    keep = ("workload", "batch_shape", "device", "clock", "units", "evaluations", "measured", "baseline", "frontier",
            "hypervolume", "rules", "peers", "events", "measurement_mode", "unit_choice", "headroom")
    return {"command": "python -m search.run " + " ".join(extra), "wall_seconds": wall,
            "load_average_before": load_before, **{k: report.get(k) for k in keep}}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="gpt/tiny, tiny budgets (smoke test)")
    ap.add_argument("--out", type=Path, help="result file (default bench/results/default_run.json)")
    args = ap.parse_args(argv)
    result = run(QUICK if args.quick else [])
    f, b = result["frontier"], result["baseline"]
    print(f"{result['wall_seconds']:.0f} s, {result['measured']} measured, {len(f)} frontier points; "
          f"baseline {b['peak_bytes'] / 2**20:.1f} MiB -> {f[0]['peak_bytes'] / 2**20:.1f} MiB", file=sys.stderr)
    print(write_result("default_run", result, args.out))


if __name__ == "__main__":
    main()

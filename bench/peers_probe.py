"""Compiled training and its peers on one workload: peak and step time, eager and compiled.

    python bench/peers_probe.py                       # gpt/small, budgets 1.0, 0.5, 0.0
    python bench/peers_probe.py --quick               # gpt/tiny, seconds

Measures, with the project's own measurement (``env.measure.measurement``; CPU peak from the
profiler's memory events, step time on the thread-CPU clock with ``--threads`` torch threads):

- eager: no checkpointing, and our recompute-all plan;
- compiled (``torch.compile``, fullgraph, fresh per row): ``activation_memory_budget`` at each
  ``--budgets`` value (the peer ``compile-budget-B``; 1.0 is plain ``torch.compile``), and our
  recompute-all plan applied before compiling.

Each compiled row compiles from an empty inductor cache (a temporary ``TORCHINDUCTOR_CACHE_DIR``)
unless ``--warm-cache``, so ``compile_s`` is a cold compile. Rows are measured one after the
other, ``--repeats`` timed steps each, not interleaved: time figures carry the machine's load
over the minutes they took (the load at the start is recorded beside them).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from env.data.measured import MeasuredPlan  # noqa: E402
from env.data.types import MIB  # noqa: E402
from env.measure.measurement import measure as measure_plan  # noqa: E402
from env.measure.peers import compile_budget_peer, measure_peer  # noqa: E402
from env.runtime.apply import plan_for  # noqa: E402
from env.units.find import find_units  # noqa: E402
from env.workloads.workload import load_workload  # noqa: E402


def row(name: str, m: MeasuredPlan, note: str = "") -> dict[str, Any]:
    return {"name": name, "peak_mb": m.peak_bytes / MIB, "activation_mb": m.activation_bytes / MIB,
            "step_ms": m.step_seconds * 1e3, "spread_ms": m.spread_seconds * 1e3, "clock": m.clock,
            "compile_s": m.compile_seconds, "recompiles": m.recompiles, "graph_breaks": m.graph_breaks, "note": note}


def measure(run: Run) -> None:
    args = run.args
    w = load_workload(args.workload)
    units = find_units(w.model)
    keep = plan_for(w.model, units, ["keep"] * len(units))
    recompute = plan_for(w.model, units, ["recompute"] * len(units))

    def cold() -> None:
        if not args.warm_cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")

    rows = [row("eager, no checkpointing", measure_plan(w, keep, units, repeats=args.repeats)),
            row("eager, recompute-all plan", measure_plan(w, recompute, units, repeats=args.repeats))]
    for b in (float(b) for b in args.budgets.split(",")):
        cold()
        peer = compile_budget_peer(b)
        rows.append(row(f"compiled, activation_memory_budget={b}", measure_peer(w, peer, repeats=args.repeats), peer.note))
    cold()
    rows.append(row("compiled, recompute-all plan", measure_plan(w, recompute, units, repeats=args.repeats, compile=True)))
    run.result.update({"workload": args.workload, "units": units, "repeats": args.repeats, "rows": rows})


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workload", default="gpt/small")
    ap.add_argument("--budgets", default="1.0,0.5,0.0", help="activation_memory_budget values, comma-separated")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per row")
    ap.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk cache (compile_s then warm)")


BENCH = Bench("peers_probe", __doc__, options, quick={"workload": "gpt/tiny", "repeats": 2}, threads=1)

if __name__ == "__main__":
    main(BENCH, measure)

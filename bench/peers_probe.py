"""Compiled training and its peers on one workload: peak and step time, eager and compiled.

Measures, with the project's own measurement (``env.measure.measurement``; CPU peak from the profiler's
memory events, step time on the thread-CPU clock with one torch thread):

- eager: no checkpointing, and our recompute-all plan;
- compiled (``torch.compile``, fullgraph, fresh per row): ``activation_memory_budget`` at each
  ``--budgets`` value (the peer ``compile-budget-B``; 1.0 is plain ``torch.compile``), and our
  recompute-all plan applied before compiling.

Each compiled row compiles from an empty inductor cache (a temporary ``TORCHINDUCTOR_CACHE_DIR``)
unless ``--warm-cache``, so ``compile_s`` is a cold compile. Rows are measured one after the
other, ``--repeats`` timed steps each; time figures on a shared machine carry its load (written
beside them).

    python bench/peers_probe.py                       # gpt/small, budgets 1.0, 0.5, 0.0
    python bench/peers_probe.py --quick               # gpt/tiny, seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import set_threads, write_result  # noqa: E402
from env.data.measured import MeasuredPlan as Measurement  # noqa: E402
from env.measure.measurement import measure  # noqa: E402
from env.measure.peers import compile_budget_peer, measure_peer  # noqa: E402
from env.runtime.apply import plan_for  # noqa: E402
from env.units.find import find_units  # noqa: E402
from env.workloads.workload import load_workload  # noqa: E402

MIB = 2 ** 20


def row(name: str, m: Measurement, note: str = "") -> dict[str, Any]:
    return {"name": name, "peak_mib": m.peak_bytes / MIB, "activation_mib": m.activation_bytes / MIB,
            "step_ms": m.step_seconds * 1e3, "spread_ms": m.spread_seconds * 1e3, "clock": m.clock,
            "compile_s": m.compile_seconds, "recompiles": m.recompiles, "graph_breaks": m.graph_breaks, "note": note}


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="gpt/small")
    p.add_argument("--budgets", default="1.0,0.5,0.0", help="activation_memory_budget values, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per row")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk cache (compile_s then warm)")
    p.add_argument("--quick", action="store_true", help="gpt/tiny, 2 timed steps")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    spec, repeats = ("gpt/tiny", 2) if args.quick else (args.workload, args.repeats)
    set_threads(args.threads)
    budgets = [float(b) for b in args.budgets.split(",")]

    w = load_workload(spec)
    units = find_units(w.model)
    keep = plan_for(w.model, units, ["keep"] * len(units))
    recompute = plan_for(w.model, units, ["recompute"] * len(units))
    rows = []

    def cold() -> None:
        if not args.warm_cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")

    rows.append(row("eager, no checkpointing", measure(w, keep, units, repeats=repeats)))
    rows.append(row("eager, recompute-all plan", measure(w, recompute, units, repeats=repeats)))
    for b in budgets:
        cold()
        peer = compile_budget_peer(b)
        rows.append(row(f"compiled, activation_memory_budget={b}", measure_peer(w, peer, repeats=repeats), peer.note))
    cold()
    rows.append(row("compiled, recompute-all plan", measure(w, recompute, units, repeats=repeats, compile=True)))

    print(f"{spec}, {args.threads} thread(s), {repeats} timed steps a row")
    print(f"{'':42s} {'peak MiB':>9s} {'act MiB':>8s} {'step ms':>8s} {'±':>6s} {'compile s':>9s}")
    for r in rows:
        c = "" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
        print(f"{r['name']:42s} {r['peak_mib']:9.2f} {r['activation_mib']:8.2f} {r['step_ms']:8.1f} "
              f"{r['spread_ms']:6.1f} {c:>9s}")
    return write_result("peers_probe", {"workload": spec, "units": units, "repeats": repeats, "rows": rows},
                        args.out)


if __name__ == "__main__":
    print(main())

"""Chain regions against recomputing each unit and against ``checkpoint_sequential``: measured peaks, and the
exact solver's lowest predicted peak and cost with and without ``chain``.

    python bench/chains.py            # gpt/small?n_layer=12 at sub-block units (48)
    python bench/chains.py --quick    # gpt/tiny?n_layer=8 at sub-block units (32)

Per workload: the decision units, which neighbours chain (``env.runtime.chains.chain_links``: hooks, then a real
step of the chained plan against the unplanned one), and the measured peak (profiler memory events: exact, whatever
the load) of keep everything, recompute every unit, recompute where units do not chain and chain where they do, and
the ``checkpoint_sequential`` peers. Then the profile, and the exact solver on it with and without ``chain``: its
lowest predicted peak and its CPU seconds (median of ``--solves``, one thread), exactly (relative 0) and as the
search runs it (relative 0.005). Writes ``bench/results/chains.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=["gpt/small?n_layer=12"])
    ap.add_argument("--units", default="sub-block", help="unit rule (env.units.find.find_units)")
    ap.add_argument("--solves", type=int, default=3, help="exact solves timed per setting")


BENCH = Bench("chains", __doc__, options=options, threads=1, rows="workloads",
              quick={"workloads": ["gpt/tiny?n_layer=8"], "solves": 1})


def solver_seconds(profile, with_chain: bool, relative: float, solves: int) -> dict:
    from agents.exact import exact_frontier
    from env.cost.cost_model import CostModel
    from env.data.plan import Action

    cm = CostModel(profile)
    actions = [i for i, a in enumerate(profile.actions) if with_chain or a != Action.CHAIN]
    seconds, front = [], []
    for _ in range(solves):
        t0 = time.process_time()
        front = exact_frontier(cm, actions, relative=relative)
        seconds.append(time.process_time() - t0)
    return {"chain": with_chain, "relative": relative, "cpu_seconds": statistics.median(seconds),
            "points": len(front), "lowest_predicted_peak_bytes": front[0].peak_bytes}


def measure(run: Run) -> None:
    from env.data.plan import Action
    from env.measure.measurement import measure as measure_plan
    from env.measure.peers import measure_peer, peers_for
    from env.measure.profiler import profile
    from env.runtime.apply import plan_for
    from env.runtime.chains import chain_links
    from env.units.find import find_units
    from env.workloads.workload import load_workload

    for spec in run.args.workloads:
        w = load_workload(spec)
        units = find_units(w.model, run.args.units)
        links = chain_links(w, units)
        plans = {"keep every unit": ["keep"] * len(units), "recompute every unit": ["recompute"] * len(units),
                 "chain where units chain": ["chain" if link else "recompute" for link in links]}
        peaks = {name: measure_plan(w, plan_for(w.model, units, acts), units, repeats=1).peak_bytes
                 for name, acts in plans.items()}
        for peer in peers_for(w, budgets=()):
            if peer.name.startswith("checkpoint-sequential"):
                peaks[peer.name] = measure_peer(w, peer, repeats=1).peak_bytes
        prof = profile(w, units, [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.CHAIN], repeats=1)
        solver = [solver_seconds(prof, c, rel, run.args.solves) for c in (False, True) for rel in (0.0, 0.005)]
        run.add_row({"workload": spec, "units": len(units), "unit_rule": run.args.units, "links": sum(links),
                     "peaks_bytes": peaks, "solver": solver})


if __name__ == "__main__":
    main(BENCH, measure)

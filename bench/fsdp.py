"""One device against FSDP2 ranks: how much a plan saves per rank, and whether sharding changes the best plan.

    python bench/fsdp.py            # gpt/small and hf/llama, two searches each (tens of minutes; a quiet machine)
    python bench/fsdp.py --quick    # gpt/tiny with tiny budgets, for the smoke test

For each workload, one search on one device and one under FSDP2 with two ranks (``--fsdp 2``: gloo on
CPU), with the same flags. Per setting: the baseline peak (per rank under FSDP) and the part of it held
before the step (parameters, gradients, optimizer state, batch), the lowest measured peak and its saving.
Then, at each per-rank cap the FSDP frontier offers, the FSDP search's fastest plan under it against the
plan the one-device search gives for the same activation budget (the cap less what a rank holds before
its step, against each one-device plan's peak less what one device holds): whether the two differ, and
where the FSDP search measured the one-device pick, its per-rank peak and time. Every number is a search's
own measurement; step times are each setting's clock (the slowest rank's under FSDP), so compare times
within a setting only. Writes ``bench/results/fsdp.json``.
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
from bench.measuring import run_search  # noqa: E402
from env.data.errors import CkptSearchError  # noqa: E402
from env.data.plan import action_summary  # noqa: E402
from search.records.pareto import fastest_within  # noqa: E402
from search.records.store import RunStore  # noqa: E402

RANKS = 2
WORKLOADS = ["gpt/small", "hf/llama"]
QUICK = ["--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128", "--max-measurements", "10",
         "--repeats", "1", "--no-batch-scaling", "--peers", "none"]


def setting(report: dict[str, Any], wall: float) -> dict[str, Any]:
    """What one search says of its setting: baseline, what is held before the step, the lowest peak."""
    base, front = report["baseline"], report["frontier"]
    low = min(front, key=lambda p: p["peak_bytes"])
    return {"device": report["device"], "clock": report["clock"], "wall_seconds": wall,
            "measured": report["measured"], "units": report["units"],
            "baseline_peak_bytes": base["peak_bytes"], "baseline_step_seconds": base["step_seconds"],
            "held_before_step_bytes": report["baseline_live_before_bytes"],
            "held_share_of_peak": report["baseline_live_before_bytes"] / base["peak_bytes"],
            "lowest_peak_bytes": low["peak_bytes"], "lowest_peak_saving": 1 - low["peak_bytes"] / base["peak_bytes"],
            "lowest_peak_plan": action_summary(low["plan"].values()), "frontier_points": len(front)}


def picks(one: dict[str, Any], fsdp: dict[str, Any], fsdp_store: Path) -> list[dict[str, Any]]:
    """At each per-rank cap of the FSDP frontier: the FSDP pick against the one-device pick for that activation
    budget, and the one-device pick's per-rank numbers where the FSDP search measured that plan."""
    with RunStore(fsdp_store, readonly=True) as s:
        measured = {tuple(m.actions): m for m in s.measured() if not m.oom}
    units = list(fsdp["frontier"][0]["plan"])
    if set(units) != set(one["frontier"][0]["plan"]):
        raise CkptSearchError("the two searches chose different decision units; give both the same --units")
    f_front, o_front = fsdp["frontier"], one["frontier"]
    held_f, held_o = fsdp["baseline_live_before_bytes"], one["baseline_live_before_bytes"]
    rows = []
    for cap in sorted({p["peak_bytes"] for p in f_front}):
        f = f_front[fastest_within([p["peak_bytes"] for p in f_front], [p["step_seconds"] for p in f_front], cap)]
        budget = cap - held_f  # the activation budget a rank has under this cap
        k = fastest_within([p["peak_bytes"] - held_o for p in o_front], [p["step_seconds"] for p in o_front], budget)
        o = o_front[k] if k is not None else None
        o_actions = tuple(o["plan"][u] for u in units) if o else None
        under_fsdp = measured.get(o_actions) if o_actions else None
        rows.append({"cap_bytes": cap, "activation_budget_bytes": budget,
                     "fsdp_pick": action_summary(f["plan"].values()), "fsdp_peak_bytes": f["peak_bytes"],
                     "fsdp_step_seconds": f["step_seconds"],
                     "one_device_pick": action_summary(o["plan"].values()) if o else None,
                     "differs": o is None or o["plan"] != f["plan"],  # plans of one model's units, unit by unit
                     "one_device_pick_under_fsdp": None if under_fsdp is None else {
                         "peak_bytes": under_fsdp.peak_bytes, "step_seconds": under_fsdp.step_seconds,
                         "fits_cap": under_fsdp.peak_bytes <= cap}})
    return rows


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS, help="workload specs")
    ap.add_argument("--keep", type=Path,
                    help="keep each search's run folder under this folder (one_<i>/run, fsdp_<i>/run) to inspect it")
    ap.add_argument("--search", nargs=argparse.REMAINDER, default=[], help="further search.run flags, for both")


BENCH = Bench("fsdp", __doc__, options=options, rows="workloads", row_id=lambda r: r["workload"],
              quick={"workloads": ["gpt/tiny"]})


def measure(run: Run) -> None:
    flags = [*(QUICK if run.args.quick else []), *run.args.search]
    run.result.update({"ranks": RANKS, "flags": flags})
    with tempfile.TemporaryDirectory(prefix="bench_fsdp_") as tmp:
        folder = run.args.keep or Path(tmp)
        for i, workload in enumerate(run.args.workloads):
            load = os.getloadavg()
            one, one_wall = run_search(["--workload", workload, *flags], out=folder / f"one_{i}")
            fsdp_dir = folder / f"fsdp_{i}"
            fsdp, fsdp_wall = run_search(["--workload", workload, *flags, "--fsdp", str(RANKS)], out=fsdp_dir)
            rows = picks(one, fsdp, fsdp_dir / "run" / "store.sqlite")
            run.add_row({"workload": workload, "load_average_before": list(load),
                         "one_device": setting(one, one_wall), f"fsdp_{RANKS}_ranks": setting(fsdp, fsdp_wall),
                         "caps": rows, "caps_where_the_pick_differs": sum(r["differs"] for r in rows)})


if __name__ == "__main__":
    main(BENCH, measure)

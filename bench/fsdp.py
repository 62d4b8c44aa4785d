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
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import write_result  # noqa: E402
from env.data.plan import action_summary  # noqa: E402
from search.records.pareto import fastest_within  # noqa: E402
from search.records.store import RunStore  # noqa: E402

RANKS = 2
WORKLOADS = ("gpt/small", "hf/llama")
QUICK_WORKLOADS = ("gpt/tiny",)
QUICK = ["--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128", "--max-measurements", "10",
         "--repeats", "1", "--no-batch-scaling", "--peers", "none"]
MIB = 2 ** 20


def search(workload: str, flags: Sequence[str], folder: Path, name: str) -> tuple[dict[str, Any], float]:
    """``python -m search.run`` into ``folder/name``: its report.json and the wall seconds it took."""
    cmd = [sys.executable, "-m", "search.run", "--workload", workload, "--no-progress", "--out", str(folder),
           "--name", name, *flags]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    return json.loads((folder / name / "report.json").read_text()), wall


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
        raise SystemExit("the two searches chose different decision units; give both the same --units")
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


def run(workloads: Sequence[str], flags: Sequence[str]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_fsdp_") as tmp:
        folder = Path(tmp)
        for i, workload in enumerate(workloads):
            load = os.getloadavg()
            one, one_wall = search(workload, flags, folder, f"one_{i}")
            fsdp, fsdp_wall = search(workload, [*flags, "--fsdp", str(RANKS)], folder, f"fsdp_{i}")
            rows = picks(one, fsdp, folder / f"fsdp_{i}" / "store.sqlite")
            out.append({"workload": workload, "load_average_before": load, "one_device": setting(one, one_wall),
                        f"fsdp_{RANKS}_ranks": setting(fsdp, fsdp_wall), "caps": rows,
                        "caps_where_the_pick_differs": sum(r["differs"] for r in rows)})
    return {"ranks": RANKS, "flags": list(flags), "workloads": out}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="gpt/tiny, tiny budgets (smoke test)")
    ap.add_argument("--workloads", nargs="+", help=f"workload specs (default: {' '.join(WORKLOADS)})")
    ap.add_argument("--out", type=Path, help="result file (default bench/results/fsdp.json)")
    args = ap.parse_args(argv)
    workloads = args.workloads or (QUICK_WORKLOADS if args.quick else WORKLOADS)
    result = run(workloads, QUICK if args.quick else [])
    for w in result["workloads"]:
        one, fs = w["one_device"], w[f"fsdp_{RANKS}_ranks"]
        print(f"{w['workload']}: baseline {one['baseline_peak_bytes'] / MIB:.1f} MiB one device, "
              f"{fs['baseline_peak_bytes'] / MIB:.1f} MiB per rank; lowest {one['lowest_peak_saving']:.0%} / "
              f"{fs['lowest_peak_saving']:.0%} lower; the pick differs at {w['caps_where_the_pick_differs']} of "
              f"{len(w['caps'])} caps", file=sys.stderr)
    print(write_result("fsdp", result, args.out))


if __name__ == "__main__":
    main()

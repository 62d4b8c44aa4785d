"""Side by side with what users pick instead: the peers, selected in the search's own run, quoted apart.

    python bench/peers.py                                   # gpt, cnn, hf/llama, diffusers/unet2d, eager
    python bench/peers.py --workloads gpt/tiny --compile    # compiled training steps
    python bench/peers.py --workloads hf/llama --append     # and keep the file's other workloads
    python bench/peers.py --quote-only                      # quote the file's searches again
    python bench/peers.py --quick                           # gpt/tiny, two budgets (smoke test)

For each workload, one ``python -m search.run --peers all``: its Evaluator measures the searched
plans and the peers (torch.compile's ``activation_memory_budget`` at ``--budgets``, transformers'
checkpointing every 1-4 layers on HF models, ``checkpoint_sequential`` on chains). From that run's
measurements (selection), for every peer: our fastest frontier plan at no more memory. Then the
quote, apart from the search (selection and quote never share a measurement): one fresh Evaluator
in this process (warmed up as the search's are) measures the baseline, every peer and every
selected plan of ours ``--rounds`` times, interleaved with the order rotated each round, each
with the search's timed steps, so every quoted plan has exactly as many samples
(``check_equal_samples``). The table quotes these medians, their spreads (max - min of the
samples) and the ratio of step times (peer / ours; above 1: ours is faster), and says where the
difference is within the two spreads. Writes ``bench/results/peers.json`` (``peers_compiled.json``
with ``--compile``) after each workload.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS_DIR, check_equal_samples, interleaved, keep_earlier_rows, run_search, write_result  # noqa: E402
from bench.readme_numbers import compile_budgets  # noqa: E402
from env.data.measured import MeasuredPlan  # noqa: E402
from env.data.plan import action_summary  # noqa: E402
from env.data.types import MIB  # noqa: E402
from env.measure.peers import PeerKind  # noqa: E402
from search.engine.evaluator import Evaluator  # noqa: E402
from search.records.config import SearchConfig  # noqa: E402
from search.records.pareto import fastest_within  # noqa: E402

DEFAULT_WORKLOADS = ["gpt/small", "cnn/small", "hf/llama", "diffusers/unet2d"]
ALL_KINDS = [k.value for k in PeerKind]
SEARCH_SETTINGS = ("seed", "repeats", "measure_threads")  # what the quote's Evaluator takes from the search


def run(workload: str, budgets: Sequence[float], compiled: bool, extra: Sequence[str]) -> dict[str, Any]:
    flags = ["--workload", workload, "--peers", "all", "--peer-budgets", *map(str, budgets), "--no-batch-scaling",
             *extra, *(["--compile"] if compiled else [])]
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        report, wall = run_search(flags, out=Path(tmp))
        cfg = json.loads((Path(tmp) / "run" / "config.json").read_text())
    print(f"{workload}: {len(report['peers'])} peers, {wall:.0f} s", file=sys.stderr)
    return {"workload": workload, "compiled": compiled, "command": "python -m search.run " + " ".join(flags),
            "wall_seconds": wall, "clock": report["clock"], "baseline": report["baseline"],
            "search": {k: cfg[k] for k in SEARCH_SETTINGS},
            "frontier": report["frontier"], "peers": report["peers"], "load_average_1": os.getloadavg()[0]}


def selected(row: dict[str, Any]) -> dict[str, dict[str, str] | None]:
    """Per measured peer: our fastest frontier plan at no more memory, by the search's measurements."""
    front = row["frontier"]
    out: dict[str, dict[str, str] | None] = {}
    for p in row["peers"]:
        if not p["oom"]:
            k = fastest_within([f["peak_bytes"] for f in front], [f["step_seconds"] for f in front], p["peak_bytes"])
            out[p["peer"]] = None if k is None else front[k]["plan"]
    return out


def _figures(m: MeasuredPlan) -> dict[str, Any]:
    return {"peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds, "spread_seconds": m.spread_seconds,
            "samples": len(m.step_seconds_samples)}


def quote(row: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Fresh interleaved measurements of the baseline, the peers and our plans selected against them."""
    picks = selected(row)
    units = list(row["frontier"][0]["plan"])
    actions = sorted({a for f in row["frontier"] for a in f["plan"].values()} | {"keep"})
    defaults = SearchConfig()  # rows written before the search's settings were recorded ran with these
    search = row.get("search", {k: getattr(defaults, k) for k in SEARCH_SETTINGS})
    ev = Evaluator(row["workload"], int(search["seed"]), units, actions, int(search["repeats"]), "cpu",
                   int(search["measure_threads"]) or None, name="quote", compile=bool(row["compiled"]))
    budgets = [b for b, _ in compile_budgets(row["peers"])]
    peers = {p.name: p for p in ev.peers(ALL_KINDS, budgets) if p.name in picks}
    if set(peers) != set(picks):
        raise SystemExit(f"{row['workload']}: the quoting Evaluator offers other peers than the search measured "
                         f"({sorted(set(picks) ^ set(peers))})")
    ours = {json.dumps(p, sort_keys=True): p for p in picks.values() if p is not None}
    jobs: dict[str, Callable[[], MeasuredPlan]] = {
        "baseline": lambda: ev.evaluate(["keep"] * len(units), "quote", again=True),
        **{f"ours:{k}": lambda p=p: ev.evaluate([p[u] for u in units], "quote", again=True) for k, p in ours.items()},
        **{f"peer:{name}": lambda peer=peer: ev.evaluate_peer(peer) for name, peer in peers.items()}}
    t0 = time.perf_counter()
    ev.warm_up()
    got = interleaved(jobs, rounds)
    samples = check_equal_samples(list(got.values()), row["workload"])
    rows = []
    for name, plan in picks.items():
        peer = got[f"peer:{name}"]
        mine = got.get(f"ours:{json.dumps(plan, sort_keys=True)}") if plan is not None else None
        entry: dict[str, Any] = {"peer": name, **_figures(peer), "compile_seconds": peer.compile_seconds,
                                 "note": peers[name].note, "ours": None}
        if mine is not None:
            diff = peer.step_seconds - mine.step_seconds
            entry["ours"] = {**_figures(mine), "plan": action_summary(plan.values()),
                             "fits": mine.peak_bytes <= peer.peak_bytes, "compile_seconds": mine.compile_seconds}
            entry["time_ratio_peer_over_ours"] = peer.step_seconds / mine.step_seconds
            entry["beyond_spread"] = abs(diff) > peer.spread_seconds + mine.spread_seconds
        rows.append(entry)
    return {"rounds": rounds, "samples_per_plan": samples, "wall_seconds": time.perf_counter() - t0,
            "baseline": _figures(got["baseline"]), "peers": sorted(rows, key=lambda e: e["peak_bytes"]),
            "load_average_1": os.getloadavg()[0]}


def markdown(result: dict[str, Any]) -> str:
    out = []
    for w in result["workloads"]:
        q = w.get("quote")
        if q is None:
            continue
        b = q["baseline"]
        out += [f"**`{w['workload']}`** ({'compiled' if w['compiled'] else 'eager'} steps, {w['clock']} clock, "
                f"{q['samples_per_plan']} samples a plan in {q['rounds']} interleaved rounds, load "
                f"{q['load_average_1']:.1f}; baseline {b['peak_bytes'] / MIB:.1f} MiB, {b['step_seconds'] * 1e3:.1f} "
                f"± {b['spread_seconds'] * 1e3:.1f} ms)", "",
                "| peer | peak MiB | step ms (spread) | our fastest plan at no more memory | MiB | step ms (spread) "
                "| peer / ours | |", "|---|---:|---:|---|---:|---:|---:|---|"]
        for p in q["peers"]:
            o = p["ours"]
            head = f"| {p['peer']} | {p['peak_bytes'] / MIB:.1f} | {p['step_seconds'] * 1e3:.1f} ({p['spread_seconds'] * 1e3:.1f}) |"
            if o is None:
                out.append(f"{head} none: no plan of ours measured this low | | | | {p['note'][:60]} |")
                continue
            ratio = p["time_ratio_peer_over_ours"]
            verdict = ("within the spreads" if not p["beyond_spread"] else "peer faster" if ratio < 1 else "ours faster")
            out.append(f"{head} {o['plan']} | {o['peak_bytes'] / MIB:.1f}{'' if o['fits'] else ' (above!)'} | "
                       f"{o['step_seconds'] * 1e3:.1f} ({o['spread_seconds'] * 1e3:.1f}) | {ratio:.2f}x | "
                       f"{verdict}{'; ' + p['note'][:60] if p['note'] else ''} |")
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    ap.add_argument("--budgets", type=float, nargs="+", default=[round(0.1 * i, 1) for i in range(11)],
                    help="activation_memory_budget values (a cold compile each)")
    ap.add_argument("--compile", action="store_true", help="search and measure compiled steps")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved quoting rounds over the quoted plans")
    ap.add_argument("--search", nargs=argparse.REMAINDER, default=[],
                    help="further search.run flags, e.g. --search --agents 2 --timesteps 1024")
    ap.add_argument("--quick", action="store_true", help="gpt/tiny, budgets 0.0 and 1.0, tiny search")
    ap.add_argument("--out", type=Path, help="result file (default bench/results/peers[_compiled].json)")
    ap.add_argument("--append", action="store_true",
                    help="keep the workloads of the result file that this run does not measure (each says its load)")
    ap.add_argument("--quote-only", action="store_true",
                    help="no search: quote the searches of the result file again (--workloads picks which)")
    args = ap.parse_args(argv)
    if args.quick:
        args.workloads, args.budgets, args.rounds = ["gpt/tiny"], [0.0, 1.0], 1
        args.search = ["--agents", "2", "--timesteps", "256", "--chunk-timesteps", "128", "--max-measurements", "10",
                       "--repeats", "1"]
    name = "peers_compiled" if args.compile else "peers"
    path = args.out or RESULTS_DIR / f"{name}.json"
    result: dict[str, Any] = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                              "workloads": []}
    if args.quote_only:
        result = json.loads(path.read_text())
        for w in result["workloads"]:
            if w["workload"] in args.workloads:
                w["quote"] = quote(w, args.rounds)
                path = write_result(name, result, args.out)  # with this run's machine and time
    else:
        if args.append:
            keep_earlier_rows(path, result, "workloads", set(args.workloads), lambda r: r["workload"])
        for w in args.workloads:
            row = run(w, args.budgets, args.compile, args.search)
            row["quote"] = quote(row, args.rounds)
            result["workloads"].append(row)
            path = write_result(name, result, args.out)  # after every workload: a long run keeps what it did
    print(markdown(result))
    print(path)


if __name__ == "__main__":
    main()

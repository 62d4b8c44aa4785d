"""Side by side with what users pick instead: the peers, measured in the search's own run.

    python bench/peers.py                                   # gpt, cnn, hf/llama, diffusers/unet2d, eager
    python bench/peers.py --workloads gpt/tiny --compile    # compiled training steps
    python bench/peers.py --quick                           # gpt/tiny, two budgets (smoke test)

For each workload, one ``python -m search.run --peers all`` (its own Evaluator measures the
searched plans and the peers alike, same clock, same repeats): torch.compile's
``activation_memory_budget`` at ``--budgets``, transformers' checkpointing (every 1-4 layers) on
HF models, ``checkpoint_sequential`` on chains. For every peer point: our fastest measured
frontier plan at no more memory, and the ratio of step times (peer / ours; above 1: ours is
faster). Writes ``bench/results/peers.json`` (``peers_compiled.json`` with ``--compile``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import run_search, write_result  # noqa: E402
from search.report import peers_markdown  # noqa: E402

DEFAULT_WORKLOADS = ["gpt/small", "cnn/small", "hf/llama", "diffusers/unet2d"]


def run(workload: str, budgets: Sequence[float], compiled: bool, extra: Sequence[str]) -> dict[str, Any]:
    flags = ["--workload", workload, "--peers", "all", "--peer-budgets", *map(str, budgets), "--no-batch-scaling",
             *extra, *(["--compile"] if compiled else [])]
    report, wall = run_search(flags)
    print(f"{workload}: {len(report['peers'])} peers, {wall:.0f} s", file=sys.stderr)
    return {"workload": workload, "compiled": compiled, "command": "python -m search.run " + " ".join(flags),
            "wall_seconds": wall, "clock": report["clock"], "baseline": report["baseline"],
            "frontier": report["frontier"], "peers": report["peers"], "load_average_1": os.getloadavg()[0]}


def markdown(result: dict[str, Any]) -> str:
    out = []
    for w in result["workloads"]:
        b = w["baseline"]
        out += [f"**`{w['workload']}`** ({'compiled' if w['compiled'] else 'eager'} steps, {w['clock']} clock; baseline "
                f"{b['peak_bytes'] / 2**20:.1f} MiB, {b['step_seconds'] * 1e3:.1f} ms)", "",
                *peers_markdown(w["peers"])]
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    ap.add_argument("--budgets", type=float, nargs="+", default=[round(0.1 * i, 1) for i in range(11)],
                    help="activation_memory_budget values (a cold compile each)")
    ap.add_argument("--compile", action="store_true", help="search and measure compiled steps")
    ap.add_argument("--search", nargs=argparse.REMAINDER, default=[],
                    help="further search.run flags, e.g. --search --agents 2 --timesteps 1024")
    ap.add_argument("--quick", action="store_true", help="gpt/tiny, budgets 0.0 and 1.0, tiny search")
    ap.add_argument("--out", type=Path, help="result file (default bench/results/peers[_compiled].json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.workloads, args.budgets = ["gpt/tiny"], [0.0, 1.0]
        args.search = ["--agents", "2", "--timesteps", "256", "--chunk-timesteps", "128", "--max-measurements", "10",
                       "--repeats", "1"]
    rows = [run(w, args.budgets, args.compile, args.search) for w in args.workloads]
    result = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "workloads": rows}
    print(markdown(result))
    print(write_result("peers_compiled" if args.compile else "peers", result, args.out))


if __name__ == "__main__":
    main()

"""Export the fastest frontier plan under a memory budget, as plan JSON or a torch-only snippet.

    python -m search.export runs/gpt-tiny --budget-mb 900 --format json --out plan.json
    python -m search.export runs/gpt-tiny --budget-mb 900 --format py --out ckpt_plan.py

Then, in training code: ``search.apply_plan(model, "plan.json")``, or (only torch needed)
``from ckpt_plan import apply_checkpoint_plan; apply_checkpoint_plan(model)``.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from env.data.errors import CkptSearchError
from env.data.plan import Plan
from env.data.types import MIB
from search.records.frontier_file import FrontierFile, FrontierPoint, load_frontier
from search.training.snippet import plan_snippet

Format = Literal["json", "py"]
FORMATS: tuple[str, ...] = ("json", "py")


@dataclass(frozen=True)
class Exported:
    """What ``export`` chose and wrote."""

    plan: Plan
    point: FrontierPoint
    text: str
    path: Path | None


def choose(frontier: FrontierFile, budget_mb: float | None) -> FrontierPoint:
    """The fastest point with a peak within ``budget_mb`` MiB (the fastest of all when None)."""
    if budget_mb is not None and not (math.isfinite(budget_mb) and budget_mb > 0):
        raise CkptSearchError(f"--budget-mb {budget_mb} is not a positive number of MiB; give the memory one training "
                              "step may use, e.g. --budget-mb 900, or leave it out for the fastest plan")
    budget = int(budget_mb * MIB) if budget_mb is not None else max((p.peak_bytes for p in frontier.points), default=0)
    return frontier.fastest_within(budget)


def render(frontier: FrontierFile, point: FrontierPoint, fmt: str) -> str:
    if fmt not in FORMATS:
        raise CkptSearchError(f"unknown format '{fmt}'; choose one of {', '.join(FORMATS)}")
    plan = frontier.plan(point)
    if fmt == "json":
        return plan.to_json() + "\n"
    return plan_snippet(plan, title=f"{frontier.workload} ({frontier.batch_shape}), measured peak "
                                    f"{point.peak_bytes / MIB:.2f} MB, step {point.step_seconds * 1e3:.1f} ms "
                                    f"(clock {frontier.clock})")


def export(run_dir: str | Path, budget_mb: float | None = None, fmt: str = "json",
           out: str | Path | None = None) -> Exported:
    """Pick the fastest frontier plan under the budget and render it; write it to ``out`` if given."""
    frontier = load_frontier(run_dir)
    point = choose(frontier, budget_mb)
    text = render(frontier, point, fmt)
    path = None
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Exported(frontier.plan(point), point, text, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m search.export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="run folder of python -m search.run (holds frontier.json)")
    p.add_argument("--budget-mb", type=float, default=None,
                   help="peak memory budget of one training step in MB (MiB, 2**20 bytes); default: no limit")
    p.add_argument("--format", choices=FORMATS, default="json",
                   help="json: versioned plan for search.apply_plan; py: standalone snippet needing only torch")
    p.add_argument("--out", default=None, help="file to write (default: print to standard output)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        done = export(args.run_dir, args.budget_mb, args.format, args.out)
    except CkptSearchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if done.path is None:
        sys.stdout.write(done.text)
    else:
        p = done.point
        print(f"wrote {done.path}: {done.plan.summary()}; measured peak {p.peak_bytes / MIB:.2f} MB, "
              f"step {p.step_seconds * 1e3:.1f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

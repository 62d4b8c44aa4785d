"""Export the fastest frontier plan under a memory budget, as plan JSON or a torch-only snippet.

    python -m search.export runs/gpt-tiny --budget-mb 900 --format json --out plan.json
    python -m search.export runs/gpt-tiny --budget-mb 900 --format py --out ckpt_plan.py
    python -m search.export runs/gpt-tiny --memory-cap 900 --out plan.json   # a throughput search's answer

With ``--memory-cap`` (a run of ``python -m search.run --memory-cap ...``) the plan is the throughput
answer of the most samples per second that fits, and the file says its ``micro_batch`` and
``accumulation_steps`` beside the plan (``apply_plan`` reads the plan and ignores them).

Then, in training code: ``search.apply_plan(model, "plan.json")``, or (only torch needed)
``from ckpt_plan import apply_checkpoint_plan; apply_checkpoint_plan(model)``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from env.data.errors import CkptSearchError
from env.data.plan import Plan
from env.data.types import MIB
from search.records import meta
from search.records.frontier_file import (COMPILE_HOW, FrontierError, FrontierFile, FrontierPoint, frontier_path,
                                          load_frontier)
from search.records.runs import RunLock
from search.records.store import STORE_NAME, RunStore
from search.records.throughput import ThroughputPoint
from search.training.snippet import plan_snippet

Format = Literal["json", "py"]
FORMATS: tuple[str, ...] = ("json", "py")


@dataclass(frozen=True)
class Exported:
    """What ``export`` chose and wrote."""

    plan: Plan
    point: FrontierPoint | ThroughputPoint  # a throughput answer with --memory-cap
    text: str
    path: Path | None
    note: str | None = None  # a partial frontier (``--allow-partial``): why the run did not finish


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
    scope = point.compile_scope
    if fmt == "json":
        return frontier.plan_json(point)
    how = f", measured compiled ({scope}: {COMPILE_HOW[scope]})" if scope else ""
    return plan_snippet(plan, title=f"{frontier.workload} ({frontier.batch_shape}), measured peak "
                                    f"{point.peak_bytes / MIB:.2f} MB, step {point.step_seconds * 1e3:.1f} ms "
                                    f"(clock {frontier.clock}){how}")


def choose_throughput(frontier: FrontierFile, cap_mb: float) -> ThroughputPoint:
    """The throughput answer of the most samples per second whose counted peak fits ``cap_mb`` MiB."""
    if not (math.isfinite(cap_mb) and cap_mb > 0):
        raise CkptSearchError(f"--memory-cap {cap_mb} is not a positive number of MiB; give the memory one training "
                              "step may use, e.g. --memory-cap 900")
    curve = frontier.throughput
    if curve is None or not curve.answers():
        raise FrontierError(f"run of '{frontier.workload}' has no throughput answers (it was not a throughput "
                            "search); search with python -m search.run --memory-cap MB, or export with --budget-mb")
    best = curve.best_within(int(cap_mb * MIB))
    if best is None:
        low = curve.lowest_peak()
        assert low is not None
        raise FrontierError(f"no throughput answer of '{frontier.workload}' fits {cap_mb:.2f} MiB: the lowest "
                            f"answer's peak is {low.counted_peak_bytes / MIB:.2f} MiB (micro-batch {low.micro_batch}); "
                            "give a cap of at least that, or search again with this cap")
    return best


def render_throughput(frontier: FrontierFile, point: ThroughputPoint, fmt: str) -> str:
    """The answer's plan with its micro-batch and accumulation steps, as plan JSON or a snippet."""
    if fmt not in FORMATS:
        raise CkptSearchError(f"unknown format '{fmt}'; choose one of {', '.join(FORMATS)}")
    plan = Plan(fingerprint=frontier.fingerprint, actions={u: a for u, a in (point.plan or {}).items()})
    curve = frontier.throughput
    if fmt == "json":
        data = {**json.loads(plan.to_json()), "micro_batch": point.micro_batch,
                "accumulation_steps": point.accumulation, "global_batch": curve.global_batch if curve else None,
                "measured": {"peak_bytes": point.peak_bytes, "step_seconds": point.step_seconds,
                             "samples_per_second": point.samples_per_second, "clock": frontier.clock}}
        return json.dumps(data, indent=2) + "\n"
    return plan_snippet(plan, title=f"{frontier.workload} at micro-batch {point.micro_batch} ({point.accumulation} "
                                    f"accumulation steps), measured peak {point.peak_bytes / MIB:.2f} MB, "
                                    f"{point.samples_per_second:.1f} samples/s (clock {frontier.clock})")


def unfinished(run_dir: str | Path) -> str | None:
    """Why a run folder's search did not finish (its store's status: interrupted, failed, or running with no
    live driver), in words naming ``--resume``; None for a finished run, a live one, or a folder with no store."""
    run_dir = Path(run_dir)
    if not (run_dir / STORE_NAME).is_file():
        return None
    with RunStore(run_dir / STORE_NAME, readonly=True) as store:
        status = store.read(meta.STATUS) or "running"
    if status == "finished" or (status == "running" and RunLock(run_dir).holder() is not None):
        return None
    state = "stopped (its driver is gone)" if status == "running" else status
    return f"run '{run_dir}' is {state}; continue it with python -m search.run --resume {run_dir}"


def export(run_dir: str | Path, budget_mb: float | None = None, fmt: str = "json",
           out: str | Path | None = None, memory_cap_mb: float | None = None,
           allow_partial: bool = False) -> Exported:
    """Pick the fastest frontier plan under the budget (or, with ``memory_cap_mb``, the throughput answer
    under the cap) and render it; write it to ``out`` if given. A run that did not finish (``unfinished``) is
    refused in one line naming ``--resume``; with ``allow_partial`` its frontier (what was measured before it
    stopped) is exported, and ``Exported.note`` says so."""
    why = unfinished(run_dir)
    if why is not None and not (allow_partial and frontier_path(run_dir).is_file()):
        has = ("its frontier.json holds only what was measured before it stopped: export that with "
               "--allow-partial, or" if frontier_path(run_dir).is_file() else "it has no frontier.json yet:")
        raise CkptSearchError(f"{why.split('; ')[0]}; {has} {why.split('; ')[1]}")
    note = f"note: a partial frontier: {why}" if why else None
    frontier = load_frontier(run_dir)
    if memory_cap_mb is not None:
        if budget_mb is not None:
            raise CkptSearchError("give --budget-mb (the fastest plan at the run's batch) or --memory-cap (the "
                                  "fastest plan and micro-batch), not both")
        answer = choose_throughput(frontier, memory_cap_mb)
        text = render_throughput(frontier, answer, fmt)
        return Exported(Plan.from_json(text) if fmt == "json" else frontier.plan(_as_point(answer)), answer, text,
                        _write(out, text), note)
    point = choose(frontier, budget_mb)
    text = render(frontier, point, fmt)
    return Exported(frontier.plan(point), point, text, _write(out, text), note)


def _as_point(answer: ThroughputPoint) -> FrontierPoint:
    return FrontierPoint(plan=answer.plan or {}, peak_bytes=answer.peak_bytes, step_seconds=answer.step_seconds,
                         activation_bytes=0)


def _write(out: str | Path | None, text: str) -> Path | None:
    path = None
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m search.export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="run folder of python -m search.run (holds frontier.json)")
    p.add_argument("--budget-mb", type=float, default=None,
                   help="peak memory budget of one training step in MB (MiB, 2**20 bytes); default: no limit")
    p.add_argument("--memory-cap", type=float, default=None,
                   help="a throughput search's answer: the (plan, micro-batch) of the most samples/s whose peak fits "
                        "this many MB (MiB); the file gets micro_batch and accumulation_steps")
    p.add_argument("--format", choices=FORMATS, default="json",
                   help="json: versioned plan for search.apply_plan; py: standalone snippet needing only torch")
    p.add_argument("--out", default=None, help="file to write (default: print to standard output)")
    p.add_argument("--allow-partial", action="store_true",
                   help="export from a run that was interrupted or failed (its frontier holds what was measured "
                        "before it stopped), with a note on stderr; without it such a run is refused")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        done = export(args.run_dir, args.budget_mb, args.format, args.out, args.memory_cap, args.allow_partial)
    except CkptSearchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if done.note:
        print(done.note, file=sys.stderr)
    if done.path is None:
        sys.stdout.write(done.text)
    else:
        p = done.point
        batch = f", micro-batch {p.micro_batch} x {p.accumulation} accumulation steps" if isinstance(
            p, ThroughputPoint) else ""
        scope = getattr(p, "compile_scope", None)
        how = f"; measured compiled: {COMPILE_HOW[scope]}" if scope else ""
        print(f"wrote {done.path}: {done.plan.summary()}{batch}; measured peak {p.peak_bytes / MIB:.2f} MB, "
              f"step {p.step_seconds * 1e3:.1f} ms{how}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

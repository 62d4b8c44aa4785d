"""Everything that needs a GPU, as one command: the gpu tests, fidelity, premium, offload, throughput, a search.

    python bench/gpu.py                  # one NVIDIA GPU, a CUDA build of torch; about 7 min on an H200
    python bench/gpu.py --skip-search    # without the default search run
    python bench/gpu.py --steps throughput --throughput-workloads hf/llama --cap throughput=600
    python bench/gpu.py --device cuda:1 --budget-seconds 600

Steps, in this order, each writing ``bench/results/gpu_<step>.json`` that names its clock and
device (on CUDA a peak is ``max_memory_allocated``; a step time is wall time between
``torch.cuda.synchronize`` calls). The seconds are what each took on an H200 (2026-12-04):

1. ``tests`` (33 s): ``pytest -m gpu`` over the test modules that hold gpu tests: what passed.
2. ``fidelity`` (51 s): ``bench/fidelity.py --device cuda``, 20 random plans per workload, gpt, cnn,
   lstm and mlp at their built-in default sizes: predicted against measured peak and time.
3. ``premium`` (47 s): ``bench/premium.py --device cuda`` on gpt, cnn and lstm at their default sizes.
4. ``offload`` (16 s): on gpt, every unit kept, offloaded (``env.runtime.offload``: side stream, events,
   pooled pinned buffers), offloaded the blocking way (``save_on_cpu``, what the action did before) and
   recomputed, in interleaved rounds: memory saved and step time paid.
5. ``throughput`` (194 s): ``bench/throughput.py --device cuda`` on gpt/small (``--throughput-workloads``
   names others; hf/llama took over 120 s): the throughput search at three memory caps against the peers,
   the same search without caps (its wall time) and the measured grid.
6. ``search`` (55 s): ``python -m search.run --device cuda``, stopped (SIGINT: the run stays resumable)
   when the budget is spent; ``--skip-search`` leaves it out.

Each step has a time cap within ``--budget-seconds`` (7.5 minutes by default; ``--cap STEP=SECONDS``
changes one); a step that fails or runs out of time is recorded in ``gpu_summary.json`` and the next one
runs (a bench over its cap is stopped with its whole process group, and what it had written by then is
kept). Exit status 0 when every step ran and every gpu test passed, else 1. Without CUDA it prints one
line saying why and exits with status 1, measuring nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS_DIR, ROOT, device_name, write_result  # noqa: E402
from bench.measuring import interleaved  # noqa: E402

CLOCK = "wall time between torch.cuda.synchronize calls; peaks from torch.cuda.max_memory_allocated"
FIDELITY_WORKLOADS = ["gpt", "cnn", "lstm", "mlp"]  # built-in default sizes
PREMIUM_WORKLOADS = ["gpt=gpt", "cnn=cnn", "lstm=lstm"]
OFFLOAD_WORKLOADS = ["gpt", "gpt?batch_size=32"]
THROUGHPUT_WORKLOADS = ["gpt/small"]  # with the grid and the wall time of the same search without caps
# seconds each step may take at most (the search gets what is left): about twice what each took on an H200
CAPS = {"tests": 90, "fidelity": 100, "premium": 100, "offload": 45, "throughput": 300}
MIN_SEARCH_SECONDS = 90
STOP_SECONDS = 40  # of the search's time, kept for stopping it: SIGINT, then SIGKILL 30 s later


def no_cuda_message() -> str | None:
    """Why this machine cannot run the GPU benchmarks, or None when it can."""
    if torch.cuda.is_available():
        return None
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (f"bench/gpu.py: no CUDA device (torch {torch.__version__}, {build}); run it on a machine with an "
            "NVIDIA GPU and a CUDA build of torch. Nothing was measured.")


def write_gpu_result(step: str, payload: dict[str, Any], device: str, out_dir: Path) -> Path:
    """``gpu_<step>.json`` with the clock and the device beside the payload (and the machine)."""
    body = {k: v for k, v in payload.items() if k not in ("bench", "machine", "written_at")}
    label = f"{device_name(device)} ({device})"
    return write_result(f"gpu_{step}", {"clock": CLOCK, "device": label, **body}, out_dir / f"gpu_{step}.json",
                        device=device)


# ---------------------------------------------------------------------------------------------
# Steps: each returns its payload, or raises StepFailed with one line

class StepFailed(Exception):
    """A step that did not produce its result; the message says why on one line."""


def run(cmd: list[str], seconds: float) -> tuple[subprocess.CompletedProcess[str], bool]:
    """A command from the repository root in its own process group, its output captured, and whether it ran
    over ``seconds``: then the whole group (Ray's processes a search started too) is stopped, so the next
    step has the GPU to itself."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    over = False
    try:
        stdout, stderr = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        over = True
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), over


def gpu_test_files() -> list[str]:
    """The test modules that hold gpu-marked tests: collecting only these, a module that needs what a GPU
    machine may lack (the browser, the dashboard) is not imported."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "mark.gpu" in p.read_text())


def tests_step(device: str, seconds: float, tmp: Path) -> dict[str, Any]:
    junit = tmp / "junit.xml"
    proc, over = run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", f"--junitxml={junit}", *gpu_test_files()],
                     seconds)
    if over:
        raise StepFailed(f"pytest -m gpu ran over its {seconds:.0f} s")
    if not junit.is_file():
        raise StepFailed(f"pytest -m gpu wrote no report (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0)})
    count = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
    return {"exit_code": proc.returncode, "passed": count["passed"], "failed": count["failure"] + count["error"],
            "skipped": count["skipped"], "tests": cases, "output_tail": proc.stdout[-3000:]}


def bench_step(script: str, args: list[str]) -> Callable[[str, float, Path], dict[str, Any]]:
    """A bench script run with ``--device`` and ``--out`` into the temporary folder; its result."""
    def step(device: str, seconds: float, tmp: Path) -> dict[str, Any]:
        out = tmp / f"{Path(script).stem}.json"
        proc, over = run([sys.executable, str(ROOT / "bench" / script), "--device", device, *args,
                          "--out", str(out)], seconds)
        if over and out.is_file():  # a bench that writes after each workload: what it had written by then
            return {**json.loads(out.read_text()), "stopped_at_cap_seconds": seconds,
                    "output_tail": proc.stderr[-3000:]}
        if over:
            raise StepFailed(f"bench/{script} ran over its {seconds:.0f} s: {' '.join(proc.stderr.split())[-400:]}")
        if proc.returncode != 0 or not out.is_file():
            raise StepFailed(f"bench/{script} exited {proc.returncode}: {' '.join(proc.stderr.split())[-400:]}")
        return json.loads(out.read_text())
    return step


@contextlib.contextmanager
def blocking_offload() -> Iterator[None]:
    """The ``offload`` action as it was: ``save_on_cpu``, every copy on the compute stream."""
    import env.runtime.apply as apply
    from env.data.plan import Action

    class SaveOnCpu(apply.Policy):
        action = Action.OFFLOAD

        def wrap(self, module: torch.nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
            def offloaded(*args: Any, **kwargs: Any) -> Any:
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    return forward(*args, **kwargs)
            return offloaded

    overlapped = apply.POLICIES[Action.OFFLOAD]
    apply.POLICIES[Action.OFFLOAD] = SaveOnCpu()
    try:
        yield
    finally:
        apply.POLICIES[Action.OFFLOAD] = overlapped


def offload_rows(spec: str, device: str, rounds: int = 3, repeats: int = 3) -> dict[str, Any]:
    """keep / offload / blocking offload / recompute on one workload, measured in interleaved rounds."""
    from env.data.plan import Action
    from env.measure.measurement import measure
    from env.runtime.apply import plan_for
    from env.runtime.offload import offloader_for
    from env.units.find import find_units
    from env.workloads.workload import load_workload

    w = load_workload(spec, device=device)
    units = find_units(w.model)
    n = len(units)
    offloaded_before = offloader_for(w.device).stats.bytes_offloaded
    plans = {"keep": Action.KEEP, "offload": Action.OFFLOAD, "offload, blocking (save_on_cpu)": Action.OFFLOAD,
             "recompute": Action.RECOMPUTE}

    def job(name: str) -> Callable[[], Any]:
        def run() -> Any:
            with blocking_offload() if "blocking" in name else contextlib.nullcontext():
                return measure(w, plan_for(w.model, units, [plans[name]] * n), units, repeats=repeats)
        return run

    got = interleaved({name: job(name) for name in plans}, rounds)
    base = got["keep"]
    offloaded = offloader_for(w.device).stats.bytes_offloaded - offloaded_before
    offload_steps = rounds * (repeats + 2)  # measure(): a warm-up, a memory and ``repeats`` timed steps
    rows = [{"plan": name, "peak_bytes": m.peak_bytes, "activation_bytes": m.activation_bytes,
             "step_seconds": m.step_seconds, "spread_seconds": m.spread_seconds,
             "n_timed_steps": len(m.step_seconds_samples),
             "peak_saving": 1 - m.peak_bytes / base.peak_bytes,
             "activation_saving": 1 - m.activation_bytes / base.activation_bytes,
             "slowdown": m.step_seconds / base.step_seconds - 1} for name, m in got.items()]
    return {"workload": spec, "batch_shape": w.batch_shape, "n_units": n, "rows": rows,
            "offloaded_bytes_per_step": offloaded // offload_steps}


def offload_step(device: str, seconds: float, tmp: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    workloads = []
    for spec in OFFLOAD_WORKLOADS:
        if time.perf_counter() - t0 > seconds / 2 and workloads:
            break  # the next, larger workload would not fit the cap
        workloads.append(offload_rows(spec, device))
    return {"workloads": workloads, "wall_seconds": time.perf_counter() - t0}


def search_step(device: str, seconds: float, tmp: Path) -> dict[str, Any]:
    out = tmp / "search"
    cmd = [sys.executable, "-m", "search.run", "--device", device, "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: Ray's workers stop with it
    stopped = False
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, seconds - STOP_SECONDS))
    except subprocess.TimeoutExpired:
        stopped = True
        os.killpg(proc.pid, signal.SIGINT)  # search.run drains, marks the store resumable, exits 130
        try:
            stdout, stderr = proc.communicate(timeout=STOP_SECONDS - 10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
    runs = sorted(p for p in out.glob("*") if p.is_dir())
    if not runs:
        raise StepFailed(f"search.run made no run folder (exit {proc.returncode}): {' '.join(stderr.split())[-400:]}")
    run_dir = runs[-1]
    report = run_dir / "report.md"
    return {"command": " ".join(cmd[1:]), "exit_code": proc.returncode, "stopped_at_budget": stopped,
            "wall_seconds": time.perf_counter() - t0, "run_files": sorted(p.name for p in run_dir.iterdir()),
            "report_md": report.read_text()[:20000] if report.is_file() else None,
            "output_tail": (stdout + stderr)[-3000:]}


def throughput_step(workloads: Sequence[str]) -> Callable[[str, float, Path], dict[str, Any]]:
    return bench_step("throughput.py", ["--workloads", *workloads])


STEPS: dict[str, Callable[[str, float, Path], dict[str, Any]]] = {
    "tests": tests_step,
    "fidelity": bench_step("fidelity.py", ["--workloads", *FIDELITY_WORKLOADS, "--plans", "20"]),
    "premium": bench_step("premium.py", ["--workloads", *PREMIUM_WORKLOADS]),
    "offload": offload_step,
    "throughput": throughput_step(THROUGHPUT_WORKLOADS),
    "search": search_step,
}


def step_ok(step: str, payload: dict[str, Any]) -> bool:
    if step == "tests":
        return payload["failed"] == 0 and payload["passed"] > 0
    return True


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda or cuda:N")
    ap.add_argument("--budget-seconds", type=float, default=450, help="wall time for every step together")
    ap.add_argument("--skip-search", action="store_true", help="leave out the default search run")
    ap.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS), help="run only these steps")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="folder for the gpu_*.json results")
    ap.add_argument("--throughput-workloads", nargs="+", default=THROUGHPUT_WORKLOADS,
                    help="workloads of the throughput step (the grid and the uncapped search's time on gpt/small)")
    ap.add_argument("--cap", nargs="+", default=[], metavar="STEP=SECONDS", help="another time cap for a step")
    args = ap.parse_args(argv)
    caps = dict(CAPS)
    for item in args.cap:
        step, _, secs = item.partition("=")
        if step not in CAPS or not secs.replace(".", "", 1).isdigit():
            ap.error(f"--cap {item}: give STEP=SECONDS with STEP one of {', '.join(CAPS)}")
        caps[step] = float(secs)
    why = no_cuda_message()
    if why:
        print(why, file=sys.stderr)
        return 1
    if not args.device.startswith("cuda"):
        print(f"bench/gpu.py: --device {args.device} is not a CUDA device; give cuda or cuda:N", file=sys.stderr)
        return 1
    steps = [s for s in args.steps if not (s == "search" and args.skip_search)]
    deadline = time.perf_counter() + args.budget_seconds
    run_steps = {**STEPS, "throughput": throughput_step(args.throughput_workloads)}
    summary: dict[str, Any] = {}
    ok = True
    with tempfile.TemporaryDirectory(prefix="ckpt-gpu-") as tmp_name:
        for step in steps:
            left = deadline - time.perf_counter()
            seconds = left if step == "search" else min(caps[step], left)
            if seconds < (MIN_SEARCH_SECONDS if step == "search" else 10):
                summary[step] = {"status": "skipped", "why": f"only {left:.0f} s of the budget left"}
                ok = False
                continue
            t0 = time.perf_counter()
            try:
                payload = run_steps[step](args.device, seconds, Path(tmp_name))
            except StepFailed as e:
                summary[step] = {"status": "failed", "why": str(e), "seconds": time.perf_counter() - t0}
                ok = False
                print(f"bench/gpu.py: {step} failed: {e}", file=sys.stderr)
                continue
            path = write_gpu_result(step, payload, args.device, args.out_dir)
            good = step_ok(step, payload)
            ok = ok and good
            summary[step] = {"status": "ok" if good else "failed", "seconds": time.perf_counter() - t0,
                             "result": path.name}
            print(f"bench/gpu.py: {step} {'done' if good else 'FAILED'} in {summary[step]['seconds']:.0f} s: {path}",
                  file=sys.stderr)
    write_gpu_result("summary", {"steps": summary, "budget_seconds": args.budget_seconds,
                                 "all_ok": ok}, args.device, args.out_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

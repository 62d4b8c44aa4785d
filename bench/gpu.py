"""Everything that needs a GPU, as one command: the gpu tests, the premium, the peers and the throughput search.

    python bench/gpu.py                  # one NVIDIA GPU, a CUDA build of torch; at most 8 minutes
    python bench/gpu.py --dry-run        # the same steps at tiny sizes on this CPU (tests/test_gpu_script.py)
    python bench/gpu.py --workload "hf/llama-1b?precision=bf16-mixed" --micro-batches 1 2 3 6
    python bench/gpu.py --steps throughput --caps-mib 16000 32000 --cap throughput=300
    python bench/gpu.py --steps fidelity offload     # the optional steps (fixed workloads)

Steps, in this order, each on ``--workload`` (default ``gpt/gpt2?precision=bf16-mixed``: GPT-2 124M at its
preset batch of 24 x 1,024 tokens, about 40% of an 80 GB GPU with every unit kept, an estimate of
docs/workloads.md):

1. ``tests``: ``pytest -m gpu`` over the test modules that hold gpu tests, one process on the GPU: what
   passed, and for each test that failed pytest's failure text (its longrepr, trimmed).
2. ``premium``: ``bench/premium.py``: memory saved against step time paid by the uniform plans, the rules
   and the searched plans at 30/50/70% saving, quoted in interleaved rounds apart from their selection.
3. ``peers``: ``python -m search.run --peers all`` (torch.compile's ``activation_memory_budget`` at
   ``--peer-budgets``, a cold compile each, beside the eager peers), then ``bench/peers.py --run`` on its
   folder: the peers and our plans selected against them quoted apart, on the device the search ran on,
   each peer's gradients checked.
4. ``throughput``: ``python -m search.run --memory-cap A B --micro-batches ...``: at two caps (``--cap-fractions``
   of the baseline peak the peers search measured, 0.5 and 1.0, or ``--caps-mib``) the fastest (plan,
   micro-batch) over a fixed micro-batch ladder (6, 12, 24, 48), against the peers at the largest micro-batch
   each fits.

Optional (``--steps``): ``fidelity`` (``bench/fidelity.py`` on gpt, cnn, lstm and mlp at their built-in
sizes, not ``--workload``: predicted against measured peak and time) and ``offload`` (on gpt, every unit kept, offloaded on a
side stream, offloaded the blocking way with ``save_on_cpu`` and recomputed, in interleaved rounds).

Every step writes ``<out-dir>/gpu_<step>.json`` the moment it ends, naming its clock and device (on CUDA a
peak is ``max_memory_allocated``, a step time the wall time between ``torch.cuda.synchronize`` calls), and
``gpu_summary.json`` is written again after each step, listing every step (``pending`` until it ran), so a
run killed midway keeps every finished step. A step that fails keeps what it had (a search without its
quote) and says why in one line; the next step runs. Budget: ``--budget-seconds`` (480 s on a GPU) for all
the steps together, each within its own cap (``--cap STEP=SECONDS``); a search over its cap is stopped with
SIGINT, which drains its measurements into its store and leaves it resumable (``search.run --resume``, the
run folders under ``--runs``), then the rest of the step quotes what it measured.

``--dry-run`` (and ``--device cpu``) runs the same steps at tiny sizes (``gpt/tiny?precision=bf16-mixed``: the
real run's precision, the fewest agent steps and measurements, a two-size ladder, the eager peers without the compile budgets) on the CPU into
``runs/gpu-dry-run``; the GPU-only steps (``tests``, ``offload``) are recorded as skipped with the reason. Exit status 0 when every step ran (or was skipped
as GPU-only) and every gpu test passed, else 1. A CUDA device asked for where there is none is refused in
one line, measuring nothing.
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS_DIR, ROOT, device_name, write_result  # noqa: E402
from env.data.rounds import interleaved  # noqa: E402

CLOCK = "wall time between torch.cuda.synchronize calls; peaks from torch.cuda.max_memory_allocated"
CPU_CLOCK = "the measuring thread's CPU time (one torch thread); peaks from the profiler's memory events"
REALISTIC_WORKLOAD = "gpt/gpt2?precision=bf16-mixed"  # GPT-2 124M, batch 24 x 1,024 tokens (the preset's)
DRY_RUN_DIR = ROOT / "runs" / "gpu-dry-run"
GPU_ONLY = ("tests", "offload")
MIN_STEP_SECONDS = 10  # a step given less than this is skipped: no search starts Ray and measures in it
SEARCH_SHARE = 2 / 3  # of the peers step's time for its search; the rest quotes what it measured
FAILURE_CHARS = 2000  # of pytest's failure text kept per failed test (its last characters: the assertion)


@dataclass(frozen=True)
class Sizes:
    """What every step measures and how long it may take: the realistic run on a GPU or the dry run on a CPU."""

    workload: str  # premium, peers and throughput measure it
    micro_batches: list[int]  # the throughput search's fixed ladder (``--micro-batches``)
    cap_fractions: list[float]  # the throughput caps, as fractions of the peers search's baseline peak
    peers: str  # --peers of the peers search: all (the compile budgets too) or eager
    peer_budgets: list[float]  # torch.compile activation_memory_budget values it measures with all
    search: list[str]  # search.run flags of both searches: how long the agents train, how much is measured
    throughput_peers: str  # --peers of the throughput search (its own peers at the ladder are always there)
    premium: list[str]  # bench/premium.py flags
    quote_rounds: int  # interleaved rounds of the peers' quote
    fidelity: list[str]  # bench/fidelity.py flags (the optional step)
    offload_workloads: list[str]  # the optional offload step's workloads
    budget_seconds: float  # every step together
    caps: dict[str, float] = field(default_factory=dict)  # seconds each step may take at most


# About twice what each took on an H200 where measured (2026-12-04: tests 33 s, fidelity 51 s, offload 16 s);
# premium, peers and throughput at GPT-2's size are not measured yet: their caps share the rest of 8 minutes,
# the most to the peers, whose search and quote each compile the budgets cold.
GPU = Sizes(workload=REALISTIC_WORKLOAD, micro_batches=[6, 12, 24, 48], cap_fractions=[0.5, 1.0],
            peers="all", peer_budgets=[0.5], search=["--agents", "2", "--timesteps", "512", "--chunk-timesteps", "512",
                                        "--max-measurements", "24", "--throughput-timesteps", "256"],
            throughput_peers="eager", premium=["--max-exact", "6", "--rounds", "2", "--repeats", "3"],
            quote_rounds=2, fidelity=["--workloads", "gpt", "cnn", "lstm", "mlp", "--plans", "20"],
            offload_workloads=["gpt", "gpt?batch_size=32"], budget_seconds=480,
            caps={"tests": 75, "premium": 75, "peers": 210, "throughput": 120, "fidelity": 100, "offload": 45})
# The dry run leaves out the compile budgets: a cold compile takes over a minute on 2 CPU cores.
DRY_RUN = Sizes(workload="gpt/tiny?precision=bf16-mixed", micro_batches=[1, 2], cap_fractions=[0.9, 1.0], peers="eager", peer_budgets=[1.0],
                search=["--agents", "1", "--timesteps", "64", "--chunk-timesteps", "64", "--max-measurements", "6",
                        "--repeats", "1", "--throughput-timesteps", "0", "--throughput-evaluators", "1"],
                throughput_peers="none", premium=["--max-exact", "2", "--rounds", "1", "--repeats", "1"],
                quote_rounds=1, fidelity=["--workloads", "gpt/tiny", "--plans", "3", "--rounds", "1"],
                offload_workloads=["gpt/tiny"], budget_seconds=480,
                caps={"tests": 60, "premium": 90, "peers": 180, "throughput": 150, "fidelity": 60, "offload": 30})
DEFAULT_STEPS = ["tests", "premium", "peers", "throughput"]
ALL_STEPS = [*DEFAULT_STEPS, "fidelity", "offload"]


@dataclass
class Context:
    """What the steps share: where they measure and write, and what an earlier step found for a later one."""

    device: str
    sizes: Sizes
    out_dir: Path
    runs: Path  # the searches' run folders (kept: a search stopped at its cap resumes from there)
    tmp: Path
    caps_mib: list[float] = field(default_factory=list)  # the throughput caps, when given
    baseline_peak_bytes: int | None = None  # the peers search's baseline: the throughput caps scale it

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")


def no_cuda_message(device: str) -> str | None:
    """Why this machine cannot measure on ``device``, or None when it can."""
    if not device.startswith("cuda"):
        return None if device == "cpu" else f"bench/gpu.py: --device {device}: give cuda, cuda:N or cpu (a dry run)"
    if torch.cuda.is_available():
        return None
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (f"bench/gpu.py: no CUDA device (torch {torch.__version__}, {build}); run it on a machine with an "
            "NVIDIA GPU and a CUDA build of torch, or give --dry-run. Nothing was measured.")


def write_gpu_result(step: str, payload: dict[str, Any], device: str, out_dir: Path) -> Path:
    """``gpu_<step>.json`` with the clock and the device beside the payload (and the machine)."""
    body = {k: v for k, v in payload.items() if k not in ("bench", "machine", "written_at")}
    label = f"{device_name(device)} ({device})"
    clock = CLOCK if device.startswith("cuda") else CPU_CLOCK
    return write_result(f"gpu_{step}", {"clock": clock, "device": label, **body}, out_dir / f"gpu_{step}.json",
                        device=device)


# ---------------------------------------------------------------------------------------------
# Steps: each returns its payload, or raises StepFailed with one line (and what it had by then)

class StepFailed(Exception):
    """A step that did not produce its whole result; the message says why on one line, ``partial`` is what it
    had measured by then (written as its result), or None."""

    def __init__(self, why: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(why)
        self.partial = partial


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


def tail(text: str, chars: int = 400) -> str:
    """The last ``chars`` of a command's output on one line."""
    return " ".join(text.split())[-chars:]


def gpu_test_files() -> list[str]:
    """The test modules that hold gpu-marked tests: collecting only these, a module that needs what a GPU
    machine may lack (the browser, the dashboard) is not imported."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "mark.gpu" in p.read_text())


def junit_cases(junit: Path) -> list[dict[str, Any]]:
    """Each test case of a pytest junit report: its outcome and seconds, and where it failed or was skipped
    pytest's text for it (the longrepr: the traceback and the assertion, its last ``FAILURE_CHARS``)."""
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        found = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        entry = {"test": f"{case.get('classname')}::{case.get('name')}",
                 "outcome": "passed" if found is None else found.tag, "seconds": float(case.get("time") or 0)}
        if found is not None:
            entry["message"] = (found.get("message") or "")[:500]
            entry["longrepr"] = (found.text or "").strip()[-FAILURE_CHARS:]
        cases.append(entry)
    return cases


def tests_step(ctx: Context, seconds: float) -> dict[str, Any]:
    junit = ctx.tmp / "junit.xml"  # one process: two measuring on one GPU corrupt each other's memory and time
    proc, over = run([sys.executable, "-m", "pytest", "-m", "gpu", "-n", "0", "-q", f"--junitxml={junit}",
                      *gpu_test_files()], seconds)
    if over:
        raise StepFailed(f"pytest -m gpu ran over its {seconds:.0f} s: {tail(proc.stdout)}")
    if not junit.is_file():
        raise StepFailed(f"pytest -m gpu wrote no report (exit {proc.returncode}): {tail(proc.stderr)}")
    cases = junit_cases(junit)
    count = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
    return {"exit_code": proc.returncode, "passed": count["passed"], "failed": count["failure"] + count["error"],
            "skipped": count["skipped"], "tests": cases, "output_tail": proc.stdout[-3000:]}


def bench_script(script: str, args: list[str], ctx: Context, seconds: float) -> dict[str, Any]:
    """A bench script run with ``--device`` and ``--out`` into the temporary folder; its result. Over its cap,
    what it had written by then (the benches write after each workload)."""
    out = ctx.tmp / f"{Path(script).stem}.json"
    proc, over = run([sys.executable, str(ROOT / "bench" / script), *args, "--out", str(out)], seconds)
    if over and out.is_file():
        return {**json.loads(out.read_text()), "stopped_at_cap_seconds": seconds, "output_tail": proc.stderr[-3000:]}
    if over:
        raise StepFailed(f"bench/{script} ran over its {seconds:.0f} s: {tail(proc.stderr)}")
    if proc.returncode != 0 or not out.is_file():
        raise StepFailed(f"bench/{script} exited {proc.returncode}: {tail(proc.stderr)}")
    return json.loads(out.read_text())


def premium_step(ctx: Context, seconds: float) -> dict[str, Any]:
    spec = ctx.sizes.workload
    label = spec.split("?")[0].split("/")[0]  # gpt: the transformer's cited figures apply
    return bench_script("premium.py", ["--device", ctx.device, "--workloads", f"{label}={spec}",
                                       *ctx.sizes.premium], ctx, seconds)


def fidelity_step(ctx: Context, seconds: float) -> dict[str, Any]:
    return bench_script("fidelity.py", ["--device", ctx.device, *ctx.sizes.fidelity], ctx, seconds)


def search(ctx: Context, name: str, flags: list[str], seconds: float) -> tuple[Path, dict[str, Any]]:
    """``python -m search.run`` on the workload into ``<runs>/<name>``, stopped with SIGINT when ``seconds``
    are spent (it drains what was measured into its store, writes its report from it and stays resumable;
    SIGKILL a third of the time later if it has not ended): its run folder and how it ran."""
    name = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = ctx.runs / name
    cmd = [sys.executable, "-m", "search.run", "--workload", ctx.sizes.workload, "--device", ctx.device,
           "--no-progress", "--out", str(ctx.runs), "--name", name, *flags]
    stop_seconds = seconds / 3  # of the search's time, kept for stopping it
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: Ray's workers stop with it
    stopped = False
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, seconds - stop_seconds))
    except subprocess.TimeoutExpired:
        stopped = True
        os.killpg(proc.pid, signal.SIGINT)  # search.run drains, marks the store resumable, exits 130
        try:
            stdout, stderr = proc.communicate(timeout=stop_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
    info = {"command": "python -m search.run " + " ".join(cmd[3:]), "exit_code": proc.returncode,
            "stopped_at_budget": stopped, "wall_seconds": time.perf_counter() - t0, "run_dir": str(run_dir),
            "run_files": sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else [],
            "output_tail": (stdout + stderr)[-3000:]}
    if not (run_dir / "report.json").is_file():
        raise StepFailed(f"search.run {name} wrote no report (exit {proc.returncode}"
                         f"{', stopped at its cap' if stopped else ''}): {tail(stderr)}", {"search": info})
    return run_dir, info


def peers_step(ctx: Context, seconds: float) -> dict[str, Any]:
    """The peers search (``SEARCH_SHARE`` of the step's time), then its quote apart on the same device."""
    t0 = time.perf_counter()
    flags = ["--peers", ctx.sizes.peers, "--peer-budgets", *map(str, ctx.sizes.peer_budgets), "--no-batch-scaling",
             *ctx.sizes.search]
    run_dir, info = search(ctx, "gpu-peers", flags, SEARCH_SHARE * seconds)
    ctx.baseline_peak_bytes = json.loads((run_dir / "report.json").read_text())["baseline"]["peak_bytes"]
    left = seconds - (time.perf_counter() - t0)
    try:
        quoted = bench_script("peers.py", ["--run", str(run_dir), "--rounds", str(ctx.sizes.quote_rounds)], ctx, left)
    except StepFailed as e:
        raise StepFailed(f"the quote of the search's peers: {e}", {"search": info, "workloads": []}) from None
    for row in quoted["workloads"]:  # the search's own command and wall time, not the quoting process's
        row.update(command=info["command"], wall_seconds=info["wall_seconds"])
    return {**quoted, "search": info}


def throughput_caps_mib(ctx: Context) -> tuple[list[float], list[str]]:
    """The two caps in MiB and their names: as given, or fractions of the peers search's baseline peak."""
    if ctx.caps_mib:
        return ctx.caps_mib, [f"{c:g} MiB" for c in ctx.caps_mib]
    if ctx.baseline_peak_bytes is None:
        raise StepFailed("no baseline peak to set the caps from (the peers step measured none); give --caps-mib A B")
    fractions = ctx.sizes.cap_fractions
    return [f * ctx.baseline_peak_bytes / 2**20 for f in fractions], [f"{f:g} x baseline peak" for f in fractions]


def throughput_step(ctx: Context, seconds: float) -> dict[str, Any]:
    from bench.throughput import search_row

    caps, names = throughput_caps_mib(ctx)
    flags = ["--memory-cap", *(f"{c:.3f}" for c in caps), "--micro-batches", *map(str, ctx.sizes.micro_batches),
             "--peers", ctx.sizes.throughput_peers, "--no-batch-scaling", *ctx.sizes.search]
    run_dir, info = search(ctx, "gpu-throughput", flags, seconds)
    report = json.loads((run_dir / "report.json").read_text())
    if report.get("throughput") is None:
        raise StepFailed("the throughput search was stopped at its cap before it answered; resume it with "
                         f"python -m search.run --resume {run_dir}", {"search": info, "workloads": []})
    row = {"workload": ctx.sizes.workload, "caps": names,
           "search": search_row(report, info["command"], info["wall_seconds"])}
    return {"workloads": [row], "search": info}


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


def offload_step(ctx: Context, seconds: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    workloads = []
    for spec in ctx.sizes.offload_workloads:
        if time.perf_counter() - t0 > seconds / 2 and workloads:
            break  # the next, larger workload would not fit the cap
        workloads.append(offload_rows(spec, ctx.device))
    return {"workloads": workloads, "wall_seconds": time.perf_counter() - t0}


STEPS: dict[str, Callable[[Context, float], dict[str, Any]]] = {
    "tests": tests_step, "premium": premium_step, "peers": peers_step, "throughput": throughput_step,
    "fidelity": fidelity_step, "offload": offload_step,
}


def step_ok(step: str, payload: dict[str, Any]) -> bool:
    if step == "tests":
        return payload["failed"] == 0 and payload["passed"] > 0
    return True


# ---------------------------------------------------------------------------------------------
# The run: every step in turn within the budget, each result and the summary written as it ends

class Summary:
    """``gpu_summary.json``: every step asked for with its status, written again after each step."""

    def __init__(self, ctx: Context, steps: Sequence[str], budget_seconds: float) -> None:
        self.ctx, self.budget_seconds = ctx, budget_seconds
        self.steps: dict[str, dict[str, Any]] = {s: {"status": "pending"} for s in steps}

    def record(self, step: str, entry: dict[str, Any]) -> None:
        self.steps[step] = entry
        shown = f" ({entry['why']})" if entry.get("why") else ""
        print(f"bench/gpu.py: {step} {entry['status']}{shown}", file=sys.stderr)
        self.write()

    @property
    def all_ok(self) -> bool:
        return all(e["status"] == "ok" or e.get("gpu_only") for e in self.steps.values())

    def write(self) -> Path:
        return write_gpu_result("summary", {"steps": self.steps, "budget_seconds": self.budget_seconds,
                                            "workload": self.ctx.sizes.workload, "dry_run": not self.ctx.on_cuda,
                                            "all_ok": self.all_ok}, self.ctx.device, self.ctx.out_dir)


def run_step(ctx: Context, step: str, seconds: float) -> dict[str, Any]:
    """One step: its result written the moment it ends (what it had, where it failed); its summary entry."""
    t0 = time.perf_counter()
    try:
        payload, why = STEPS[step](ctx, seconds), None
    except StepFailed as e:
        payload, why = e.partial, str(e)
    entry: dict[str, Any] = {"status": "ok" if why is None and step_ok(step, payload) else "failed",
                             "seconds": time.perf_counter() - t0, **({"why": why} if why else {})}
    if payload is not None:
        entry["result"] = write_gpu_result(step, {**payload, **({"failed": why} if why else {})}, ctx.device,
                                           ctx.out_dir).name
    return entry


def run_all(ctx: Context, steps: Sequence[str], budget_seconds: float, caps: dict[str, float]) -> bool:
    """Every step in order within the budget; whether all ran well."""
    summary = Summary(ctx, steps, budget_seconds)
    summary.write()
    deadline = time.perf_counter() + budget_seconds
    for step in steps:
        left = deadline - time.perf_counter()
        if step in GPU_ONLY and not ctx.on_cuda:
            summary.record(step, {"status": "skipped", "gpu_only": True,
                                  "why": f"needs CUDA; this run measures on {ctx.device}"})
        elif min(caps[step], left) < MIN_STEP_SECONDS:
            summary.record(step, {"status": "skipped", "why": f"only {left:.0f} s of the budget left"})
        else:
            summary.record(step, run_step(ctx, step, min(caps[step], left)))
    return summary.all_ok


def parse_caps(items: Sequence[str], ap: argparse.ArgumentParser) -> dict[str, float]:
    caps = {}
    for item in items:
        step, _, secs = item.partition("=")
        if step not in ALL_STEPS or not secs.replace(".", "", 1).isdigit():
            ap.error(f"--cap {item}: give STEP=SECONDS with STEP one of {', '.join(ALL_STEPS)}")
        caps[step] = float(secs)
    return caps


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (the dry run)")
    ap.add_argument("--dry-run", action="store_true", help="every step at tiny sizes on the CPU (gpt/tiny at bf16-mixed)")
    ap.add_argument("--workload", help=f"what premium, peers and throughput measure (default {REALISTIC_WORKLOAD}; "
                                       f"dry run {DRY_RUN.workload})")
    ap.add_argument("--micro-batches", type=int, nargs="+", help="the throughput search's fixed ladder (default "
                    f"{' '.join(map(str, GPU.micro_batches))}; dry run {' '.join(map(str, DRY_RUN.micro_batches))})")
    ap.add_argument("--cap-fractions", type=float, nargs=2, metavar=("LOW", "HIGH"),
                    help="the throughput caps as fractions of the peers search's baseline peak (default "
                         f"{' '.join(map(str, GPU.cap_fractions))}; dry run {' '.join(map(str, DRY_RUN.cap_fractions))})")
    ap.add_argument("--caps-mib", type=float, nargs=2, metavar=("LOW", "HIGH"), default=[],
                    help="the throughput caps in MiB instead (a run without the peers step needs them)")
    ap.add_argument("--peer-budgets", type=float, nargs="+",
                    help=f"compile budgets of the peers search, a cold compile each (default {GPU.peer_budgets[0]})")
    ap.add_argument("--steps", nargs="+", choices=ALL_STEPS, default=DEFAULT_STEPS, help="run only these steps")
    ap.add_argument("--budget-seconds", type=float,
                    help=f"wall time for every step together (default {GPU.budget_seconds:.0f})")
    ap.add_argument("--cap", nargs="+", default=[], metavar="STEP=SECONDS", help="another time cap for a step")
    ap.add_argument("--out-dir", type=Path, help="folder for the gpu_*.json results (default bench/results; dry run "
                                                 "runs/gpu-dry-run)")
    ap.add_argument("--runs", type=Path, help="folder of the searches' run folders (default runs/; dry run "
                                              "<out-dir>/runs)")
    return ap


def sizes_of(args: argparse.Namespace) -> Sizes:
    """The dry run's or the GPU's sizes, with what the command line changes."""
    base = DRY_RUN if args.device == "cpu" else GPU
    given = {"workload": args.workload, "micro_batches": args.micro_batches, "cap_fractions": args.cap_fractions,
             "peer_budgets": args.peer_budgets, "budget_seconds": args.budget_seconds}
    return replace(base, **{k: v for k, v in given.items() if v is not None})


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    caps = parse_caps(args.cap, ap)
    if args.dry_run:
        args.device = "cpu"
    why = no_cuda_message(args.device)
    if why:
        print(why, file=sys.stderr)
        return 1
    sizes = sizes_of(args)
    dry = args.device == "cpu"
    out_dir = args.out_dir or (DRY_RUN_DIR if dry else RESULTS_DIR)
    runs = args.runs or (out_dir / "runs" if dry else ROOT / "runs")
    with tempfile.TemporaryDirectory(prefix="ckpt-gpu-") as tmp:
        ctx = Context(args.device, sizes, out_dir, runs, Path(tmp), caps_mib=list(args.caps_mib))
        ok = run_all(ctx, args.steps, sizes.budget_seconds, {**sizes.caps, **caps})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

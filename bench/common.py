"""What every benchmark script shares: the machine it ran on, the workload sizes, result files.

- ``machine_info(device)``: CPU model, cores, torch threads and version, the device measured on
  and the load average, so a reader can tell whether a number can be compared with theirs.
- ``BENCH_WORKLOADS``: the sizes the benchmarks measure by default. The built-in defaults take
  about 1.5 s a step (gpt) on 2 CPU cores and a measurement about five steps, too slow for the
  hundred-odd measurements a search comparison needs within ~5 minutes a workload; these
  "small" sizes keep each step under ~0.3 s while every unit still holds real activations.
- ``write_result(name, payload, out)``: ``bench/results/<name>.json`` with ``machine`` and
  ``written_at`` added; ``read_results()`` loads every result for the report.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
PLOTS_DIR = ROOT / "bench" / "plots"
if str(ROOT) not in sys.path:  # the scripts run as ``python bench/<name>.py`` from the repo root
    sys.path.insert(0, str(ROOT))

from env.data.measured import MeasuredPlan  # noqa: E402
from env.data.plan import Action  # noqa: E402
from search.records.pareto import REFERENCE, hypervolume, nondominated, normalise  # noqa: E402

USER_MODEL = "bench/user_model.py:make"

# name -> spec measured by default; "small" sizes so that one workload's comparison fits ~5 min
BENCH_WORKLOADS: dict[str, str] = {
    "gpt": "gpt/small",
    "cnn": "cnn/small?image_size=96&batch_size=16",
    "lstm": "lstm/small?n_layer=6",
    "user": USER_MODEL,
}
# the same architectures at a few seconds per run, for ``--quick`` (smoke tests)
QUICK_WORKLOADS: dict[str, str] = {
    "gpt": "gpt/tiny",
    "cnn": "cnn/tiny",
    "lstm": "lstm/tiny",
    "user": USER_MODEL + "?depth=4&dim=16&image_size=16&patch=8&batch_size=2",
}


def cpu_model() -> str:
    """The CPU's marketing name from ``/proc/cpuinfo``, or what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    """``cuda``/``cuda:N`` -> the GPU's name; anything else -> ``cpu (N threads)``."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({torch.get_num_threads()} threads)"


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """What a reader needs to compare these numbers with theirs."""
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "device": device_name(device),
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def machine_label(machine: dict[str, Any]) -> str:
    """One line naming the machine, for figure captions and table headers."""
    load = machine.get("load_average_1_5_15") or [None]
    device = machine.get("device") or f"cpu ({machine.get('torch_threads', '?')} threads)"
    cpu = machine.get("cpu_model") or machine.get("processor", "?")
    return (f"{device} on {cpu} ({machine.get('cpu_count', '?')} cores), "
            f"torch {machine.get('torch_version', machine.get('torch', '?'))}, load {load[0]}")


def workload_specs(names: list[str], quick: bool) -> dict[str, str]:
    """Short names (gpt, cnn, lstm, user), specs, or ``label=spec`` -> {label: spec}.

    A short name means the bench size (``BENCH_WORKLOADS``), or the quick one with ``quick``;
    ``gpt=gpt`` measures the built-in default size under the label ``gpt``.
    """
    table = QUICK_WORKLOADS if quick else BENCH_WORKLOADS
    out = {}
    for n in names:
        label, _, spec = n.partition("=")
        out[label] = spec if spec else table.get(n, n)
    return out


def write_result(name: str, payload: dict[str, Any], out: Path | None = None, device: str = "cpu") -> Path:
    """Write ``payload`` plus ``machine`` and ``written_at`` to ``out`` (default results/<name>.json)."""
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    body = {"bench": name, **payload, "machine": machine_info(device),
            "written_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2, default=_jsonable) + "\n")
    return path


def keep_earlier_rows(path: Path, result: dict[str, Any], key: str, measured: Any, row_key: Any) -> None:
    """``--append``: the rows of the result file at ``path`` that this run does not measure again stay in
    ``result[key]`` (each row says its own load); ``row_key(row)`` names a row, ``measured`` holds this run's.
    The rows this run measures again go to ``earlier_runs`` with the file's date and machine."""
    if not path.is_file():
        return
    earlier = json.loads(path.read_text())
    result[key] = [r for r in earlier.get(key, []) if row_key(r) not in measured]
    result["earlier_runs"] = earlier.get("earlier_runs", []) + [{
        "written_at": earlier.get("written_at"), "machine": earlier.get("machine"),
        key: [r for r in earlier.get(key, []) if row_key(r) in measured]}]


def code_commit() -> str | None:
    """The commit the benchmark ran on (``-dirty`` when the code it imports has uncommitted changes)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "search", "env", "agents", "bench", ":(exclude)bench/results")
    except (OSError, subprocess.CalledProcessError):
        return None  # not a git checkout
    return head + ("-dirty" if dirty else "")


T = TypeVar("T")


def evenly_mixed(*groups: Sequence[T]) -> list[T]:
    """The groups' items in one sequence, each group spread evenly over it (the i-th of n items at
    (i + 0.5) / n of the way; ties in group order): with equal lengths a1 b1 c1 a2 b2 c2 ..."""
    placed = [((i + 0.5) / len(g), k, i) for k, g in enumerate(groups) for i in range(len(g))]
    return [groups[k][i] for _, k, i in sorted(placed)]


def serpentine(items: Sequence[T], round_: int) -> list[T]:
    """``items`` forward in even rounds and backward in odd ones: over a pair of rounds every item
    sits as far from the start on average, so a drift over a round's minutes reaches all alike."""
    return list(items) if round_ % 2 == 0 else list(reversed(items))


def rotated(items: Sequence[T], round_: int) -> list[T]:
    """``items`` in round ``round_``'s order: each round starts one further on, so none always goes first."""
    k = round_ % len(items) if items else 0
    return [*items[k:], *items[:k]]


def interleaved(jobs: dict[str, Callable[[], MeasuredPlan]], rounds: int) -> dict[str, MeasuredPlan]:
    """Every job run once a round for ``rounds`` rotated rounds; each name's measurements merged."""
    got: dict[str, MeasuredPlan] = {}
    for r in range(rounds):
        for name in rotated(list(jobs), r):
            m = jobs[name]()
            got[name] = got[name].merged(m) if name in got else m
    return {name: got[name] for name in jobs}


def check_equal_samples(records: Sequence[MeasuredPlan], what: str) -> int:
    """Refuse a quote whose plans were not timed alike; the number of samples each has."""
    counts = {len(r.step_seconds_samples) for r in records}
    if len(counts) != 1:
        raise ValueError(f"{what}: quoted plans were timed {sorted(counts)} times; quote plans measured alike")
    return counts.pop()


def read_results(folder: Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    """Every ``*.json`` in ``folder`` by file stem; unreadable files are reported, not skipped silently."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e.msg}, line {e.lineno}); "
                             "rerun the bench that writes it") from e
    return out


def set_threads(threads: int) -> None:
    """Torch threads for measurement: 1 keeps step times steady on a shared machine."""
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


# ---------------------------------------------------------------------------------------------
# Plans measured through one Evaluator, on the normalised axes of search.records.pareto

Evaluate = Callable[[list[str], str, bool], MeasuredPlan]  # (action names, source, again) -> its record


class Ledger:
    """Every plan one benchmark measures, through one ``search.engine.evaluator.Evaluator`` (a local
    instance or its Ray actor), so that all methods share one measurement function and cache.
    Repeats of a plan merge into its ``MeasuredPlan`` (``MeasuredPlan.merged``, never twice)."""

    def __init__(self, evaluate: Evaluate, actions: Sequence[Action]) -> None:
        self._evaluate, self.actions = evaluate, list(actions)
        self.records: dict[tuple[int, ...], MeasuredPlan] = {}
        self.new_measurements = 0  # measurements made for this ledger (not adopted ones)
        self._seen: set[str] = set()  # measurement ids already in a record here

    def adopt(self, key: Sequence[int], record: MeasuredPlan) -> None:
        """A plan measured elsewhere (e.g. by the search run) joins the ledger, not counted as new."""
        key = tuple(int(a) for a in key)
        self.records[key] = self.records[key].merged(record) if key in self.records else record
        self._seen.update(record.measurement_ids)

    def measure(self, plan: Sequence[int], source: str, again: bool = False) -> MeasuredPlan:
        """The plan's record; measured now unless the Evaluator has it (``again``: add a repeat)."""
        key = tuple(int(a) for a in plan)
        r = self._evaluate([self.actions[a].value for a in key], source, again)
        if r.oom:
            raise RuntimeError(f"plan {list(key)} ran out of memory on {r.device}; pick a smaller workload size")
        old = self.records.get(key)
        self.records[key] = old.merged(r) if old is not None else r
        fresh = set(r.measurement_ids) - self._seen
        self.new_measurements += len(fresh)
        self._seen |= fresh
        return self.records[key]

    def normalised(self, plans: Sequence[Sequence[int]], base: MeasuredPlan) -> np.ndarray:
        """(n, 2) of (peak, seconds) relative to ``base``, from the current records."""
        recs = [self.records[tuple(p)] for p in plans]
        return normalise([(r.peak_bytes, r.step_seconds) for r in recs], base.peak_bytes, base.step_seconds)


def hv_of(ledger: Ledger, plans: Sequence[Sequence[int]], base: MeasuredPlan) -> float:
    """Hypervolume (search.records.pareto convention) of the measured plans."""
    return hypervolume(ledger.normalised(plans, base), REFERENCE) if plans else 0.0


def front_of(ledger: Ledger, plans: Sequence[Sequence[int]], base: MeasuredPlan) -> list[tuple[int, ...]]:
    """The non-dominated plans among ``plans`` (measured), sorted by peak."""
    uniq = list(dict.fromkeys(tuple(p) for p in plans))
    if not uniq:
        return []
    mask = nondominated(ledger.normalised(uniq, base))
    return sorted((p for p, k in zip(uniq, mask) if k), key=lambda p: ledger.records[p].peak_bytes)


def point_row(ledger: Ledger, plan: Sequence[int], base: MeasuredPlan) -> dict[str, Any]:
    """A plan's measured numbers as a JSON row, with savings and slowdown against ``base``."""
    r = ledger.records[tuple(plan)]
    return {"plan": list(r.actions), "peak_bytes": r.peak_bytes,
            "activation_bytes": r.activation_bytes, "step_seconds": r.step_seconds,
            "spread_seconds": r.spread_seconds, "clock": r.clock,
            "n_timed_steps": len(r.step_seconds_samples), "n_measurements": r.n_measurements, "peak_ratio": r.peak_bytes / base.peak_bytes,
            "time_ratio": r.step_seconds / base.step_seconds,
            "peak_saving": 1 - r.peak_bytes / base.peak_bytes,
            "activation_saving": 1 - r.activation_bytes / base.activation_bytes,
            "slowdown": r.step_seconds / base.step_seconds - 1}


def run_search(flags: Sequence[str], out: Path | None = None) -> tuple[dict[str, Any], float]:
    """``python -m search.run`` with ``flags`` into ``out/run`` (a temporary folder when None): its
    report.json and the wall seconds it took (the clock a user waits by). Exits with the CLI's last
    lines when it fails."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_search_") as tmp:
        folder = str(out or tmp)
        cmd = [sys.executable, "-m", "search.run", "--no-progress", "--out", folder, "--name", "run", *flags]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"search.run {' '.join(flags)} failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
        return json.loads((Path(folder) / "run" / "report.json").read_text()), wall

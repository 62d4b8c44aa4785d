"""What every benchmark result carries: the machine it ran on, the code it ran, the file it lives in.

- ``machine_info(device)``: CPU model, cores, torch threads and version, the device measured on
  and the load average, so a reader can tell whether a number can be compared with theirs.
- ``write_result(name, payload, out)``: ``bench/results/<name>.json`` with ``machine`` and
  ``written_at`` added; ``read_results()`` loads every result for the report.
- ``code_commit()``: the commit a row was measured on, for results that outlive many commits.

Memory figures in result files are bytes (``*_bytes``) or MiB (``*_mb``, ``env.data.types.MIB``),
never 10**6-byte megabytes. Nothing here imports torch at import time: the report and the README
renderer read results on machines without it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
PLOTS_DIR = ROOT / "bench" / "plots"
if str(ROOT) not in sys.path:  # the scripts run as ``python bench/<name>.py`` from the repo root
    sys.path.insert(0, str(ROOT))

from env.data.errors import CkptSearchError  # noqa: E402

Result = dict[str, Any]


class BenchError(CkptSearchError):
    """A benchmark that cannot run as asked, or a result file it cannot use."""


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
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({torch.get_num_threads()} threads)"


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """What a reader needs to compare these numbers with theirs."""
    import torch

    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "device": device_name(device),
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def machine_label(machine: dict[str, Any]) -> str:
    """One line naming the machine, for figure captions and table headers (older results named
    fewer fields: ``processor``, ``torch``, ``load_average_1m``)."""
    load = machine.get("load_average_1_5_15") or [machine.get("load_average_1m")]
    device = machine.get("device") or f"cpu ({machine.get('torch_threads', '?')} threads)"
    cpu = machine.get("cpu_model") or machine.get("processor", "?")
    return (f"{device} on {cpu} ({machine.get('cpu_count', '?')} cores), "
            f"torch {machine.get('torch_version', machine.get('torch', '?'))}, load {load[0]}")


def jsonable(x: Any) -> Any:
    """numpy scalars and arrays, sets and tuples as JSON values (``json.dumps(default=...)``)."""
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (set, tuple)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


def write_json(path: Path, body: Result) -> Path:
    """``body`` as indented JSON at ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2, default=jsonable) + "\n")
    return path


def write_result(name: str, payload: Result, out: Path | None = None, device: str = "cpu") -> Path:
    """Write ``payload`` plus ``machine`` and ``written_at`` to ``out`` (default results/<name>.json)."""
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    body = {"bench": name, **payload, "machine": machine_info(device),
            "written_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    return write_json(path, body)


def read_result(path: Path) -> Result:
    """One result file; a missing or unreadable one is named with the fix."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BenchError(f"{path} does not exist; run the bench that writes it first") from None
    except json.JSONDecodeError as e:
        raise BenchError(f"{path} is not valid JSON ({e.msg}, line {e.lineno}); rerun the bench that writes it") from e


def read_results(folder: Path = RESULTS_DIR) -> dict[str, Result]:
    """Every ``*.json`` in ``folder`` by file stem; unreadable files are reported, not skipped silently."""
    return {path.stem: read_result(path) for path in sorted(folder.glob("*.json"))}


def code_commit() -> str | None:
    """The commit the benchmark ran on (``-dirty`` when the code it imports has uncommitted changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "search", "env", "agents", "bench", ":(exclude)bench/results")
    except (OSError, subprocess.CalledProcessError):
        return None  # not a git checkout
    return head + ("-dirty" if dirty else "")


def set_threads(threads: int) -> None:
    """Torch threads for measurement: 1 keeps step times steady on a shared machine."""
    import torch

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)

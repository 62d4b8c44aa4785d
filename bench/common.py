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
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
PLOTS_DIR = ROOT / "bench" / "plots"
if str(ROOT) not in sys.path:  # the scripts run as ``python bench/<name>.py`` from the repo root
    sys.path.insert(0, str(ROOT))

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
    return (f"{machine.get('device', '?')} on {machine.get('cpu_model', '?')} ({machine.get('cpu_count', '?')} cores), "
            f"torch {machine.get('torch_version', machine.get('torch', '?'))}, load {load[0]}")


def workload_specs(names: list[str], quick: bool) -> dict[str, str]:
    """Short names (gpt, cnn, lstm, user) or full specs -> {label: spec} at bench or quick size."""
    table = QUICK_WORKLOADS if quick else BENCH_WORKLOADS
    return {n: table.get(n, n) for n in names}


def write_result(name: str, payload: dict[str, Any], out: Path | None = None, device: str = "cpu") -> Path:
    """Write ``payload`` plus ``machine`` and ``written_at`` to ``out`` (default results/<name>.json)."""
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    body = {"bench": name, **payload, "machine": machine_info(device),
            "written_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2, default=_jsonable) + "\n")
    return path


def read_results(folder: Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    """Every ``*.json`` in ``folder`` by file stem; unreadable files are reported, not skipped silently."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e.msg}, line {e.lineno}); rerun the bench that writes it") from e
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

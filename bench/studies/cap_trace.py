"""Which of the project's files a memory cap passes through in a throughput search, traced in the driver.

A throughput search (``python -m search.run --memory-cap ...``) runs in this process under ``sys.setprofile``
(every thread). A call *carries the cap* where, at its entry, one of its frame's locals (its arguments and the
free variables of a closure) holds it: an int equal to a cap in bytes, a list or tuple that holds one or is the
``--memory-cap`` list itself, or an object with a ``caps`` attribute that does (``ThroughputSetup``), or with a
``setup`` that has such ``caps`` (``ThroughputRun``). The run's ``SearchConfig`` is not counted: every phase
gets it, whether or not the cap matters there. Written (``--out``): the files such calls run in, how many calls
each and the distinct functions, and the *returns into another file*: a cap-carrying call that returns into a
caller in another file of the project, the hops a reader follows back (counted per call, and per distinct
pair of functions: a loop that calls one function 3,000 times is one hop to read).

    python bench/studies/cap_trace.py --out /tmp/cap_trace.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
PACKAGES = ("search", "env", "agents")
CAPS_MIB = (1.2, 2.5)
SEARCH = ["--workload", "gpt/tiny", "--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128",
          "--max-measurements", "10", "--repeats", "1", "--no-progress", "--no-batch-scaling",
          "--throughput-timesteps", "64", "--memory-cap", *map(str, CAPS_MIB)]


def _project_file(filename: str) -> str | None:
    """The path under the project's root of a file of its packages, else None."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts and rel.parts[0] in PACKAGES else None


class CapTrace:
    """The profile hook: cap-carrying calls per file, and their returns into another file."""

    def __init__(self, caps_bytes: set[int], caps_mib: list[float]) -> None:
        self.caps_bytes, self.caps_mib = caps_bytes, caps_mib
        self.calls: Counter[str] = Counter()
        self.functions: dict[str, set[str]] = {}
        self.cross_returns: Counter[str] = Counter()  # "callee -> caller"
        self.hops: set[tuple[str, str]] = set()  # (callee file:function, caller file:function) in two files
        self.carrying: set[int] = set()  # ids of the frames that carry the cap
        self.lock = threading.Lock()

    def carries(self, value: Any, depth: int = 0) -> bool:
        if isinstance(value, bool) or depth > 2:
            return False
        if isinstance(value, int):
            return value in self.caps_bytes
        if isinstance(value, (list, tuple)):
            return (list(value) == self.caps_mib
                    or any(self.carries(v, depth + 1) for v in value[:32] if isinstance(v, (int, list, tuple))))
        if type(value).__name__ == "SearchConfig":
            return False
        caps = getattr(value, "caps", None) if not isinstance(value, dict) else None
        if isinstance(caps, (list, tuple)):
            return self.carries(caps, depth + 1)
        setup = getattr(value, "setup", None) if not isinstance(value, dict) else None
        return setup is not None and isinstance(getattr(setup, "caps", None), (list, tuple)) and \
            self.carries(setup.caps, depth + 1)

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        here = _project_file(frame.f_code.co_filename)
        if here is None:
            return
        if event == "call":
            try:
                found = any(self.carries(v) for v in list(frame.f_locals.values()))
            except Exception:  # noqa: BLE001 - a local whose attributes raise: not the cap
                found = False
            if found:
                with self.lock:
                    self.carrying.add(id(frame))
                    self.calls[here] += 1
                    self.functions.setdefault(here, set()).add(frame.f_code.co_qualname)
            return
        with self.lock:
            if id(frame) not in self.carrying:
                return
            self.carrying.discard(id(frame))
        caller = _project_file(frame.f_back.f_code.co_filename) if frame.f_back is not None else None
        if caller is not None and caller != here:
            with self.lock:
                self.cross_returns[f"{here} -> {caller}"] += 1
                self.hops.add((f"{here}:{frame.f_code.co_qualname}", f"{caller}:{frame.f_back.f_code.co_qualname}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from env.data.types import MIB
    from search.run import main as search

    trace = CapTrace({int(c * MIB) for c in CAPS_MIB}, list(CAPS_MIB))
    threading.setprofile(trace)
    sys.setprofile(trace)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            code = search([*SEARCH, "--out", tmp, "--name", "trace"])
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    result = {"bench": "cap_trace", "command": "python -m search.run " + " ".join(SEARCH), "exit_code": code,
              "files": len(trace.calls), "functions": sum(len(f) for f in trace.functions.values()),
              "calls": sum(trace.calls.values()), "returns_into_another_file": sum(trace.cross_returns.values()),
              "distinct_returns_into_another_file": len(trace.hops),
              "calls_per_file": dict(trace.calls.most_common()),
              "functions_per_file": {f: sorted(fs) for f, fs in sorted(trace.functions.items())},
              "returns_per_file_pair": dict(trace.cross_returns.most_common()),
              "distinct_returns": sorted(f"{a} -> {b}" for a, b in trace.hops)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("exit_code", "files", "functions", "calls", "returns_into_another_file",
                                             "distinct_returns_into_another_file")}))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

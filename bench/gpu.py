"""The premium and fidelity benchmarks on a CUDA GPU, at the built-in default sizes.

    python bench/gpu.py                       # needs an NVIDIA GPU and a CUDA build of torch
    python bench/gpu.py --device cuda:1 --skip-fidelity

On CUDA, peak memory is ``max_memory_allocated`` and step time is synchronised, so these are
the numbers a GPU user sees. Writes ``bench/results/premium_gpu.json`` (``bench/premium.py
--device cuda`` on gpt, cnn and lstm at their default sizes) and ``bench/results/fidelity_gpu.json``
(``bench/fidelity.py``, when it takes ``--device``). Without CUDA it prints why and exits with
status 1, measuring nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import premium  # noqa: E402
from bench.common import RESULTS_DIR, ROOT  # noqa: E402

DEFAULT_SIZES = ["gpt=gpt", "cnn=cnn", "lstm=lstm"]  # label=spec: the built-ins at their default sizes


def no_cuda_message() -> str | None:
    """Why this machine cannot run the GPU benchmarks, or None when it can."""
    if torch.cuda.is_available():
        return None
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (f"bench/gpu.py: no CUDA device (torch {torch.__version__}, {build}); run it on a machine with an "
            "NVIDIA GPU and a CUDA build of torch. Nothing was measured.")


def fidelity_takes_device() -> bool:
    """Whether ``bench/fidelity.py`` has a ``--device`` flag (its measurements stay on CPU otherwise)."""
    path = ROOT / "bench" / "fidelity.py"
    if not path.is_file():
        return False
    out = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, cwd=ROOT)
    return "--device" in out.stdout


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda or cuda:N")
    ap.add_argument("--workloads", nargs="+", default=DEFAULT_SIZES, help="label=spec or bench names (gpt, cnn, lstm)")
    ap.add_argument("--skip-fidelity", action="store_true", help="run the premium table only")
    args = ap.parse_args(argv)
    why = no_cuda_message()
    if why:
        print(why, file=sys.stderr)
        return 1
    premium.main(["--device", args.device, "--workloads", *args.workloads,
                  "--out", str(RESULTS_DIR / "premium_gpu.json")])
    if args.skip_fidelity:
        return 0
    if not fidelity_takes_device():
        print("bench/gpu.py: bench/fidelity.py has no --device flag, so it would measure on the CPU; "
              "not run. Add --device to it (passed to load_workload) to run it here.", file=sys.stderr)
        return 1
    specs = [w.partition("=")[2] or w for w in args.workloads]
    cmd = [sys.executable, str(ROOT / "bench" / "fidelity.py"), "--device", args.device, "--workloads", *specs,
           "--out", str(RESULTS_DIR / "fidelity_gpu.json")]
    return subprocess.run(cmd, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())

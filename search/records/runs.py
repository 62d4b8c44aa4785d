"""Run folders: ``<out>/<run-id>/`` with ``config.json`` and the store; the run id of a workload."""

from __future__ import annotations

import re
import time
from pathlib import Path

from env.data.errors import CkptSearchError
from env.workloads.spec import WorkloadSpec
from search.records import meta
from search.records.config import SearchConfig
from search.records.store import STORE_NAME, RunStore, StoreError


def run_id(workload: str, now: float | None = None) -> str:
    """A readable, folder-safe run id: ``gpt-tiny-20261201-120000``; a user's factory
    ``models/unet.py:build`` gives ``unet-build-<time>``, ``pkg.models:make`` ``models-make-<time>``."""
    spec = WorkloadSpec.parse(workload)
    if spec.is_builtin:
        name = str(spec)
    else:
        where, _, func = spec.target.rpartition(":")
        stem = Path(where).stem if where.endswith(".py") or "/" in where else where.rsplit(".", 1)[-1]
        name = f"{stem}-{func}"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{re.sub(r'[^A-Za-z0-9._]+', '-', name)[:40].strip('-')}-{stamp}"


def make_run_dir(cfg: SearchConfig) -> tuple[SearchConfig, Path]:
    """The run folder: a new one (``config.json`` written), or ``--resume``'s with its saved config."""
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if not (run_dir / STORE_NAME).is_file():
            raise CkptSearchError(f"--resume {run_dir}: no {STORE_NAME} there; give a run folder made by search.run")
        with RunStore(run_dir / STORE_NAME, readonly=True) as s:
            saved = s.read(meta.CONFIG)
        if saved is None:
            raise StoreError(f"--resume {run_dir}: the store has no config; it is not a ckpt-search run")
        keep = {"progress": cfg.progress, "address": cfg.address}
        return SearchConfig(**{**saved, **keep, "resume": str(run_dir)}).validate(), run_dir
    run_dir = Path(cfg.out) / (cfg.name or run_id(cfg.workload))
    if (run_dir / STORE_NAME).exists():
        raise CkptSearchError(f"run folder '{run_dir}' already holds a run; pick another --name or --resume it")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.to_json() + "\n")
    return cfg, run_dir

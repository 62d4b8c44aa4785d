"""``python -m search.run``: search a model's checkpoint plans, end to end.

1. Parse the config (flags over ``--config`` over defaults; ``--resume RUN`` reads the run's own).
2. Make the run folder ``<out>/<run-id>/`` with ``config.json`` and the SQLite store.
3. Start Ray locally, or join ``--address``.
4. Profile the workload, measure the baseline rules, solve the exact frontier on the profile.
5. Train K PPO agents, one per memory budget, measuring the plans that could join the frontier.
6. Write ``frontier.json``, ``report.md``/``report.json`` and ``plans/``; print the folder last.

Exit codes: 0 done, 2 bad input (one line on stderr), 130 interrupted (the store is resumable).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from env.errors import CkptSearchError
from env.workloads import WorkloadSpec, builtin_options
from search.config import SearchConfig, parse_config
from search.store import RunStore, StoreError


def make_run_dir(cfg: SearchConfig) -> tuple[SearchConfig, Path]:
    if cfg.resume:
        run_dir = Path(cfg.resume)
        store_path = run_dir / "store.sqlite"
        if not store_path.is_file():
            raise CkptSearchError(f"--resume {run_dir}: no store.sqlite there; give a run folder made by search.run")
        with RunStore(store_path, readonly=True) as s:
            saved = s.get_meta("config")
        if saved is None:
            raise StoreError(f"--resume {run_dir}: the store has no config; it is not a ckpt-search run")
        keep = {"progress": cfg.progress, "address": cfg.address}
        cfg = SearchConfig(**{**saved, **keep, "resume": str(run_dir)}).validate()
        return cfg, run_dir
    name = cfg.name or f"{cfg.workload.replace('/', '-').replace(':', '-').replace('?', '-')[:40]}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.out) / name
    if (run_dir / "store.sqlite").exists():
        raise CkptSearchError(f"run folder '{run_dir}' already holds a run; pick another --name or --resume it")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.to_json() + "\n")
    return cfg, run_dir


def start_ray(address: str) -> None:
    import ray

    root = str(Path(__file__).resolve().parent.parent)
    runtime_env = {"env_vars": {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                                "RAY_DEDUP_LOGS": "0"}}
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        # "local": a new instance even when another cluster runs on this machine (that one needs --address)
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, runtime_env=runtime_env,
                 log_to_driver=False)


def main(argv: Sequence[str] | None = None) -> int:
    from search.orchestrate import Search
    from search.progress import ProgressView
    from search.report import write_outputs

    try:
        cfg = parse_config(argv)
        spec = WorkloadSpec.parse(cfg.workload)
        if spec.is_builtin:  # fail before a run folder exists; factories are checked by the evaluator
            builtin_options(spec)
        cfg, run_dir = make_run_dir(cfg)
        store = RunStore(run_dir / "store.sqlite")
        if store.get_meta("config") is None:
            store.set_meta("config", json.loads(cfg.to_json()))
            store.set_meta("started_at", time.time())
        store.set_meta("status", "running")
    except CkptSearchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    view = ProgressView(enabled=cfg.progress)
    search = None
    try:
        start_ray(cfg.address)
        search = Search(cfg, run_dir, store, on_round=view.update)
        with view:
            search.run()
        if cfg.batch_scaling:
            from search.scaling import measure_batch_scaling

            measure_batch_scaling(search)
        report = write_outputs(search)
        store.set_meta("status", "finished")
        store.set_meta("finished_at", time.time())
        view.summary(report)
    except KeyboardInterrupt:
        if search is not None:
            search.drain(timeout_s=120)
        store.set_meta("status", "interrupted")
        print(f"interrupted: every finished measurement is in {run_dir / 'store.sqlite'}; "
              f"continue with: python -m search.run --resume {run_dir}", file=sys.stderr)
        print(run_dir)
        return 130
    except CkptSearchError as e:
        store.set_meta("status", "failed")
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import signal
import socket
import sys
import threading
import time
from typing import Sequence

from env.data.errors import CkptSearchError
from env.data.unit_choice import UnitChoice
from env.workloads.spec import WorkloadSpec, builtin_options
from search.records import meta
from search.records.config import parse_config
from search.records.runs import make_run_dir
from search.records.store import RunStore


def main(argv: Sequence[str] | None = None) -> int:
    from search.engine import ray_session
    from search.engine.driver import Driver, prepare
    from search.engine.evaluator_pool import EvaluatorPool
    from search.engine.ledger import Ledger
    from search.engine.progress import ProgressView, RoundStatus
    from search.engine.report import write_outputs

    try:
        cfg = parse_config(argv)
        spec = WorkloadSpec.parse(cfg.workload)
        if spec.is_builtin:  # fail before a run folder exists; factories are checked by the evaluator
            builtin_options(spec)
        cfg, run_dir = make_run_dir(cfg)
        store = RunStore(run_dir / "store.sqlite")
        if store.read(meta.CONFIG) is None:
            store.write(meta.CONFIG, json.loads(cfg.to_json()))
            store.write(meta.STARTED_AT, time.time())
        store.write(meta.STATUS, "running")
        store.write(meta.DRIVER, {"pid": os.getpid(), "host": socket.gethostname()})  # a killed run reads as stopped
    except CkptSearchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    view = ProgressView(enabled=cfg.progress)
    driver = None
    interrupted = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.set()  # remembered: a KeyboardInterrupt that library code swallows still stops the run
        signal.default_int_handler(signum, frame)

    def on_round(status: RoundStatus) -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        view.update(status)

    try:
        ray_session.start_ray(cfg.address)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, on_sigint)
        pool = EvaluatorPool(cfg)
        ledger = Ledger(prepare(store, pool), store)
        explain_units(store.read(meta.UNIT_CHOICE), store.read(meta.HEADROOM))
        driver = Driver(cfg, run_dir, ledger, pool, on_round=on_round)
        with view:
            driver.run()
        if interrupted.is_set():
            raise KeyboardInterrupt
        if cfg.batch_scaling:
            from search.engine.scaling import measure_batch_scaling

            measure_batch_scaling(cfg.workload, ledger, pool.first)
        report = write_outputs(cfg, run_dir, ledger)
        store.write(meta.STATUS, "finished")
        store.write(meta.FINISHED_AT, time.time())
        view.summary(report)
    except KeyboardInterrupt:
        if driver is not None:
            driver.drain()
        store.write(meta.STATUS, "interrupted")
        print(f"interrupted: every finished measurement is in {run_dir / 'store.sqlite'}; "
              f"continue with: python -m search.run --resume {run_dir}", file=sys.stderr)
        print(run_dir)
        return 130
    except CkptSearchError as e:
        store.write(meta.STATUS, "failed")
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(run_dir)
    return 0


def explain_units(choice: UnitChoice | None, headroom: str | None) -> None:
    """The decision units on stderr, each with the bytes it saves for backward, and the coverage;
    then, when no plan can save much, the one line that says so."""
    if choice:
        for line in choice.lines():
            print(f"units: {line}", file=sys.stderr)
    if headroom:
        print(f"note: {headroom}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

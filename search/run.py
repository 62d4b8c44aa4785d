"""``python -m search.run``: search a model's checkpoint plans, end to end.

1. Parse the config (flags over ``--config`` over defaults; ``--resume RUN`` reads the run's own).
2. Make the run folder ``<out>/<run-id>/`` with ``config.json`` and the SQLite store, and lock it
   (one live driver per run folder).
3. Start Ray locally, or join ``--address``.
4. Profile the workload, measure the baseline rules, solve the exact frontier on the profile.
5. Train K PPO agents, one per memory budget, measuring the plans that could join the frontier.
6. Write ``frontier.json``, ``report.md``/``report.json`` and ``plans/``; print the folder last.

A run's status tells the truth: ``running`` while its driver lives, ``finished``, ``interrupted``
(Ctrl-C or SIGTERM: the Evaluators are drained into the store, what was measured is written to
``frontier.json`` and the report, and ``--resume`` continues), ``failed: <cause>`` (one line). A
finished run resumed says so and changes nothing; a run whose driver is alive is not resumed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Sequence

from env.data.errors import CkptSearchError, ModelError
from env.data.unit_choice import UnitChoice
from env.workloads.spec import WorkloadSpec, builtin_options
from search.records import meta
from search.records.config import SearchConfig, given_flags, parse_config
from search.records.frontier_file import frontier_path
from search.records.runs import check_writable, make_run_dir
from search.records.store import STORE_NAME, RunStore, StoreError

# the exit codes --help lists (search.records.config.EXIT_CODES)
EXIT_OK = 0
EXIT_BAD_INPUT = 2  # a bad flag, spec, store or folder, or a refusal: one line on stderr
EXIT_MODEL_FAILED = 3  # the model's own error, in one line; the run's status is "failed: <cause>"
EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}  # interrupted: resumable with --resume


class Stop(KeyboardInterrupt):
    """The first SIGINT or SIGTERM: the search stops, keeps what it measured and can be resumed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """SIGINT and SIGTERM stop the search once (``Stop`` in the main thread); while it drains and writes,
    further signals only print a note (a second Ctrl-C that interrupted Ray's shutdown crashed the process)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._noted = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """(Re)install the handlers: Ray's start replaces the SIGTERM handler with its own crash dump."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in EXIT_SIGNAL:
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            raise Stop(signum)
        if not self._noted:
            self._noted = True
            print("still stopping: the last measurements go into the store; wait a few seconds", file=sys.stderr)

    def stop_if_received(self) -> None:
        """Raise ``Stop`` if a signal came while library code swallowed the exception."""
        if self.received is not None:
            raise Stop(self.received)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    signals = Signals()
    signals.install()
    try:
        cfg = parse_config(argv)
        if not cfg.resume:  # fail before Ray starts and before a run folder exists
            check_workload(cfg.workload)
        if cfg.resume and (done := finished_run(Path(cfg.resume))):
            print(done, file=sys.stderr)
            print(cfg.resume)
            return EXIT_OK
        import search.engine.driver  # noqa: F401 - torch and Ray imported before the run folder exists (seconds on a
        # busy machine): a Ctrl-C meanwhile leaves nothing behind
        cfg, run_dir, lock = make_run_dir(cfg, given_flags(argv))
    except CkptSearchError as e:
        print(f"error: {e}", file=sys.stderr)
        signals.restore()
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        signals.restore()
        return EXIT_SIGNAL[signals.received or signal.SIGINT]
    try:
        return _search(cfg, run_dir, signals)
    finally:
        lock.release()
        signals.restore()


def check_workload(workload: str) -> None:
    """The workload spec checked in this process, before Ray starts and a run folder is made: a built-in's
    options, or a user's factory found (its file imported, ``env.workloads.workload.resolve_factory``)."""
    spec = WorkloadSpec.parse(workload)
    if spec.is_builtin:
        builtin_options(spec)
    else:
        from env.workloads.workload import resolve_factory

        resolve_factory(spec.target)


def finished_run(run_dir: Path) -> str | None:
    """One line when ``run_dir`` holds a finished run (resuming it changes nothing but a missing frontier.json,
    rebuilt from the store with the report: ``rebuild_outputs``); else None."""
    if not (run_dir / STORE_NAME).is_file():
        return None
    with RunStore(run_dir / STORE_NAME, readonly=True) as store:
        if store.read(meta.STATUS) != "finished":
            return None
        measured = store.count(measured_only=True)
    done = "frontier.json and report.md written; nothing was changed"
    if not frontier_path(run_dir).is_file():
        rebuild_outputs(run_dir)
        done = "frontier.json was missing: rebuilt from the store, with report.md and plans/"
    return (f"run '{run_dir}' finished already ({measured} plans measured; {done}). To search again, start a new "
            f"run: python -m search.run --config {run_dir}/config.json")


def rebuild_outputs(run_dir: Path) -> None:
    """frontier.json, report.md and plans/ written again from the run's store alone."""
    from search.engine.ledger import Ledger, SearchSetup
    from search.engine.report import write_outputs

    check_writable(run_dir)
    with RunStore(run_dir / STORE_NAME) as store:
        profile, saved = store.read(meta.PROFILE), store.read(meta.CONFIG)
        if profile is None or saved is None:
            raise StoreError(f"run '{run_dir}' is finished but its store holds no profile or config to rebuild "
                             "frontier.json from; start a new run: python -m search.run --config "
                             f"{run_dir}/config.json")
        ledger = Ledger(SearchSetup.from_profile(profile), store)
        ledger.load_store()
        write_outputs(SearchConfig(**saved), run_dir, ledger)


def _search(cfg: Any, run_dir: Path, signals: Signals) -> int:
    from search.engine import ray_session
    from search.engine.driver import Driver, prepare
    from search.engine.evaluator_pool import EvaluatorPool
    from search.engine.agent_pool import start_processes
    from search.engine.ledger import Ledger
    from search.engine.phase_clock import PhaseClock
    from search.engine.progress import ProgressView, RoundStatus
    from search.engine.report import write_outputs

    try:
        store = RunStore(run_dir / STORE_NAME)
    except CkptSearchError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if store.read(meta.STARTED_AT) is None:
        store.write(meta.STARTED_AT, time.time())
    store.write(meta.CONFIG, json.loads(dataclasses.replace(cfg, resume="").to_json()))  # a resume's flags too
    store.write(meta.STATUS, "running")
    store.write(meta.DRIVER, {"pid": os.getpid(), "host": socket.gethostname()})  # a killed run reads as stopped
    view = ProgressView(enabled=cfg.progress)
    ledger: Ledger | None = None
    driver: Driver | None = None

    def on_round(status: RoundStatus) -> None:
        signals.stop_if_received()
        view.update(status)

    clock = PhaseClock(store)
    try:
        with clock.phase("Ray start"):
            ray_session.start_ray(cfg.address)
        signals.install()
        with clock.phase("Evaluators' start and warm-up"):
            pool = EvaluatorPool(cfg, signals.stop_if_received)
        agent_processes = start_processes(cfg)  # they import while the first Evaluator profiles
        with clock.phase("profile"):
            ledger = Ledger(prepare(store, pool), store)
        explain_units(store.read(meta.UNIT_CHOICE), store.read(meta.HEADROOM))
        driver = Driver(cfg, run_dir, ledger, pool, on_round=on_round, clock=clock, agent_processes=agent_processes)
        with view:
            driver.run()
        signals.stop_if_received()
        if cfg.batch_scaling:
            from search.engine.scaling import measure_batch_scaling

            with clock.phase("batch scaling"):
                measure_batch_scaling(cfg.workload, driver.measurer)
        with clock.phase("report"):
            report = write_outputs(cfg, run_dir, ledger)
        store.write(meta.STATUS, "finished")
        store.write(meta.FINISHED_AT, time.time())
        view.summary(report)
    except KeyboardInterrupt:  # ``Stop``, or Ray's own KeyboardInterrupt for the signal that came in a wait
        _interrupted(store, run_dir, driver, ledger, lambda: write_outputs(cfg, run_dir, ledger))
        return EXIT_SIGNAL[signals.received or signal.SIGINT]
    except ModelError as e:
        return _failed(store, e, EXIT_MODEL_FAILED)
    except CkptSearchError as e:
        return _failed(store, e, EXIT_BAD_INPUT)
    finally:
        store.close()
    print(run_dir)
    return EXIT_OK


def _interrupted(store: RunStore, run_dir: Path, driver: Any, ledger: Any, write: Callable[[], Any]) -> None:
    """Drain what the Evaluators measured into the store, write the frontier and report from it, and say how
    to resume. Signals that come meanwhile are noted, not obeyed (``Signals``)."""
    if driver is not None:
        driver.drain()
    wrote = ""
    if ledger is not None and ledger.baseline() is not None:
        write()
        wrote = "; frontier.json and report.md hold what was measured so far"
    store.write(meta.STATUS, "interrupted")
    print(f"interrupted: every finished measurement is in {run_dir / STORE_NAME}{wrote}; "
          f"continue with: python -m search.run --resume {run_dir}", file=sys.stderr)
    print(run_dir)


def _failed(store: RunStore, error: CkptSearchError, code: int) -> int:
    store.write(meta.STATUS, f"failed: {error}")
    print(f"error: {error}", file=sys.stderr)
    return code


def explain_units(choice: UnitChoice | None, headroom: str | None) -> None:
    """The decision units on stderr, each with the bytes it saves for backward, and the coverage;
    then, when no plan can save much, the one line that says so."""
    if choice:
        for line in choice.lines():
            print(f"units: {line}", file=sys.stderr)
    if headroom:
        print(f"note: {headroom}", file=sys.stderr)


def _exit(code: int) -> None:
    """Leave the process without Ray's shutdown: its local processes are killed (``end_local_processes``), a
    cluster's actors of this job end when it disconnects. Ray's shutdown puts SIGTERM and SIGINT
    back to their defaults, so a second Ctrl-C or SIGTERM during it killed the process midway, and in
    its atexit hook printed a traceback and once crashed it; here they are ignored until the end."""
    from search.engine.ray_session import end_local_processes

    for sig in EXIT_SIGNAL:
        signal.signal(sig, signal.SIG_IGN)
    end_local_processes()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())

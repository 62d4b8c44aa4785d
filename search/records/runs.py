"""Run folders: ``<out>/<run-id>/`` with ``config.json`` and the store; the run id of a workload; the lock
that keeps one live driver per run folder."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import IO, Any, Iterable

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


CONFIG_NAME = "config.json"
RESUME_KEEPS = ("progress", "address", "step_timeout")  # how a run is driven, not what it searches
RESUME_ALWAYS = ("resume", "config", "out", "name")  # say where the run is, not what it searches


def make_run_dir(cfg: SearchConfig, given: Iterable[str] = ()) -> tuple[SearchConfig, Path, "RunLock"]:
    """The run folder, checked writable and locked before anything is written to it: a new one (``config.json``
    written under the lock, so that of two runs started at once into one folder it describes the one that
    searches), or ``--resume``'s with its saved config and the flags ``given`` that a resume honours
    (``resumed_config``)."""
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if not (run_dir / STORE_NAME).is_file():
            made = "it holds no run yet (its search stopped before the store was made): start it again" if (
                run_dir / CONFIG_NAME).is_file() else "give a run folder made by search.run"
            raise CkptSearchError(f"--resume {run_dir}: no {STORE_NAME} there; {made}")
        check_writable(run_dir)
        lock = RunLock(run_dir).acquire()
        try:
            with RunStore(run_dir / STORE_NAME, readonly=True) as s:
                saved = s.read(meta.CONFIG)
            if saved is None:
                raise StoreError(f"--resume {run_dir}: the store has no config; it is not a ckpt-search run")
            resumed = resumed_config(SearchConfig(**{**saved, "resume": str(run_dir)}), cfg, given)
            if resumed.to_json() != SearchConfig(**{**saved, "resume": str(run_dir)}).to_json():  # what it searches now
                (run_dir / CONFIG_NAME).write_text(dataclasses.replace(resumed, resume="").to_json() + "\n")
        except BaseException:
            lock.release()
            raise
        return resumed, run_dir, lock
    run_dir = Path(cfg.out) / (cfg.name or run_id(cfg.workload))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CkptSearchError(f"cannot make run folder '{run_dir}' ({e.strerror}); give --out a folder you may "
                              "write to") from None
    check_writable(run_dir)
    lock = RunLock(run_dir).acquire()
    if (run_dir / STORE_NAME).exists():
        lock.release()
        raise CkptSearchError(f"run folder '{run_dir}' already holds a run; pick another --name or --resume it")
    (run_dir / CONFIG_NAME).write_text(cfg.to_json() + "\n")
    return cfg, run_dir, lock


def resumed_config(saved: SearchConfig, asked: SearchConfig, given: Iterable[str]) -> SearchConfig:
    """The config a resumed run continues with: its own, with the flags the user gave that a resume can honour
    (``RESUME_KEEPS``; more ``--timesteps``; a new ``--memory-cap`` on a throughput run); one line refuses the
    others that differ from the run's, naming them."""
    changes = {k: getattr(asked, k) for k in given if k not in RESUME_ALWAYS
               and getattr(asked, k) != getattr(saved, k)}
    can = set(RESUME_KEEPS)
    if asked.timesteps >= saved.timesteps:
        can.add("timesteps")
    if saved.throughput_mode and asked.memory_cap:
        can.add("memory_cap")
    refused = [k for k in changes if k not in can]
    if refused:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in refused)
        raise CkptSearchError(
            f"--resume {saved.resume}: {flags} cannot change on a resumed run (it measured with the run's own; "
            f"a resume can change {', '.join('--' + k.replace('_', '-') for k in (*RESUME_KEEPS, 'timesteps'))} (more) "
            f"and --memory-cap (a throughput run)); drop them, or start a new run: python -m search.run --config "
            f"{saved.resume}/{CONFIG_NAME} {' '.join('--' + k.replace('_', '-') for k in refused)} ...")
    return dataclasses.replace(saved, **changes).validate()


def check_writable(run_dir: Path) -> None:
    """Refuse, in one line naming the file and the fix, a run folder or a file of it (the store, its write-ahead
    log and shared memory, config.json, the lock) this process may not write, before anything is written: a
    store opened for writing without that fails midway and leaves its side files behind."""
    names = [STORE_NAME, STORE_NAME + "-wal", STORE_NAME + "-shm", CONFIG_NAME, LOCK_NAME]
    for path in [run_dir] + [run_dir / n for n in names if (run_dir / n).exists()]:
        if not os.access(path, os.W_OK):
            what = "run folder" if path == run_dir else "file"
            raise CkptSearchError(f"{what} '{path}' is not writable by this user; make it writable (chmod u+w, or "
                                  f"chattr -i where it is immutable) and run again; nothing was written to the run")


LOCK_NAME = "driver.lock"


class RunLock:
    """An exclusive lock on a run folder, held by the one driver searching it (``flock``: released by the
    operating system when that process exits, a kill -9 included). The file says who holds it."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._file: IO[str] | None = None

    def holder(self) -> dict[str, Any] | None:
        """Who holds the lock now ({pid, host, since}); None when no live driver does."""
        if not self.path.is_file():
            return None
        with open(self.path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = f.read()
                try:
                    return json.loads(text) if text else {}
                except json.JSONDecodeError:
                    return {}
            fcntl.flock(f, fcntl.LOCK_UN)
        return None

    def acquire(self) -> "RunLock":
        """Take the lock, or refuse in one line naming the live driver that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            who = self.holder() or {}
            raise CkptSearchError(f"run folder '{self.path.parent}' is being searched by a live driver (pid "
                                  f"{who.get('pid', '?')} on {who.get('host', '?')}); wait for it to finish, or stop "
                                  "it (Ctrl-C) and resume then") from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

"""Ray for a search: start it locally or join a cluster, and read actor results as project errors."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import threading
from pathlib import Path
from typing import Any

from env.data.errors import CkptSearchError, MeasurementError, ModelError, PlanError, UnitError, WorkloadError

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's nodes bind to 127.0.0.1 (no multi-node)
OBJECT_STORE_LEAST = 100 << 20  # bytes: Ray refuses an object store below 75 MiB


class RankDiedError(CkptSearchError):
    """A rank of an Evaluator's process group died (``search.engine.fsdp.group``): the group stopped its other
    ranks, and is restarted as one, as a dead Evaluator is."""


_ERRORS: dict[str, type[CkptSearchError]] = {
    cls.__name__: cls for cls in (CkptSearchError, WorkloadError, UnitError, PlanError, MeasurementError, ModelError,
                                  RankDiedError)}
_PROJECT_ERROR = re.compile(rf"({'|'.join(_ERRORS)}|StoreError): ([^\n]+)")


WORKER_NICENESS_ENV = "RAY_worker_niceness"  # the raylet's setting for its workers' niceness


def start_ray(address: str = "", num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` within ``RAY_JOIN`` seconds (``join_cluster``), or start a new local instance
    (``num_cpus``: all cores). Actors find this checkout through PYTHONPATH, so a search runs from a source tree
    too."""
    import ray

    if ray.is_initialized():
        return
    raylet_messages_to_stderr()
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env_vars = {"PYTHONPATH": os.pathsep.join([root, *paths]), "RAY_DEDUP_LOGS": "0"}
    if address:  # the cluster's workers get the driver's PYTHONPATH through a runtime env
        join_cluster(address, env_vars)
        return
    # A local instance's workers inherit this process's environment: no runtime env, whose agent made every
    # actor's start about 0.6 s slower (1.0 s against 0.3 s for a first actor, measured here).
    os.environ.update(env_vars)
    # Ray starts its workers at niceness 15; an Evaluator's steps then yield a core to nothing else, and the agents'
    # processes (``search.engine.agent_pool.AGENT_NICENESS`` above the workers') yield it to the Evaluators.
    os.environ.setdefault(WORKER_NICENESS_ENV, "0")
    # The local instance's processes inherit this thread's signal mask: with SIGTERM blocked while they
    # start, they outlive a SIGTERM sent to the whole process group or job (timeout, SLURM, systemd), so
    # the driver can still drain the Evaluators into the store; ray.shutdown() and the driver's death
    # (Ray's fate sharing kills them) still end them.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        # "local": a new instance even when another cluster runs on this machine (that one needs --address).
        # A single-node instance serves this machine only: Ray binds it to loopback when told that
        # no other node will join, instead of to the host's network address.
        os.environ.setdefault(LOCAL_ONLY_ENV, "0")
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 object_store_memory=object_store_bytes())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


_ENDING = threading.Event()  # set when this driver ends its local instance: the raylet's messages are dropped
END_ROUNDS = 10  # rounds of killing the local instance's workers and agents before its GCS and raylet


def end_local_processes() -> None:
    """Kill every process this driver started, and theirs: a local Ray instance's GCS, raylet, workers and
    agents. The driver leaves without Ray's shutdown (``search.run._exit``); the GCS, the raylet and the
    workers then end with it, but the raylet's dashboard and runtime-env agents, which start with SIGTERM
    blocked (``start_ray``), lived on for minutes after each search and took a share of the cores from the next.
    Call it only when the driver's work is done (the store written): nothing of a cluster joined with
    ``--address`` is a child of this process. From then on the raylet's messages are dropped: it reported the
    node marked dead and its workers killed, which is what this does."""
    import psutil

    _ENDING.set()

    def kill(processes: list[psutil.Process]) -> None:
        for p in processes:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(processes, timeout=0.5)

    with contextlib.suppress(psutil.Error):
        me = psutil.Process()
        for _ in range(END_ROUNDS):  # the raylet's children first: while it lives, it may start another worker
            direct = {p.pid for p in me.children()}
            deeper = [p for p in me.children(recursive=True) if p.pid not in direct]
            if not deeper:
                break
            kill(deeper)
        kill(me.children(recursive=True))


def join_cluster(address: str, env_vars: dict[str, str], seconds: float | None = None) -> None:
    """``ray.init(address)`` within ``seconds`` (``search.engine.deadlines.RAY_JOIN``), saying meanwhile what it
    waits on; past them, ``DeadlineError`` in one line. Ray itself retries a cluster that never answers without
    end (its driver waits for the cluster's GCS), so the call runs in a thread of its own, which the run's exit
    leaves behind. A local instance is started on the calling thread instead: the processes it starts die with
    the thread that started them."""
    import ray

    from search.engine import deadlines

    seconds = deadlines.RAY_JOIN if seconds is None else seconds
    failed: list[BaseException] = []

    def join() -> None:
        try:
            ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=False)
        except BaseException as e:  # noqa: BLE001 - raised again on the calling thread
            failed.append(e)

    thread = threading.Thread(target=join, name="ray-join", daemon=True)
    thread.start()
    stage = f"Ray's start, joining the cluster at --address {address}"
    fix = ("no Ray cluster answered there: start one (ray start --head on its head node), give the head's address "
           "(ray status there prints it), or leave --address out to start Ray on this machine")

    def passed() -> Exception:
        return deadlines.DeadlineError(f"{stage} did not return within {seconds:.0f} s; {fix}")

    deadlines.wait_until(lambda timeout: (thread.join(timeout), not thread.is_alive())[1], seconds, stage, set(),
                         None, True, passed)
    if failed:
        raise failed[0]


def object_store_bytes() -> int | None:
    """The local instance's object store under an address-space limit (``ulimit -v``): a tenth of it, at least
    ``OBJECT_STORE_LEAST``, as every Ray process maps the whole store and Ray's default (30% of free memory) can
    exceed the limit, failing the driver's start in ``mmap``; None (Ray's default) where there is no limit."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if limit == resource.RLIM_INFINITY else max(OBJECT_STORE_LEAST, limit // 10)


def raylet_messages_to_stderr() -> None:
    """What Ray's raylet reports to the driver (a worker that died: an Evaluator killed on a configuration that
    does not fit) goes to stderr, its first sentence only, where Ray prints all of it on stdout, whose last line
    a search keeps for its run folder. The run's events (store and report) say what happened."""
    from ray._private import worker

    original = worker.print_to_stdstream
    if getattr(original, "raylet_to_stderr", False):
        return

    def printed(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            if _ENDING.is_set():
                return  # the instance is being ended (``end_local_processes``): what its raylet says of it is no news
            lines = [line.split(". ")[0].rstrip(".") + "." for line in data.get("lines", [])]
            data = {**data, "is_err": True, "lines": lines}
        original(data, ignore_prefix)

    printed.raylet_to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = printed


def get(ref: Any) -> Any:
    """``ray.get`` that turns a project error raised inside an actor back into that error."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause
        while isinstance(cause, ray.exceptions.RayTaskError):  # an actor's call into another actor failed
            cause = cause.cause
        if isinstance(cause, CkptSearchError):
            raise cause from None
        raise
    except ray.exceptions.RayActorError as e:  # an actor that failed to start: only its message is left
        found = _PROJECT_ERROR.findall(str(e))
        if found:
            name, message = found[-1]
            raise _ERRORS.get(name, CkptSearchError)(message) from None
        raise



def actor_gone() -> tuple[type[BaseException], ...]:
    """The errors a call raises when its actor's process died (killed, crashed), or a rank of its group did:
    catch these to restart it."""
    import ray

    return (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, RankDiedError)


def discard(handle: Any) -> None:
    """End an actor that is replaced, whether or not its process still runs: an FSDP group whose rank died
    answers ``RankDiedError`` from a live process, which would otherwise outlive its restart."""
    import ray

    if handle is not None:
        with contextlib.suppress(Exception):  # already gone: nothing to end
            ray.kill(handle, no_restart=True)


def death_cause(error: BaseException, limit: int = 200) -> str:
    """``Type: first line naming an error`` of a dead actor's exception, for the run's events."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    cause = next((line for line in lines if "Error" in line), lines[0] if lines else "")
    return f"{type(error).__name__}: {cause[:limit]}"

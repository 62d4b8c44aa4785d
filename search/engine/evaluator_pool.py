"""EvaluatorPool: one Evaluator per device of the Ray cluster, fed from one queue.

- Devices: one Evaluator per GPU the cluster offers (``num_gpus=1`` each, at most ``--devices``),
  or on CPU-only clusters ``--evaluators N`` CPU Evaluators placed round-robin over the nodes, each
  with its own measuring threads. Each builds the workload itself from the spec; nothing large travels.
- Queue: ``measure(jobs)`` hands each plan to whichever Evaluator is free (``ray.wait``) and
  gives every result to ``on_result`` the moment it arrives, so the store has it at once.
- Comparable: every Evaluator says its device model; a cluster whose Evaluators differ is
  refused in one line, so a frontier never mixes device models.
- FSDP (``--fsdp N``): each Evaluator is a group of N rank actors measuring under FSDP2 on one node
  (``search.engine.fsdp.group.FsdpGroup``), started, called and restarted as an Evaluator is.
- Aside: ``first_aside(call)`` starts a long call on the first Evaluator (the throughput search's profile at
  another micro-batch) and hands jobs to the others until that call is done, not queued behind it.
- Faults: an Evaluator that dies mid-measurement is restarted (its plan goes back on the queue, for
  whichever Evaluator is free first; a plan that killed two is recorded as not fitting); one that died
  otherwise is restarted once and left out after a second death, by the policy the agents share
  (``search.engine.restarts``). ``events`` says what happened, for the report
  (``search.engine.evaluator_restarts.EvaluatorRestarts``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Sequence

from env.data.errors import CkptSearchError
from env.data.measured import MeasuredPlan
from env.data.types import PlanSource
from env.measure.compiled import CompileOptions
from env.measure.peers import Peer
from search.engine import ray_session
from search.engine.batch_book import Job
from search.engine.deadlines import PROCESS_START, WARM_UP_STEPS, Deadlines, ask_where, where_call
from search.engine.evaluator import ray_evaluator, resolve_device
from search.engine.evaluator_restarts import EvaluatorRestarts, EvaluatorSlot, describe_job
from search.engine.fsdp.group import group_count, group_nodes, ray_fsdp_group
from search.records.config import SearchConfig



def _compile_options(cfg: SearchConfig) -> CompileOptions | bool:
    """What the Evaluators measure with: ``--compile`` in its ``--compile-scope``, or eager steps (False)."""
    return CompileOptions(scope=cfg.measure_scope) if cfg.compile else False


THROUGHPUT_EVALUATORS_MOST = 4  # CPU Evaluators a throughput search widens to when --throughput-evaluators is 0
SEARCH_EVALUATORS_MOST = 2  # CPU Evaluators a search measures on when --evaluators is 0


def _per_core(cfg: SearchConfig, nodes: Sequence[dict[str, Any]]) -> int:
    """One per ``--measure-threads`` cores of the cluster's alive nodes (one per node where a measurement takes
    all its cores)."""
    cores = [int(n.get("Resources", {}).get("CPU", 0)) for n in nodes if n.get("Alive")]
    return len([c for c in cores if c]) if not cfg.measure_threads else sum(c // cfg.measure_threads for c in cores)


def cpu_evaluators(cfg: SearchConfig, nodes: Sequence[dict[str, Any]]) -> int:
    """How many CPU Evaluators a search measures on: ``--evaluators``, or with 0 one per ``--measure-threads``
    cores (``_per_core``), at least one and at most ``SEARCH_EVALUATORS_MOST``. The agents train while the
    Evaluators wait (``--overlap``), so the measuring phases have the cores to themselves (docs/measurement.md,
    "Evaluators and devices"). A compiled search gets one: every Evaluator compiles every variant itself, so a
    second one doubles the compiling, which is most of such a search on CPU."""
    if cfg.evaluators:
        return cfg.evaluators
    return 1 if cfg.compile else max(1, min(SEARCH_EVALUATORS_MOST, _per_core(cfg, nodes)))


def throughput_evaluators(cfg: SearchConfig, nodes: Sequence[dict[str, Any]]) -> int:
    """How many CPU Evaluators a throughput search measures on: ``--throughput-evaluators``, or one per
    ``--measure-threads`` cores (``_per_core``), at most ``THROUGHPUT_EVALUATORS_MOST``; never fewer than the
    search's own (``cpu_evaluators``). Its phases after the run's own search are measurements alone, no agent
    training beside them, so the cores the search's Evaluators leave are idle."""
    if cfg.throughput_evaluators:
        return max(cfg.throughput_evaluators, cfg.evaluators)
    return max(cpu_evaluators(cfg, nodes), min(THROUGHPUT_EVALUATORS_MOST, _per_core(cfg, nodes)))


def evaluator_count(cfg: SearchConfig, cluster_gpus: float) -> tuple[int, bool]:
    """(how many Evaluators, on GPUs?) for the config and the cluster's GPU count (``--fsdp``: groups, which
    ``search.engine.fsdp.group.group_count`` fits to the nodes)."""
    if cfg.fsdp:
        import ray

        return group_count(cfg.fsdp, cfg.device, cfg.devices, cfg.evaluators or 1, cfg.measure_threads, ray.nodes())
    device = resolve_device(cfg.device) if cfg.device != "auto" else ("cuda" if cluster_gpus >= 1 else "cpu")
    if device.startswith("cuda"):
        if cluster_gpus < 1:
            raise CkptSearchError(f"--device {cfg.device}: the Ray cluster offers no GPU; use --device cpu, or join "
                                  "a cluster with GPUs (--address)")
        n = int(cluster_gpus)
        return (min(n, cfg.devices) if cfg.devices else n), True
    import ray

    return (throughput_evaluators if cfg.throughput_mode else cpu_evaluators)(cfg, ray.nodes()), False


class EvaluatorPool(EvaluatorRestarts):
    def __init__(self, cfg: SearchConfig, stop_if_asked: Callable[[], None] = lambda: None) -> None:
        """``stop_if_asked``: called between waits, raises where the run was told to stop (Ctrl-C, SIGTERM)."""
        import ray

        self.ray, self.cfg = ray, cfg
        n, gpu = evaluator_count(cfg, ray.cluster_resources().get("GPU", 0.0))
        self.slots = [EvaluatorSlot(f"evaluator_{i}", gpu) for i in range(n)]
        self.deadlines = Deadlines(cfg.step_timeout, cfg.repeats, stop_if_asked=stop_if_asked)
        self.events: list[str] = []  # deaths and restarts, for the store and the report (``on_event`` too)
        self.on_event: Callable[[str], None] | None = None
        self.warm_ups: list[dict[str, Any]] = []  # each Evaluator's warm-up ({evaluator, steps}), for the report
        if cfg.fsdp:  # a group builds as it starts, on the units the first one chose
            for slot in self.slots:
                self._start(slot)
        else:  # every process starts (and imports) at once; each is built in turn, on the first one's units
            for slot in self.slots:
                self._create(slot)
            for slot in self.slots:
                self._build(slot)
        self._check_device_models()
        self._warm_up(self.slots)

    @property
    def units(self) -> list[str]:
        """The decision units, as the first Evaluator chose them; the others are given these FQNs."""
        return list(self.slots[0].info["units"]) if self.slots and self.slots[0].info else []

    def _placement(self, slot: EvaluatorSlot) -> Any:
        """Where a slot's Evaluator goes: GPU Evaluators by Ray's SPREAD (one GPU each already places
        them); CPU Evaluators round-robin over the nodes alive now that offer CPUs, in node order, pinned
        there (an Evaluator takes no CPU from Ray's accounting, so any node fits it), since SPREAD and a
        soft affinity can put two CPU Evaluators on one busy node (see docs/measurement.md#ranking-and-drift-why)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if slot.gpu and self.cfg.fsdp:  # a group's ranks take their GPUs on its node
            node = group_nodes(self.cfg.fsdp, self.ray.nodes())[self.slots.index(slot)]
            return NodeAffinitySchedulingStrategy(node, soft=False)
        if slot.gpu:
            return "SPREAD"

        nodes = sorted(n["NodeID"] for n in self.ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0)
        if len(nodes) < 2:
            return "SPREAD"
        return NodeAffinitySchedulingStrategy(nodes[self.slots.index(slot) % len(nodes)], soft=False)

    def _start(self, slot: EvaluatorSlot) -> None:
        """The slot's actor started and built (a restart, or an FSDP group)."""
        self._create(slot)
        self._build(slot)

    def _create(self, slot: EvaluatorSlot) -> None:
        """The slot's actor created: its process starts; a one-device Evaluator is built by ``_build``."""
        cfg = self.cfg
        threads = None if slot.gpu else (cfg.measure_threads or None)
        kind = ray_fsdp_group() if cfg.fsdp else ray_evaluator(num_gpus=1 if slot.gpu else 0)
        actor = kind.options(scheduling_strategy=self._placement(slot))
        units = self.units or cfg.units  # one choice of units for every Evaluator
        group = (cfg.fsdp,) if cfg.fsdp else ()  # an FSDP group: its ranks
        lazy = {} if cfg.fsdp else {"build": False}  # built by a call the driver waits on with a deadline
        slot.handle = actor.remote(cfg.workload, cfg.seed, units, cfg.actions, cfg.repeats,
                                   "cuda" if slot.gpu else "cpu", threads, slot.name, _compile_options(cfg),
                                   cfg.max_units, cfg.reference_every, *group, **lazy)

    def _build(self, slot: EvaluatorSlot) -> None:
        """The slot's workload built (one-device: on the units the first Evaluator chose, once it has) and its
        ``info`` read, each within its deadline."""
        cfg = self.cfg
        lazy = not cfg.fsdp
        if lazy:
            built = slot.handle.build.remote(self.units or None)
            self.get(where_call(slot.handle), PROCESS_START, f"{slot.name}'s process start", fixed=True)
            self.get(built, self.deadlines.build(),
                     f"{slot.name}: building the workload {cfg.workload} (its factory, then one training step)", slot)
        started = self.deadlines.step() if lazy else PROCESS_START + self.deadlines.build()  # a group builds as it starts
        slot.info = self.get(slot.handle.info.remote(), started, f"{slot.name}'s start", slot if lazy else None)
        if self.deadlines.first_step is None and slot.info.get("first_step_seconds"):
            self.deadlines.first_step = float(slot.info["first_step_seconds"])

    def get(self, ref: Any, seconds: float, stage: str, slot: EvaluatorSlot | None = None,
            stoppable: bool = True, fixed: bool = False) -> Any:
        """``ray_session.get`` within ``seconds`` (``search.engine.deadlines``), saying meanwhile what it waits
        on; past them, ``DeadlineError`` names ``stage`` and where ``slot``'s Evaluator is."""
        refs = ref if isinstance(ref, list) else [ref]
        where = (lambda: ask_where(self.ray, slot.handle)) if slot is not None and not self.cfg.fsdp else None
        self.deadlines.wait(self.ray, refs, seconds, stage, where, stoppable=stoppable, fixed=fixed)
        return ray_session.get(ref)

    def _warm_up(self, slots: Sequence[EvaluatorSlot]) -> None:
        """Every Evaluator steps until its step time settles, all at once, before the first measurement."""
        self.warm_ups += self.get([s.handle.warm_up.remote() for s in slots],
                                  WARM_UP_STEPS * self.deadlines.step(), "the Evaluators' warm-up steps",
                                  slots[0] if len(slots) == 1 else None)

    def _check_device_models(self) -> None:
        models = {s.info["device_model"] for s in self.slots if s.info}
        if len(models) > 1:
            raise CkptSearchError(f"the cluster's Evaluators measure on different device models ({', '.join(sorted(models))}); "
                                  "plans are compared only on one model: limit the search to one (--devices, or a "
                                  "cluster of one GPU type)")

    # -- what the driver asks -------------------------------------------------------------------
    @property
    def live(self) -> list[EvaluatorSlot]:
        return [s for s in self.slots if s.alive]

    @property
    def first(self) -> Any:
        """The Evaluator that profiles the workload and measures other batch sizes."""
        return self.live[0].handle

    @contextlib.contextmanager
    def first_aside(self, call: Callable[[Any], Any], what: str = "its own call") -> Iterator[Any]:
        """``call(first Evaluator's handle)`` started, its object reference yielded; while the block runs, jobs go
        to the other Evaluators until the call is done, then to all (with no other, to the first after the call).
        On gpt/small a ladder measurement queued behind the throughput search's profile waited 14 s there while
        the other Evaluator was free."""
        slot = self.live[0]
        slot.aside, slot.aside_what = (ref := call(slot.handle)), what
        try:
            yield ref
        finally:
            slot.aside = None

    @property
    def on_gpus(self) -> bool:
        return bool(self.slots) and all(s.gpu for s in self.slots)

    def describe(self) -> list[dict[str, Any]]:
        warm = {w["evaluator"]: w for w in self.warm_ups}  # the latest warm-up of each label
        return [{"name": s.name, "label": s.info["evaluator"] if s.info else s.name, "node": (s.info or {}).get("node"),
                 "device": (s.info or {}).get("device_model"), "pid": (s.info or {}).get("pid"),
                 "restarts": s.restarts, "alive": s.alive,
                 "warm_up_steps": warm.get((s.info or {}).get("evaluator"), {}).get("steps"),
                 **({"rank_pids": s.info["rank_pids"]} if s.info and "rank_pids" in s.info else {})}
                for s in self.slots]

    def preload(self, records: Sequence[MeasuredPlan]) -> None:
        ray_session.get([s.handle.preload.remote(list(records)) for s in self.live])

    def measure(self, jobs: Sequence[Job], on_result: Callable[[MeasuredPlan], MeasuredPlan]) -> list[MeasuredPlan]:
        """Measure every job (a plan or a peer, at the workload's own batch) on whichever Evaluator is free;
        ``on_result`` gets each as it arrives. Returns what ``on_result`` returned, in the jobs' order."""
        return self._dispatch(jobs, self.evaluate, on_result)

    @staticmethod
    def evaluate(handle: Any, job: Job, killed: bool) -> Any:
        """The remote call that measures ``job`` (at the workload's own batch) on the Evaluator ``handle``;
        ``killed``: record it as not fitting, measured by no step."""
        if isinstance(job.item, Peer):
            return handle.evaluate_peer.remote(job.item, killed)
        return handle.evaluate.remote(list(job.item), job.source, job.again, not_fitting=killed)

    def measurement_seconds(self, job: Any = None, base: int = 0) -> float:
        """A measurement's deadline (``search.engine.deadlines``): at a ``Job``'s micro-batch over the
        workload's own batch ``base`` where given; a compile's time too where the run compiles, or the job is a peer
        that compiles whatever the run measures (``Peer.compiled``: a compile budget)."""
        scale = job.micro_batch / base if base and getattr(job, "micro_batch", 0) else 1.0
        item = getattr(job, "item", None)
        compiled = bool(self.cfg.compile) or (isinstance(item, Peer) and item.compiled)
        return self.deadlines.measurement(scale, compiled=compiled)

    def run_jobs(self, jobs: Sequence[Any], call: Callable[[Any, Any, bool], Any],
                 on_result: Callable[[Any], Any], deadline: Callable[[Any], float] | None = None) -> list[Any]:
        """Any remote ``call(handle, job, not_fitting)`` run as plans are (``measure``): each job on whichever
        Evaluator is free, ``on_result`` given each result as it arrives; returns what it returned, in the jobs'
        order. ``not_fitting`` True asks for the job's record as not fitting, measured by no step (``_dispatch``);
        ``deadline(job)``: its seconds (a measurement's by default)."""
        return self._dispatch(jobs, call, on_result, deadline)

    def measure_async(self, jobs: Sequence[Job], on_result: Callable[[MeasuredPlan], MeasuredPlan]) -> threading.Thread:
        """``measure`` in a thread, for agents training meanwhile on other cores (GPU Evaluators)."""
        t = threading.Thread(target=self.measure, args=(list(jobs), on_result), daemon=True, name="measurements")
        t.start()
        return t

    def on_each(self, names: Sequence[str], source: PlanSource) -> list[MeasuredPlan]:
        """The same plan measured once on every live Evaluator, on all of them at once, as they measure plans
        (the baseline: a slow device shows). One after the other, the others waited: in a gpt/small throughput
        search's confirming passes, two Evaluators were busy 4.4 and 4.8 of 12.4 seconds."""
        def ask(slot: EvaluatorSlot) -> Any:
            return slot.handle.evaluate.remote(list(names), source, True)

        out = []
        for slot, ref in [(slot, ask(slot)) for slot in list(self.live)]:
            for _ in range(2):  # a restarted Evaluator measures it too
                try:
                    out.append(self.get(ref, self.measurement_seconds(), f"{slot.name}: the measurement of "
                                        f"{describe_job(names)}", slot))
                    break
                except ray_session.actor_gone() as e:
                    self._died(slot, e)
                    if not slot.alive:
                        break
                    ref = ask(slot)
        return out

    def seconds(self) -> dict[str, float]:
        """Measuring seconds and counts of every live Evaluator, summed (``Evaluator.seconds``)."""
        total: dict[str, float] = {}
        for busy in self._gather([s.handle.seconds.remote() for s in self.live]):
            for k, v in busy.items():
                total[k] = total.get(k, 0) + v
        return total

    def drain(self) -> list[MeasuredPlan]:
        """Every live Evaluator's journal: all it measured since the last drain, the answers to the driver's jobs
        included (``MeasuringActor.drain``)."""
        return [m for batch in self._gather([s.handle.drain.remote() for s in self.live]) for m in batch]


"""Evaluator: owns one device, its workload and the measurement cache.

One Evaluator per device (each GPU; one on a CPU-only machine), so two measurements never
share a device. It answers with ``env.data.measured.MeasuredPlan`` records: each measurement gets an
id unique across Evaluators and restarts, so the store never records one twice. Everything
measured is kept in ``journal`` until the driver drains it into the run store; a resumed run
preloads the store's records so nothing is measured again. ``ray_evaluator`` makes the same
class a Ray actor.

Drift: with ``reference_every`` seconds, the Evaluator measures the reference plan (all keep)
again when ``search.records.ranking.reference_due`` says so, and labels each sample with
``search.records.ranking.pooled_reference`` of its last references (``MeasuredPlan.reference_seconds``):
what it knows when it measures (an agent's measured reward uses it). The search ranks plans
against the references nearest to them on both sides (``search.records.ranking.Ranking``), read
from the measurement ids, which count everything one Evaluator measured in order.

Its peers are measured by the methods of ``search.engine.evaluator_peers.EvaluatorPeers``, its plans at other
micro-batches by those of ``search.engine.evaluator_batches.EvaluatorBatches``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from collections import deque
from typing import Any, Sequence

import torch

from env.data.errors import CkptSearchError, model_errors
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan import Action, Plan, action_summary, parse_action
from env.data.types import PlanSource
from env.data.unit_choice import UnitChoice
from env.measure.compiled import CompileOptions
from env.measure.gate import check_plans
from env.measure.measurement import (compile_options, measure, not_fitting, record_fields, warm_up,
                                    warmup_before_timing)
from env.measure.micro_batch import AtMicroBatch
from env.measure.profiler import profile
from env.runtime.apply import plan_for
from env.units.choice import MAX_UNITS, resolve_units
from env.workloads.spec import WorkloadSpec
from env.workloads.workload import Workload, load_workload
from search.engine.evaluator_batches import EvaluatorBatches
from search.engine.evaluator_peers import EvaluatorPeers, counted
from search.engine.stuck import where_stuck
from search.records.ranking import REFERENCE_WINDOW, pooled_reference, reference_due

GATE_STAGE = "the correctness gate (a training step with each shown plan against one without)"  # model_errors' stage

def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class Evaluator(EvaluatorPeers, EvaluatorBatches):
    def __init__(self, workload_spec: str, seed: int, units: Sequence[str], actions: Sequence[str], repeats: int,
                 device: str = "auto", threads: int | None = None, name: str = "evaluator_0",
                 compile: bool | CompileOptions = False, max_units: int = MAX_UNITS, reference_every: float = 0.0,
                 build: bool = True) -> None:
        """``build`` False: the workload is built by ``build``, a call of its own that the driver can wait on
        with a deadline and ask ``where`` it is meanwhile (an actor's constructor answers no other call)."""
        self._args = (workload_spec, seed, units, actions, repeats, device, threads, name, compile, max_units,
                      reference_every)
        self.workload: Workload | None = None  # type: ignore[assignment]
        self.units = []
        if build:
            self.build()

    def build(self) -> None:
        """Build the workload (its factory) and choose the decision units (one instrumented training step)."""
        (workload_spec, seed, units, actions, repeats, device, threads, name, compile, max_units,
         reference_every) = self._args
        if threads:
            torch.set_num_threads(threads)
        self.device = resolve_device(device)
        self.workload = load_workload(workload_spec, seed=seed, device=self.device)
        start = time.perf_counter()
        with model_errors("the choice of decision units (one instrumented training step)"):
            unit_choice = resolve_units(self.workload, list(units) or ["auto"], max_units)
        self.first_step_seconds = time.perf_counter() - start
        self._keep_records(workload_spec, seed, repeats, compile, unit_choice, actions, name, reference_every)
        self.at_batch = AtMicroBatch(self.workload, self.units, self.actions, repeats, compile)  # --memory-cap

    def where(self) -> str:
        """Where this process's busy call is now (``search.engine.stuck.where_stuck``): asked by the driver when
        a call passes its deadline, in a concurrency group of its own so that it answers meanwhile."""
        return where_stuck(self.workload.model if self.workload is not None else None, list(self.units),
                           busy_in=os.path.basename(__file__))

    def _keep_records(self, workload_spec: str, seed: int, repeats: int, compile: bool | CompileOptions,
                      unit_choice: UnitChoice, actions: Sequence[str], name: str, reference_every: float) -> None:
        """What every Evaluator keeps, whatever measures for it: its units and label, measurement ids, the
        cache, the journal and the references."""
        self.spec, self.seed, self.repeats, self.compile = workload_spec, seed, repeats, compile
        self.unit_choice = unit_choice
        self.units = list(self.unit_choice.units)
        self.actions = [parse_action(a) for a in actions]
        self.node = node_name()
        self.label = f"{name}@{self.node}"
        self._id_prefix = f"{name}-{uuid.uuid4().hex[:8]}"  # unique across restarts and resumed runs
        self.cache: dict[str, MeasuredPlan] = {}
        self._peers: dict[str, MeasuredPlan] = {}  # the peers measured, by name (each lends its peak again)
        self.journal: list[MeasuredPlan] = []  # every new measurement, until the driver drains it
        self.n_measured = 0
        self._other_batch: Workload | None = None
        options = compile_options(compile)  # a plan compiled afresh: each reference would compile again
        self.reference_every = 0.0 if options and options.scope == "model" else reference_every
        self._keep = [Action.KEEP.value] * len(self.units)
        self._reference: tuple[float, float, int] | None = None  # (median s, monotonic time, n_measured) of the last
        self._reference_samples: deque[list[float]] = deque(maxlen=REFERENCE_WINDOW)  # the last ones' samples
        self.n_references = 0
        self.busy = {"plans": 0.0, "references": 0.0, "plan_measurements": 0, "reference_measurements": 0}

    def info(self) -> dict[str, Any]:
        return {"units": self.units, "unit_choice": self.unit_choice.model_dump(mode="json"),
                "device": self.device, "pid": os.getpid(), "node": self.node,
                "batch_shape": self.workload.batch_shape, "evaluator": self.label,
                "first_step_seconds": self.first_step_seconds,
                "device_model": device_model(self.workload.device)}

    def profile(self) -> dict[str, Any]:
        with model_errors("the profile of the decision units"):
            prof: ModelProfile = profile(self.workload, self.units, self.actions, repeats=self.repeats)
        return prof.model_dump(mode="json")

    def check(self, plans: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
        """The correctness gate's verdict on each plan (action names per unit): one step with it against one
        without, from the same weights, inputs and RNG state (``env.measure.gate.check_plans``), eager."""
        with model_errors(GATE_STAGE):
            checks = check_plans(self.workload, [self._plan(a) for a in plans], self.units, seed=self.seed)
        return [c.model_dump(mode="json") for c in checks]

    def warm_up(self) -> dict[str, Any]:
        """Steps until the step time settles (``env.measure.measurement.warm_up``), before any measurement."""
        with model_errors("the warm-up steps"):
            return {"evaluator": self.label, "steps": len(warm_up(self.workload))}

    def preload(self, records: Sequence[MeasuredPlan]) -> int:
        """Known measurements (from a resumed store): answered from the cache from now on."""
        for r in records:
            self.cache[r.digest] = r
        return len(self.cache)

    def evaluate(self, actions: Sequence[str], source: str, again: bool = False,
                 not_fitting: bool = False) -> MeasuredPlan:
        """Measure a plan (action names per unit, in ``units`` order) unless it is cached.

        Returns the new measurement, or the cached record when nothing was measured. ``again``
        measures a cached plan once more (the store merges the two). ``not_fitting``: measure nothing, record
        the plan as not fitting (it killed the Evaluators that measured it, ``EvaluatorPool``).
        """
        plan = self._plan(actions)
        cached = self.cache.get(plan.digest)
        if cached is not None and not again and not not_fitting:
            return cached.proposed_by(source)
        is_reference = list(actions) == self._keep
        if not_fitting:
            m = self._labelled(self._killed(self.workload, plan.digest, actions, source), is_reference)
        else:
            if not is_reference:
                self._refresh_reference()
            m = self._measure(plan, source, is_reference, known=cached)
        self.cache[plan.digest] = cached.merged(m) if cached is not None else m
        self.journal.append(m)
        return m

    def _plan(self, actions: Sequence[str]) -> Plan:
        """The plan giving ``actions[i]`` (names) to ``units[i]`` of this Evaluator's model."""
        return plan_for(self.workload.model, self.units, [Action(a) for a in actions])

    def _measure(self, plan: Any, source: str, is_reference: bool, known: MeasuredPlan | None = None,
                 whole_model: CompileOptions | None = None) -> MeasuredPlan:
        """One measurement of ``plan``; ``known``, the plan measured before, lends its peak on CPU
        (``env.measure.measurement.reuses_peak``). ``whole_model``: measured with these options instead (the
        whole model compiled, ``evaluate_whole_model``), after two warm-up steps."""
        self.n_measured += 1
        what = "whole-model compiled measurement" if whole_model else "measurement"
        with counted(self.busy, "references" if is_reference else "plans"), model_errors(
                f"the {what} of plan {plan.digest} ({action_summary(plan.actions.values())})"):
            m = measure(self.workload, plan, self.units, repeats=self.repeats,
                        warmup=2 if whole_model else warmup_before_timing(self.workload, known, self.compile),
                        source=source, measurement_id=f"{self._id_prefix}:{self.n_measured}",
                        compile=whole_model or self.compile, known=known)
        return self._labelled(m, is_reference)

    def _killed(self, workload: Workload, digest: str, actions: Sequence[str], source: str) -> MeasuredPlan:
        """The record of a configuration whose measurement killed this Evaluator's process twice (the kernel's
        out-of-memory killer): not fitting, ``env.measure.measurement.not_fitting``, made without a step."""
        self.n_measured += 1
        fields = record_fields(workload, digest, actions, source, f"{self._id_prefix}:{self.n_measured}")
        return not_fitting(workload, fields, **({"compile_seconds": 0.0} if self.compile else {}))

    def seconds(self) -> dict[str, float]:
        """Seconds spent measuring plans and references (the all-keep plan against drift), and how many."""
        return dict(self.busy)

    def _refresh_reference(self) -> None:
        """The all-keep plan measured again when ``reference_due``: into the journal (the store gets it
        by ``drain``), not the cache, which answers the driver with records whose measurements the
        store has (or gets in the same answer), as a store merges a record's samples only whole."""
        age, since = None, 0
        if self._reference is not None:
            _, at, n = self._reference
            age, since = time.monotonic() - at, self.n_measured - n
        if not reference_due(age, since, self.reference_every):
            return
        plan = self._plan(self._keep)
        self.journal.append(self._measure(plan, PlanSource.rule("none"), is_reference=True,
                                          known=self.cache.get(plan.digest)))

    def _labelled(self, m: MeasuredPlan, is_reference: bool) -> MeasuredPlan:
        """The measurement with this Evaluator's label and, when references are on, each sample's reference."""
        update: dict[str, Any] = {"evaluators": [self.label]}
        if is_reference and m.oom:
            self.reference_every = 0.0  # all keep does not fit this device: nothing to pair with
        if self.reference_every and is_reference:
            self._reference_samples.append(m.step_seconds_samples)
            self._reference = (pooled_reference(self._reference_samples), time.monotonic(), self.n_measured)
            self.n_references += 1
        if self.reference_every and self._reference is not None:
            update["reference_seconds"] = [self._reference[0]] * len(m.step_seconds_samples)
        return m.model_copy(update=update)

    def evaluate_whole_model(self, actions: Sequence[str], source: str, not_fitting: bool = False) -> MeasuredPlan:
        """Measure a plan with the plan applied and then the whole model compiled (``--compile-scope both``'s
        pass over the frontier), as a user who calls ``torch.compile(model)`` runs it: a compile of its own,
        never cached with the plan's regional measurements, its times paired with this Evaluator's references
        as a plan's are."""
        options = compile_options(self.compile)
        if options is None:
            raise CkptSearchError("a whole-model measurement needs a compiled search; run with --compile "
                                  "--compile-scope both")
        if not_fitting:  # as ``evaluate`` takes it
            return self._labelled(self._killed(self.workload, self._plan(actions).digest, actions, source), False)
        self._refresh_reference()
        return self._measure(self._plan(actions), source, is_reference=False,
                             whole_model=dataclasses.replace(options, scope="model"))

    def evaluate_at_batch(self, actions: Sequence[str], batch_size: int) -> dict[str, Any]:
        """Peak and time of a plan at another batch size (built-in workloads)."""
        other = with_batch_size(self.spec, batch_size)
        if self._other_batch is None or self._other_batch.spec != str(other):
            self._other_batch = load_workload(other, seed=self.seed, device=self.device)
        w = self._other_batch
        plan = plan_for(w.model, self.units, [Action(a) for a in actions])
        return batch_point(batch_size, measure(w, plan, self.units, repeats=self.repeats))

    def drain(self) -> list[MeasuredPlan]:
        """Every measurement since the last drain (the store skips those it already has)."""
        out, self.journal = self.journal, []
        return out


def with_batch_size(spec: str, batch_size: int) -> WorkloadSpec:
    """The workload spec with its ``batch_size`` option set (built-in workloads)."""
    parsed = WorkloadSpec.parse(spec)
    opts = dict(parsed.options)
    opts["batch_size"] = str(batch_size)
    return WorkloadSpec(parsed.target, parsed.preset, tuple(sorted(opts.items())))


def batch_point(batch_size: int, m: MeasuredPlan) -> dict[str, Any]:
    """A plan measured at another batch size, as ``search.records.meta.BatchPoint``."""
    return {"batch_size": batch_size, "peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds, "oom": m.oom,
            "clock": m.clock}


def device_model(device: torch.device) -> str:
    """What plans measured here can be compared on: the GPU's name, or the CPU's model and threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "cpu")
    return f"{model}, {torch.get_num_threads()} threads"


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read().splitlines()
    except OSError:
        return []


def node_name() -> str:
    """The Ray node this process runs on (short id and IP), or the host name outside Ray."""
    import ray

    if ray.is_initialized():  # a Ray actor, or a process that joined Ray: its node has a runtime context
        return f"{ray.get_runtime_context().get_node_id()[:8]}/{ray.util.get_node_ip_address()}"
    return socket.gethostname()


def ray_evaluator(num_gpus: int = 0):  # type: ignore[no-untyped-def]
    """The Evaluator as a Ray actor class pinned to one device (a GPU when ``num_gpus``)."""
    import ray

    # one call at a time measures ("default"); ``where`` answers beside it
    return ray.remote(num_cpus=0, num_gpus=num_gpus, max_concurrency=1, concurrency_groups={"watch": 1})(Evaluator)

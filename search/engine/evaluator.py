"""Evaluator: the ``MeasuringActor`` that owns one device, its workload and the measurement cache.

One Evaluator per device (each GPU; one on a CPU-only machine), so two measurements never
share a device. It answers with ``env.data.measured.MeasuredPlan`` records, each with an id unique across
Evaluators and restarts; what it keeps and answers as every measuring actor does (ids, cache, journal,
references, ``evaluate``, ``drain``) is ``search.engine.measuring_actor.MeasuringActor``'s. A resumed run
preloads the store's records so nothing is measured again. ``ray_evaluator`` makes the class a Ray actor.

Drift: with ``reference_every`` seconds, the Evaluator measures the reference plan (all keep)
again when ``search.records.ranking.reference_due`` says so, and labels each sample with
``search.records.ranking.pooled_reference`` of its last references (``MeasuredPlan.reference_seconds``):
what it knows when it measures (an agent's measured reward uses it). The search ranks plans
against the references nearest to them on both sides (``search.records.ranking.Ranking``), read
from the measurement ids, which count everything one Evaluator measured in order.

Beyond the base, one device measures what an FSDP group does not: its peers (the methods of
``search.engine.evaluator_peers.EvaluatorPeers``), its plans at other micro-batches (those of
``search.engine.evaluator_batches.EvaluatorBatches``), plans with the whole model compiled, and ``where`` its
busy call is.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import torch

from env.data.errors import CkptSearchError, model_errors
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan import Action, Plan, action_summary
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
from search.engine.measuring_actor import MeasuringActor
from search.engine.stuck import where_stuck

GATE_STAGE = "the correctness gate (a training step with each shown plan against one without)"  # model_errors' stage


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class Evaluator(EvaluatorPeers, EvaluatorBatches, MeasuringActor):
    """A ``MeasuringActor`` on one device: the workload whole in this process, its peers and other micro-batches."""

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

    def build(self, units: Sequence[str] | None = None) -> None:
        """Build the workload (its factory) and choose the decision units (one instrumented training step);
        ``units``: those instead of the constructor's (the first Evaluator's choice, known after this process
        started)."""
        (workload_spec, seed, given, actions, repeats, device, threads, name, compile, max_units,
         reference_every) = self._args
        units = given if units is None else units
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
        self.eager_at_batch = AtMicroBatch(self.workload, self.units, self.actions, repeats) if compile else self.at_batch

    def where(self) -> str:
        """Where this process's busy call is now (``search.engine.stuck.where_stuck``): asked by the driver when
        a call passes its deadline, in a concurrency group of its own so that it answers meanwhile."""
        return where_stuck(self.workload.model if self.workload is not None else None, list(self.units),
                           busy_in=os.path.basename(__file__))

    def _keep_records(self, workload_spec: str, seed: int, repeats: int, compile: bool | CompileOptions,
                      unit_choice: UnitChoice, actions: Sequence[str], name: str, reference_every: float) -> None:
        """What every measuring actor keeps (``MeasuringActor._keep_records``), and the peers measured."""
        super()._keep_records(workload_spec, seed, repeats, compile, unit_choice, actions, name, reference_every)
        self._peers: dict[str, MeasuredPlan] = {}  # the peers measured, by name (each lends its peak again)

    def _described(self) -> dict[str, Any]:
        return {"batch_shape": self.workload.batch_shape, "first_step_seconds": self.first_step_seconds,
                "device_model": device_model(self.workload.device)}

    def profile(self) -> dict[str, Any]:
        with model_errors("the profile of the decision units"):
            # eager, its predicted peaks are checked by the search's rules phase, which measures those plans anyway
            # (``search.engine.phases.rules``); a compiled search's rules are compiled, so it checks them here
            prof: ModelProfile = profile(self.workload, self.units, self.actions, repeats=self.repeats,
                                         check=bool(self.compile))
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

    def _plan(self, actions: Sequence[str]) -> Plan:
        """The plan giving ``actions[i]`` (names) to ``units[i]`` of this Evaluator's model."""
        return plan_for(self.workload.model, self.units, [Action(a) for a in actions])

    def _measure(self, plan: Any, source: str, is_reference: bool, known: MeasuredPlan | None = None,
                 whole_model: CompileOptions | None = None) -> MeasuredPlan:
        """One measurement of ``plan``; ``known``, the plan measured before, lends its peak on CPU
        (``env.measure.measurement.reuses_peak``). ``whole_model``: measured with these options instead (the
        whole model compiled, ``evaluate_whole_model``), after two warm-up steps."""
        measurement_id = self._next_id()
        what = "whole-model compiled measurement" if whole_model else "measurement"
        with counted(self.busy, "references" if is_reference else "plans"), model_errors(
                f"the {what} of plan {plan.digest} ({action_summary(plan.actions.values())})"):
            m = measure(self.workload, plan, self.units, repeats=self.repeats,
                        warmup=2 if whole_model else warmup_before_timing(self.workload, known, self.compile),
                        source=source, measurement_id=measurement_id,
                        compile=whole_model or self.compile, known=known)
        return self._labelled(m, is_reference)

    def _killed(self, digest: str, actions: Sequence[str], source: str) -> MeasuredPlan:
        """The record of a configuration whose measurement killed this Evaluator's process twice (the kernel's
        out-of-memory killer): not fitting, ``env.measure.measurement.not_fitting``, made without a step."""
        fields = record_fields(self.workload, digest, actions, source, self._next_id())
        return not_fitting(self.workload, fields, **({"compile_seconds": 0.0} if self.compile else {}))

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
            return self._labelled(self._killed(self._plan(actions).digest, actions, source), False)
        self._refresh_reference()
        return self._measure(self._plan(actions), source, is_reference=False,
                             whole_model=dataclasses.replace(options, scope="model"))


def with_batch_size(spec: str, batch_size: int) -> WorkloadSpec:
    """The workload spec with its ``batch_size`` option set (built-in workloads)."""
    parsed = WorkloadSpec.parse(spec)
    opts = dict(parsed.options)
    opts["batch_size"] = str(batch_size)
    return WorkloadSpec(parsed.target, parsed.preset, tuple(sorted(opts.items())))


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


def ray_evaluator(num_gpus: int = 0):  # type: ignore[no-untyped-def]
    """The Evaluator as a Ray actor class pinned to one device (a GPU when ``num_gpus``)."""
    import ray

    # one call at a time measures ("default"); ``where`` answers beside it
    return ray.remote(num_cpus=0, num_gpus=num_gpus, max_concurrency=1, concurrency_groups={"watch": 1})(Evaluator)

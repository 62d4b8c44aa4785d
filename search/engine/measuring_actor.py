"""MeasuringActor: what every actor that measures plans for an ``EvaluatorPool`` is, on one device or many.

Two kinds implement it whole: the one-device ``search.engine.evaluator.Evaluator`` and the FSDP group
``search.engine.fsdp.group.FsdpGroup``, whose ranks share one plan's step. The pool starts, calls and restarts
either the same way, and no phase of the search knows which it has.

What it keeps (``_keep_records``): the decision units and actions, its label, measurement ids unique across
actors, restarts and resumed runs (``<name>-<uuid>:<n>``), the cache of known plans, the journal, the reference
plan's last measurements (drift) and the seconds spent measuring.

What it answers: ``info``, ``profile``, ``warm_up``, ``check`` (the correctness gate), ``peers`` (those it
measures beside its plans), ``evaluate`` a plan (or answer it from the cache), ``measure_at`` another micro-batch,
``preload``, ``seconds`` and ``drain``. A kind says how it measures through ``_plan``, ``_measure``,
``_killed`` and ``_described``.

At least once, written once: every measurement it takes goes into ``journal`` as well as into its answer, and
the driver drains the journal after each batch of jobs and at Ctrl-C, so a measurement finished but never
read as an answer still reaches the store; the store skips one whose id it holds
(``search.records.store.RunStore.record``; docs/measurement.md#how-a-measurement-reaches-the-store).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Sequence

from env.data.measured import MeasuredPlan
from env.data.plan import Action, Plan, parse_action
from env.data.types import PlanSource
from env.data.unit_choice import UnitChoice
from env.measure.compiled import CompileOptions
from env.measure.measurement import compile_options
from env.measure.peers import Peer
from search.records.ranking import REFERENCE_WINDOW, pooled_reference, reference_due


class MeasuringActor(ABC):
    device: str
    unit_choice: UnitChoice
    units: list[str]

    def _keep_records(self, workload_spec: str, seed: int, repeats: int, compile: bool | CompileOptions,
                      unit_choice: UnitChoice, actions: Sequence[str], name: str, reference_every: float) -> None:
        """What every measuring actor keeps, whatever measures for it: its units and label, measurement ids, the
        cache, the journal and the references."""
        self.spec, self.seed, self.repeats, self.compile = workload_spec, seed, repeats, compile
        self.unit_choice = unit_choice
        self.units = list(self.unit_choice.units)
        self.actions = [parse_action(a) for a in actions]
        self.node = node_name()
        self.label = f"{name}@{self.node}"
        self._id_prefix = f"{name}-{uuid.uuid4().hex[:8]}"  # unique across restarts and resumed runs
        self.cache: dict[str, MeasuredPlan] = {}
        self.journal: list[MeasuredPlan] = []  # every new measurement, until the driver drains it
        self.n_measured = 0
        options = compile_options(compile)  # a plan compiled afresh: each reference would compile again
        self.reference_every = 0.0 if options and options.scope == "model" else reference_every
        self._keep = [Action.KEEP.value] * len(self.units)
        self._reference: tuple[float, float, int] | None = None  # (median s, monotonic time, n_measured) of the last
        self._reference_samples: deque[list[float]] = deque(maxlen=REFERENCE_WINDOW)  # the last ones' samples
        self.n_references = 0
        self.busy = {"plans": 0.0, "references": 0.0, "plan_measurements": 0, "reference_measurements": 0}

    # -- what each kind says and measures ---------------------------------------------------------------------
    @abstractmethod
    def _described(self) -> dict[str, Any]:
        """What ``info`` adds for this kind: at least ``batch_shape`` and ``device_model`` (what plans measured
        here can be compared on)."""

    @abstractmethod
    def profile(self) -> dict[str, Any]:
        """The ``env.data.model_profile.ModelProfile`` the search prices plans with, as JSON."""

    @abstractmethod
    def warm_up(self) -> dict[str, Any]:
        """Steps until the step time settles, before any measurement: ``{"evaluator": label, "steps": n}``."""

    @abstractmethod
    def check(self, plans: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
        """The correctness gate's verdict on each plan (action names per unit), as ``env.measure.gate`` gives it."""

    @abstractmethod
    def peers(self, kinds: Sequence[str], budgets: Sequence[float]) -> list[Peer]:
        """The peers of the given kinds (compile ``budgets``) this actor measures beside its plans."""

    @abstractmethod
    def measure_at(self, item: Sequence[str] | Peer, micro_batch: int, batch_dim: int | None = None,
                   source: str = "", known: MeasuredPlan | None = None, stop_above: int | None = None,
                   not_fitting: bool = False, eager: bool = False) -> dict[str, Any]:
        """A plan (action names per unit) or a peer measured at another micro-batch, a new measurement each call, or
        recorded as not fitting without a step (``not_fitting``), as ``search.records.meta.BatchRecord``: the run
        store keeps it as a row at that micro-batch. ``known`` (its record there, whose peak a CPU measurement
        reuses), ``stop_above`` (bytes: above them no step is timed) and ``eager`` (uncompiled whatever the run
        compiles) as ``search.engine.measurer.Measurer.measure_at`` asks."""

    @abstractmethod
    def _plan(self, actions: Sequence[str]) -> Plan:
        """The plan giving ``actions[i]`` (names) to ``units[i]`` of this actor's model."""

    @abstractmethod
    def _measure(self, plan: Plan, source: str, is_reference: bool, known: MeasuredPlan | None = None) -> MeasuredPlan:
        """One new measurement of ``plan``, numbered by ``_next_id`` and ``_labelled``; ``known``: the plan's record
        so far, where the kind lends it (a peak reused on CPU)."""

    @abstractmethod
    def _killed(self, digest: str, actions: Sequence[str], source: str) -> MeasuredPlan:
        """The record of a configuration that killed this actor's process twice: not fitting, made without a step."""

    # -- what every measuring actor answers alike -------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """Its units, label, device and process, for the pool and the run's report."""
        return {"units": self.units, "unit_choice": self.unit_choice.model_dump(mode="json"), "device": self.device,
                "pid": os.getpid(), "node": self.node, "evaluator": self.label, **self._described()}

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
        the plan as not fitting (it killed the actors that measured it, ``EvaluatorPool``).
        """
        plan = self._plan(actions)
        cached = self.cache.get(plan.digest)
        if cached is not None and not again and not not_fitting:
            return cached.proposed_by(source)
        is_reference = list(actions) == self._keep
        if not_fitting:
            m = self._labelled(self._killed(plan.digest, actions, source), is_reference)
        else:
            if not is_reference:
                self._refresh_reference()
            m = self._measure(plan, source, is_reference, known=cached)
        self.cache[plan.digest] = cached.merged(m) if cached is not None else m
        self.journal.append(m)
        return m

    def seconds(self) -> dict[str, float]:
        """Seconds spent measuring plans and references (the all-keep plan against drift), and how many."""
        return dict(self.busy)

    def drain(self) -> list[MeasuredPlan]:
        """Every measurement since the last drain, answers included (the store skips those it already has)."""
        out, self.journal = self.journal, []
        return out

    def _next_id(self) -> str:
        """The id of the measurement about to be taken (one more measured)."""
        self.n_measured += 1
        return f"{self._id_prefix}:{self.n_measured}"

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
        """The measurement with this actor's label and, when references are on, each sample's reference."""
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


def node_name() -> str:
    """The Ray node this process runs on (short id and IP), or the host name outside Ray."""
    import ray

    if ray.is_initialized():  # a Ray actor, or a process that joined Ray: its node has a runtime context
        return f"{ray.get_runtime_context().get_node_id()[:8]}/{ray.util.get_node_ip_address()}"
    return socket.gethostname()

"""FsdpRank: one rank of an FSDP group (``search.engine.fsdp.group``), a Ray actor.

It builds the workload from the spec, as every rank does under the same seed, takes the group's
decision units (rank 0 chooses them), joins the process group and shards the workload
(``env.measure.fsdp.shard_workload``). From then on the group calls every rank with the same request
at once, and each measures its part of the step with the same code as a single-device Evaluator
(``env.measure``): the ranks meet in the step's collectives, so a rank never runs ahead of the others.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile
from env.data.plan import Action, action_summary, fingerprint
from env.measure.fsdp import free_port, join_group, shard_workload, sharded_modules
from env.measure.gate import agreed_error, check_plans
from env.measure.measurement import measure, not_fitting, record_fields, warm_up
from env.measure.profiler import profile
from env.runtime.apply import plan_for
from env.units.choice import resolve_units
from env.workloads.workload import Workload, load_workload
from search.engine.evaluator import GATE_STAGE, device_model, model_errors, resolve_device, with_batch_size
from search.engine.measuring_actor import node_name


class FsdpRank:
    def __init__(self, workload_spec: str, seed: int, units: Sequence[str], max_units: int, device: str,
                 threads: int | None, rank: int, ranks: int) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.spec, self.seed, self.rank, self.ranks = workload_spec, seed, rank, ranks
        self.workload: Workload = load_workload(workload_spec, seed=seed, device=resolve_device(device))
        with model_errors("the choice of decision units (one instrumented training step)"):
            self.unit_choice = resolve_units(self.workload, list(units) or ["auto"], max_units)
        self.units = list(self.unit_choice.units)
        self.fingerprint = fingerprint(self.workload.model, self.units)  # the model's own, as a plan file has it
        self._other_batch: Workload | None = None

    def chosen_units(self) -> list[str]:
        return self.units

    def rendezvous(self) -> int:
        """The port the group meets at (rank 0's node; every rank of a group runs there)."""
        return free_port()

    def join(self, port: int) -> dict[str, Any]:
        """Join the group and shard the workload; what the group reports of this rank."""
        join_group(self.rank, self.ranks, port, str(self.workload.device))
        self.workload = shard_workload(self.workload, self.units)
        return {"rank": self.rank, "pid": os.getpid(), "node": node_name(), "units": self.units,
                "unit_choice": self.unit_choice.model_dump(mode="json"), "fingerprint": self.fingerprint,
                "batch_shape": self.workload.batch_shape, "device_model": device_model(self.workload.device),
                "backend": torch.distributed.get_backend(), "sharded": sharded_modules(self.workload.model)}

    def warm_up(self) -> int:
        with model_errors("the warm-up steps"):
            return len(warm_up(self.workload))

    def profile(self, actions: Sequence[str], repeats: int) -> ModelProfile:
        """This rank's profile, its predicted peaks checked against its own measured ones."""
        with model_errors("the profile of the decision units"):
            return profile(self.workload, self.units, [Action(a) for a in actions], repeats=repeats)

    def measure(self, actions: Sequence[str], source: str, measurement_id: str, repeats: int) -> MeasuredPlan:
        plan = plan_for(self.workload.model, self.units, [Action(a) for a in actions])
        with model_errors(f"the measurement of plan {plan.digest} ({action_summary(actions)})"):
            return measure(self.workload, plan, self.units, repeats=repeats, warmup=2, source=source,
                           measurement_id=measurement_id)

    def check(self, plans: Sequence[Sequence[str]], seed: int) -> list[dict[str, Any]]:
        """The correctness gate on this rank's part of the sharded step (``env.measure.gate.check_plans``): the
        gradients gathered whole, the error agreed across the group, so every rank answers the same verdicts."""
        with model_errors(GATE_STAGE):
            checks = check_plans(self.workload, [plan_for(self.workload.model, self.units, [Action(a) for a in p])
                                                 for p in plans], self.units, seed=seed, error_of=agreed_error)
        return [c.model_dump(mode="json") for c in checks]

    def not_fitting(self, actions: Sequence[str], source: str, measurement_id: str) -> MeasuredPlan:
        """This rank's record of a plan that killed the group twice, made without a step
        (``env.measure.measurement.not_fitting``)."""
        plan = plan_for(self.workload.model, self.units, [Action(a) for a in actions])
        return not_fitting(self.workload, record_fields(self.workload, plan.digest, actions, source, measurement_id))

    def measure_at_batch(self, actions: Sequence[str], batch_size: int, repeats: int, source: str = "",
                         measurement_id: str = "") -> MeasuredPlan:
        """A plan at another batch size, on a second sharded copy of the workload built at that size."""
        other = with_batch_size(self.spec, batch_size)
        if self._other_batch is None or self._other_batch.spec != str(other):
            built = load_workload(other, seed=self.seed, device=self.workload.device)
            self._other_batch = shard_workload(built, self.units)
        w = self._other_batch
        with model_errors(f"the measurement at batch size {batch_size}"):
            return measure(w, plan_for(w.model, self.units, [Action(a) for a in actions]), self.units, repeats=repeats,
                           source=source, measurement_id=measurement_id)

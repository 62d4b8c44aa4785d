"""Evaluator: owns one device, its workload and the measurement cache.

One Evaluator per device (each GPU; one on a CPU-only machine), so two measurements never
share a device. Everything measured is kept in ``journal`` until the driver drains it into the
run store; a resumed run preloads the store's measurements so nothing is measured again.
``RayEvaluator`` is the same class as a Ray actor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from env.apply import plan_for
from env.measure import Measurement, measure
from env.plan import Action, parse_action
from env.profile import ModelProfile, profile
from env.units import find_units
from env.workloads import Workload, WorkloadSpec, load_workload


@dataclass(frozen=True)
class Result:
    """A plan's measurement as the driver records it."""

    actions: tuple[str, ...]
    digest: str
    source: str
    peak_bytes: int
    live_before_bytes: int
    step_samples: list[float]
    oom: bool
    device: str
    torch_version: str
    batch_shape: str
    new: bool  # measured now (False: answered from the cache)
    seq: int = 0  # the Evaluator's count of measurements: a measurement's id, so none is recorded twice


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class Evaluator:
    def __init__(self, workload_spec: str, seed: int, units: Sequence[str], granularity: str, actions: Sequence[str],
                 repeats: int, device: str = "auto", threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.device = resolve_device(device)
        self.spec, self.seed, self.repeats = workload_spec, seed, repeats
        self.workload: Workload = load_workload(workload_spec, seed=seed, device=self.device)
        self.units = find_units(self.workload.model, granularity, list(units) or None)
        self.actions = [parse_action(a) for a in actions]
        self.cache: dict[str, Measurement] = {}
        self.journal: list[Result] = []  # every new measurement, until the driver drains it
        self.n_measured = 0
        self._other_batch: Workload | None = None

    def info(self) -> dict[str, Any]:
        return {"units": self.units, "device": self.device, "pid": os.getpid(), "batch_shape": self.workload.batch_shape}

    def profile(self) -> dict[str, Any]:
        prof: ModelProfile = profile(self.workload, self.units, self.actions, repeats=self.repeats)
        return prof.model_dump(mode="json")

    def preload(self, rows: Sequence[dict[str, Any]]) -> int:
        """Known measurements (from a resumed store): answered from the cache from now on."""
        for r in rows:
            self.cache[r["plan_digest"]] = Measurement(
                workload=self.workload.spec, batch_shape=r["batch_shape"] or self.workload.batch_shape,
                plan_digest=r["plan_digest"], peak_bytes=r["peak_bytes"], live_before_bytes=r["live_before_bytes"] or 0,
                step_seconds_samples=r["step_samples"], device=r["device"] or "", torch_version=r["torch_version"] or "",
                oom=bool(r["oom"]))
        return len(self.cache)

    def evaluate(self, actions: Sequence[str], source: str, again: bool = False) -> Result:
        """Measure a plan (action names per unit, in ``units`` order) unless it is cached.

        ``again`` measures a cached plan once more and adds its step times to the record.
        """
        plan = plan_for(self.workload.model, self.units, [Action(a) for a in actions])
        cached = self.cache.get(plan.digest)
        if cached is not None and not again:
            return self._result(actions, plan.digest, source, cached, new=False)
        m = measure(self.workload, plan, self.units, repeats=self.repeats, warmup=2)
        self.cache[plan.digest] = cached.merged(m) if cached is not None else m
        self.n_measured += 1
        result = self._result(actions, plan.digest, source, m, new=True)
        self.journal.append(result)
        return result

    def evaluate_at_batch(self, actions: Sequence[str], batch_size: int) -> dict[str, Any]:
        """Peak and time of a plan at another batch size (built-in workloads)."""
        spec = WorkloadSpec.parse(self.spec)
        opts = dict(spec.options)
        opts["batch_size"] = str(batch_size)
        other = WorkloadSpec(spec.target, spec.preset, tuple(sorted(opts.items())))
        if self._other_batch is None or self._other_batch.spec != str(other):
            self._other_batch = load_workload(other, seed=self.seed, device=self.device)
        w = self._other_batch
        plan = plan_for(w.model, self.units, [Action(a) for a in actions])
        m = measure(w, plan, self.units, repeats=self.repeats)
        return {"batch_size": batch_size, "peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds, "oom": m.oom}

    def drain(self) -> list[Result]:
        """Every measurement since the last drain (the driver skips those it already recorded)."""
        out, self.journal = self.journal, []
        return out

    def _result(self, actions: Sequence[str], digest: str, source: str, m: Measurement, new: bool) -> Result:
        return Result(tuple(actions), digest, source, m.peak_bytes, m.live_before_bytes, list(m.step_seconds_samples),
                      m.oom, m.device, m.torch_version, m.batch_shape, new, self.n_measured if new else 0)


def ray_evaluator(num_gpus: int = 0):  # type: ignore[no-untyped-def]
    """The Evaluator as a Ray actor class pinned to one device (a GPU when ``num_gpus``)."""
    import ray

    return ray.remote(num_cpus=0, num_gpus=num_gpus, max_concurrency=1)(Evaluator)

"""The run folder's ``frontier.json``: the measured memory/time frontier a search found.

The search service writes it (``write_frontier``) and everything downstream reads it
(``load_frontier``): the export CLI, ``DynamicPlan`` and the dashboard. Its versioned form::

    {"schema_version": 2, "workload": "gpt/tiny", "batch_shape": "idx:2x16,targets:2x16",
     "device": "cpu (1 threads)", "clock": "thread-cpu", "fingerprint": "3f2a...", "units": ["blocks.0", ...],
     "fsdp_ranks": 0,
     "baseline": {"peak_bytes": 123, "step_seconds": 0.01},
     "points": [{"plan": {"blocks.0": "recompute", ...}, "peak_bytes": 100, "step_seconds": 0.012,
                 "spread_seconds": 0.001, "activation_bytes": 40, "measured": true, "source": "agent_0",
                 "n_measurements": 2, "compile_scope": null}]}

``"peers"`` holds each peer measured beside the search against our fastest measured plan at no more
memory, with its verdict (``search.records.peer_verdicts.PeerVerdict``). A throughput search
(``--memory-cap``) adds ``"throughput"``: per memory cap the fastest (plan,
micro-batch) measured and the peers beside it (``search.records.throughput.ThroughputCurve``).
Points are kept sorted by ``peak_bytes``. A compiled search's points say how they were compiled
(``compile_scope``: ``units`` or ``model``; ``--compile-scope both`` shows plans of either, and a plan
can appear once each way). A point's plan may omit units; they are ``keep``.
``clock`` names what every step time in the file was read from (``env.measure.timeline.step_clock``).
``fsdp_ranks`` is 0 for a search on one device; N when it measured under FSDP2 with N ranks (``--fsdp N``),
where every peak is the largest rank's and every step time the slowest rank's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ValidationError, field_validator

from env.data.errors import CkptSearchError
from env.data.measured import MeasuredPlan
from env.data.plan import Action, Plan
from env.data.plan_check import PlanCheck
from env.data.types import MIB
from env.workloads.spec import WorkloadSpec, split_precision
from search.records.pareto import fastest_within
from search.records.peer_verdicts import PeerVerdict
from search.records.throughput import ThroughputCurve

FRONTIER_NAME = "frontier.json"
SCHEMA_VERSION = 2


class FrontierError(CkptSearchError):
    """A frontier file that is missing or unreadable, or a budget no frontier plan fits."""


class Baseline(BaseModel):
    """The all-``keep`` plan, which every saving is relative to."""

    peak_bytes: int
    step_seconds: float


class FrontierPoint(BaseModel):
    """One measured plan on the frontier."""

    plan: dict[str, Action]  # unit FQN -> action; units not named are 'keep'
    peak_bytes: int  # everything live at the step's peak
    step_seconds: float  # median over the timed steps
    spread_seconds: float = 0.0  # interquartile range of the step times
    activation_bytes: int  # peak minus what was live before the step
    measured: bool = True
    source: str = ""  # who proposed it first: an agent name, rule:<name>, exact
    n_measurements: int = 1  # measurements its step times come from
    # how its steps were compiled: None eager; "units" each unit compiled on its own (apply_plan(...,
    # compile_units=True)); "model" the plan applied, then the whole model compiled (torch.compile(model))
    compile_scope: Literal["units", "model"] | None = None
    checked: bool = False  # the correctness gate compared its loss and gradients with the unplanned step's: same
    gradient_error: float | None = None  # that check's largest error (env.data.plan_check); None: not checked


def point_from(m: MeasuredPlan, units: Sequence[str], compile_scope: str | None = None,
               check: PlanCheck | None = None) -> FrontierPoint:
    """A frontier point from a measured plan (actions in ``units`` order), compiled in ``compile_scope``, with
    the correctness gate's ``check`` of it where it has one."""
    return FrontierPoint(plan={u: Action(a) for u, a in zip(units, m.actions)}, peak_bytes=m.peak_bytes,
                         step_seconds=m.step_seconds, spread_seconds=m.spread_seconds,
                         activation_bytes=m.activation_bytes, source=m.source, n_measurements=m.n_measurements,
                         compile_scope=compile_scope, checked=check is not None and check.passed,
                         gradient_error=check.error if check is not None else None)


COMPILE_HOW = {"units": "apply_plan(model, plan, compile_units=True): each unit compiled on its own",
               "model": "apply_plan(model, plan), then model = torch.compile(model): the whole model compiled"}


class FrontierFile(BaseModel):
    """The whole ``frontier.json``: where it was measured, the baseline and the points."""

    schema_version: int = SCHEMA_VERSION
    workload: str
    batch_shape: str
    device: str
    clock: str  # what every step time here was read from (env.measure.timeline.step_clock)
    fingerprint: str
    units: list[str]
    fsdp_ranks: int = 0  # 0: one device; N: measured under FSDP2 with N ranks, every peak and time per rank
    baseline: Baseline
    points: list[FrontierPoint]
    # the rule that left points of the measured frontier out of ``points`` (search.records.pareto.readable):
    # {"memory_tolerance_bytes": ..., "timing_noise": ..., "left_out": [digests]}; None: nothing applied
    readable: dict[str, Any] | None = None
    throughput: ThroughputCurve | None = None  # a throughput search's answer per memory cap (--memory-cap)
    refused: list[PlanCheck] = []  # plans the correctness gate failed: never in ``points``, never exported
    # each peer beside our fastest measured plan at no more memory, with the verdict (search.records.peer_verdicts)
    peers: list[PeerVerdict] = []

    @field_validator("points")
    @classmethod
    def _sorted_by_peak(cls, v: list[FrontierPoint]) -> list[FrontierPoint]:
        return sorted(v, key=lambda p: (p.peak_bytes, p.step_seconds))

    def plan(self, point: FrontierPoint) -> Plan:
        """The point's decisions as a full :class:`Plan` (every unit named) for this model."""
        return Plan(fingerprint=self.fingerprint, actions={u: point.plan.get(u, Action.KEEP) for u in self.units},
                    precision=split_precision(dict(WorkloadSpec.parse(self.workload).options))[1]["precision"])

    def plan_json(self, point: FrontierPoint) -> str:
        """The point's plan as ``search.export`` writes it (and a run's ``plans/``): the plan's JSON, and for a
        plan measured compiled how it was compiled (``compile_scope``, ``apply``), which ``apply_plan`` ignores."""
        plan = self.plan(point)
        if point.compile_scope is None:
            return plan.to_json() + "\n"
        return json.dumps({**json.loads(plan.to_json()), "compile_scope": point.compile_scope,
                           "apply": COMPILE_HOW[point.compile_scope]}, indent=2) + "\n"

    def smallest(self) -> FrontierPoint:
        if not self.points:
            raise FrontierError(f"frontier of '{self.workload}' has no points; let the search measure some plans first")
        return self.points[0]

    def fastest_within(self, budget_bytes: int, activation_only: bool = False) -> FrontierPoint:
        """The fastest point whose peak (or activation part) fits ``budget_bytes``.

        Raises a one-line :class:`FrontierError` naming the smallest possible when none fits.
        """
        def need(p: FrontierPoint) -> int:
            return p.activation_bytes if activation_only else p.peak_bytes

        best = fastest_within([need(p) for p in self.points], [p.step_seconds for p in self.points], budget_bytes)
        if best is None:
            low = min(self.points, key=need) if self.points else self.smallest()
            what = "activation memory" if activation_only else "peak"
            decisions = self.plan(low).summary()
            raise FrontierError(
                f"no frontier plan of '{self.workload}' ({self.batch_shape}) fits {budget_bytes / MIB:.2f} MB: "
                f"the smallest {what} is {need(low) / MIB:.2f} MB ({decisions}); "
                f"give a budget of at least {need(low) / MIB:.2f} MB"
            )
        return self.points[best]


def frontier_path(run_dir: str | Path) -> Path:
    """``run_dir/frontier.json``; a path to the file itself is accepted too."""
    p = Path(run_dir)
    return p if p.suffix == ".json" else p / FRONTIER_NAME


def write_frontier(run_dir: Path, frontier: FrontierFile) -> Path:
    """Write ``frontier.json`` atomically (readers never see half a file); returns its path."""
    path = frontier_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(frontier.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)
    return path


def load_frontier(run_dir: str | Path) -> FrontierFile:
    """Read and check a run folder's ``frontier.json``; every failure is one line with the fix."""
    path = frontier_path(run_dir)
    if not path.is_file():
        where = "run folder" if Path(run_dir).is_dir() else "path"
        raise FrontierError(f"no {FRONTIER_NAME} at '{path}' ({where} '{run_dir}'); "
                            "pick a run folder of python -m search.run, or wait until its search writes a frontier")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise FrontierError(f"'{path}' is not JSON ({e.msg} at line {e.lineno}); "
                            "it is written by python -m search.run: run the search again") from None
    if not isinstance(data, dict):
        raise FrontierError(f"'{path}' is not a frontier file (a JSON {type(data).__name__}); run the search again")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        hint = "upgrade ckpt-search" if newer else "run the search again with this version"
        raise FrontierError(f"'{path}' has frontier schema version {version!r}, this ckpt-search reads "
                            f"version {SCHEMA_VERSION}; {hint}")
    try:
        return FrontierFile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise FrontierError(f"'{path}' is not a valid frontier file: {where}: {first['msg']}; "
                            "run the search again") from None

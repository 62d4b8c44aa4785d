"""The price of memory: what each frontier plan costs to train with, on rented GPUs.

A plan that needs fewer bytes per sample fits a larger micro-batch on one GPU, so the global
batch needs fewer GPUs or fewer gradient-accumulation steps; but each step is slower. For
each frontier plan (measured at 2+ batch sizes, ``batch_scaling`` in the run store):

1. fit ``peak_bytes = a + b * batch`` and ``step_seconds = c + d * batch`` (least squares;
   a negative ``d`` from timing noise is clamped to 0: a step never gets faster with more data);
2. the largest micro-batch that fits: ``floor((gpu_bytes - a) / b)``, at most the global batch,
   unless measurements say otherwise: a measured micro-batch beyond it that fits raises it, a
   measured one within it that does not fit lowers it (``measured_largest``); and at most
   ``MAX_EXTRAPOLATION`` times the largest measured micro-batch: no price is read further out
   than that (``PlanPrice.fit_largest`` keeps what the fit alone would allow);
3. ``chunks = ceil(global / micro)`` micro-batches per optimizer step, spread over
   ``gpus = min(chunks, max_gpus)`` data-parallel GPUs, ``accumulation = ceil(chunks / gpus)``
   micro-batches each; the micro-batch is then evened out to ``ceil(global / (gpus * accumulation))``;
4. ``step = accumulation * t(micro)``, with ``t`` the measured step time where the plan was measured at
   that micro-batch (``measured`` in the row) and the fit elsewhere (communication not counted),
   ``wall = steps * step``, ``cost = gpus * wall_hours * price_per_gpu_hour``.

A throughput search (``--memory-cap``) measures plans at many micro-batches; ``with_measured`` adds
those points to each plan's, so the page reads them where they exist.

Only the plans' peaks and times at the measured batch sizes are measurements; a micro-batch
outside them is read off the fitted lines (``PlanPrice.extrapolated``), and the page says so.
A fit that breaks physics is refused, not drawn: a time fit from fewer than two finite step
times (a throughput search measures some micro-batches for their peak only: their step time is
infinite and enters no time fit), or one that costs less per sample than keeping everything
(``keep_slope``): recomputing adds work, so that is timing noise.

Pure functions over numbers: the dashboard's page only lays them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from env.cost.line_fit import fit_line as _fit_line
from env.data.errors import CkptSearchError

GB = 10**9  # GPU memory as vendors state it (80 GB = 80e9 bytes)
MAX_EXTRAPOLATION = 2.0  # no micro-batch priced beyond this many times the largest one measured


class PricingError(CkptSearchError):
    """Inputs the price of memory cannot be computed from."""


@dataclass(frozen=True)
class LinearFit:
    """``intercept + slope * batch`` (bytes or seconds)."""

    intercept: float
    slope: float

    def __call__(self, batch: float) -> float:
        return self.intercept + self.slope * batch


@dataclass(frozen=True)
class Cluster:
    """What the user rents and trains."""

    gpu_memory_gb: float  # per GPU
    price_per_gpu_hour: float  # currency units per GPU-hour
    global_batch: int  # samples per optimizer step
    steps: int  # optimizer steps of the training run
    max_gpus: int = 1024  # data-parallel GPUs available

    def check(self) -> "Cluster":
        for name in ("gpu_memory_gb", "price_per_gpu_hour", "global_batch", "steps", "max_gpus"):
            if not getattr(self, name) > 0:
                raise PricingError(f"{name}={getattr(self, name)} must be positive; enter a value above 0")
        return self


@dataclass(frozen=True)
class PlanPrice:
    """One plan on one cluster; ``fits`` is False when not even a micro-batch of 1 fits a GPU."""

    digest: str
    summary: str
    bytes_per_sample: float
    fixed_bytes: float
    fits: bool
    measured_batches: tuple[int, ...] = ()  # batch sizes the plan was measured at
    extrapolated: bool = False  # the micro-batch lies outside them: its peak and time come from the fits
    micro_batch: int = 0
    accumulation: int = 0
    gpus: int = 0
    measured: bool = False  # the micro-batch's step time was measured, not read off the fit
    step_seconds: float = math.nan  # one optimizer step (all accumulation micro-steps)
    wall_hours: float = math.nan
    cost: float = math.nan
    fit_largest: int = 0  # the largest micro-batch the fit (and the measurements) say fits a GPU
    capped: bool = False  # MAX_EXTRAPOLATION held the micro-batch below ``fit_largest``


def fit_line(batches: Sequence[float], values: Sequence[float], what: str = "peak_bytes") -> LinearFit:
    """Least-squares line through (batch, value); needs 2+ distinct batch sizes."""
    x, y = np.asarray(batches, dtype=float), np.asarray(values, dtype=float)
    if len(np.unique(x)) < 2:
        raise PricingError(f"{what} is measured at batch sizes {sorted(set(x.tolist()))}; a linear fit needs 2 or more "
                           "distinct sizes: run the search with --batch-scaling")
    return LinearFit(*_fit_line(x, y))


def timed(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points that ran and have a finite step time (a peak-only measurement's is infinite or missing)."""
    return [p for p in points if not p.get("oom") and math.isfinite(float(p.get("step_seconds") or math.inf))]


def fit_scaling(points: Sequence[dict[str, Any]]) -> tuple[LinearFit, LinearFit]:
    """(peak fit, time fit) from one plan's batch_scaling records: OOM records are skipped, and the time fit
    reads only the points with a finite step time."""
    pts = [p for p in points if not p.get("oom")]
    peak = fit_line([p["batch_size"] for p in pts], [p["peak_bytes"] for p in pts], "peak_bytes")
    if peak.slope <= 0:
        raise PricingError(f"peak memory does not grow with the batch (slope {peak.slope:.0f} bytes/sample); "
                           "measure the plan at batch sizes further apart")
    with_time = timed(pts)
    time = fit_line([p["batch_size"] for p in with_time], [p["step_seconds"] for p in with_time], "step_seconds")
    if time.slope < 0:  # timing noise: a step is not faster on more data
        time = LinearFit(float(np.mean([p["step_seconds"] for p in with_time])), 0.0)
    return peak, time


def check_physics(time: LinearFit, keep_slope: float | None, noise: float) -> None:
    """Refuse a time fit that costs less per sample than keeping everything by more than ``noise`` (a share):
    every action but keep adds work to the step, so such a fit is timing noise, not a price."""
    if keep_slope is not None and keep_slope > 0 and time.slope < keep_slope * (1 - noise):
        raise PricingError(f"its time fit costs {time.slope * 1e3:.3g} ms per sample, less than keeping everything "
                           f"({keep_slope * 1e3:.3g} ms), which recomputing cannot do (timing noise); not priced: "
                           "measure it again at batch sizes further apart")


def max_micro_batch(peak: LinearFit, gpu_bytes: float) -> int:
    """The largest batch whose fitted peak fits ``gpu_bytes`` (0: not even one sample)."""
    return max(0, math.floor((gpu_bytes - peak.intercept) / peak.slope))


def measured_largest(fitted: int, points: Sequence[dict[str, Any]], gpu_bytes: float) -> int:
    """The fit's largest micro-batch corrected by what was measured: the largest measured one that fits when
    that is larger, and below the smallest measured one that does not fit when that is within it."""
    ran = [p for p in points if not p.get("oom")]
    fits = [int(p["batch_size"]) for p in ran if p["peak_bytes"] <= gpu_bytes]
    over = [int(p["batch_size"]) for p in points if p.get("oom") or p["peak_bytes"] > gpu_bytes]
    largest = max([fitted, *fits])
    return min([largest, *[b - 1 for b in over if b <= largest]])


def with_measured(batch_scaling: dict[str, list[dict[str, Any]]], measured: Sequence[tuple[int, Any]],
                  own: dict[str, dict[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Each plan's points: those of an older store's ``batch_scaling``, its measurements at other micro-batches
    (``(micro_batch, MeasuredPlan)`` rows of the run store: the batch scaling's and a throughput search's), and
    where it has such rows, its point at the workload's own batch from ``own`` (digest -> point: the frontier as
    shown) unless it has one there."""
    out = {d: [dict(p) for p in points] for d, points in batch_scaling.items()}
    for b, m in measured:  # a peak-only measurement's step time is infinite: fit_scaling leaves it out of time fits
        out.setdefault(m.digest, []).append({"batch_size": b, "peak_bytes": m.peak_bytes, "oom": m.oom,
                                             "step_seconds": m.step_seconds, "clock": m.clock})
    for digest, point in (own or {}).items():
        if digest in out and all(int(p["batch_size"]) != int(point["batch_size"]) for p in out[digest]):
            out[digest].append(dict(point))
    for points in out.values():
        points.sort(key=lambda p: int(p["batch_size"]))
    return out


def price_plan(digest: str, summary: str, points: Sequence[dict[str, Any]], cluster: Cluster,
               keep_slope: float | None = None, noise: float = 0.0) -> PlanPrice:
    """Micro-batch, GPUs, accumulation, wall time and cost of training with one plan (``check_physics`` with
    the all-keep plan's seconds per sample, ``keep_slope``, where known)."""
    peak, time = fit_scaling(points)
    check_physics(time, keep_slope, noise)
    measured = tuple(sorted({int(p["batch_size"]) for p in timed(points)}))
    base = dict(digest=digest, summary=summary, bytes_per_sample=peak.slope, fixed_bytes=peak.intercept,
                measured_batches=measured)
    gpu_bytes = cluster.gpu_memory_gb * GB
    fit_largest = min(measured_largest(max_micro_batch(peak, gpu_bytes), points, gpu_bytes), cluster.global_batch)
    largest = min(fit_largest, math.floor(MAX_EXTRAPOLATION * measured[-1]))
    base.update(fit_largest=fit_largest, capped=fit_largest > largest)
    if largest < 1:
        return PlanPrice(**base, fits=False, extrapolated=measured[0] > 1)
    chunks = math.ceil(cluster.global_batch / largest)
    gpus = min(chunks, cluster.max_gpus)
    accumulation = math.ceil(chunks / gpus)
    micro = math.ceil(cluster.global_batch / (gpus * accumulation))
    at_micro = [p["step_seconds"] for p in timed(points) if int(p["batch_size"]) == micro]
    base["measured"] = bool(at_micro)
    step = accumulation * (float(np.median(at_micro)) if at_micro else time(micro))
    wall_hours = cluster.steps * step / 3600
    return PlanPrice(**base, fits=True, micro_batch=micro, accumulation=accumulation, gpus=gpus, step_seconds=step,
                     wall_hours=wall_hours, cost=gpus * wall_hours * cluster.price_per_gpu_hour,
                     extrapolated=not measured[0] <= micro <= measured[-1])


def price_table(frontier: pd.DataFrame, batch_scaling: dict[str, list[dict[str, Any]]], cluster: Cluster) -> pd.DataFrame:
    """One row per frontier plan measured at 2+ batch sizes, cheapest first (plans that do not fit last)."""
    return priced_and_left_out(frontier, batch_scaling, cluster)[0]


def keep_seconds_per_sample(batch_scaling: dict[str, list[dict[str, Any]]], keep_digest: str | None) -> float | None:
    """The all-keep plan's time fit slope (seconds per sample), None where it is not measured at 2+ batch sizes."""
    try:
        return fit_scaling(batch_scaling.get(keep_digest or "", []))[1].slope
    except PricingError:
        return None


def priced_and_left_out(frontier: pd.DataFrame, batch_scaling: dict[str, list[dict[str, Any]]],
                        cluster: Cluster, keep_digest: str | None = None,
                        noise: float = 0.0) -> tuple[pd.DataFrame, list[str]]:
    """``price_table``, and one line per frontier plan left out saying why (a plan whose memory does
    not scale cleanly, or whose time fit breaks physics against the all-keep plan ``keep_digest``
    beyond the run's timing ``noise``, is left out, not mispriced)."""
    cluster.check()
    rows, left_out = [], []
    keep_slope = keep_seconds_per_sample(batch_scaling, keep_digest)
    for _, r in frontier.iterrows():
        points = batch_scaling.get(r.digest, [])
        name = f"{r.summary} ({r.digest[:6]})"
        if len({p["batch_size"] for p in timed(points)}) < 2:
            left_out.append(f"{name}: its step time is not measured at two batch sizes (the search measures a few "
                            "frontier plans there; a throughput search times only the micro-batches it compares)")
            continue
        try:
            rows.append(price_plan(r.digest, r.summary, points, cluster,
                                   None if r.digest == keep_digest else keep_slope, noise).__dict__)
        except PricingError as e:
            left_out.append(f"{name}: {e}")
    cols = list(PlanPrice.__dataclass_fields__)
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values(["fits", "cost"], ascending=[False, True], na_position="last").reset_index(drop=True), left_out

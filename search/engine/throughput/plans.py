"""The throughput search's cost-model side: the fit in the micro-batch, its checks, and the plans to measure.

``ThroughputModel`` is made once the profiles are in (the workload's own one and one a few times its
batch: ``search.engine.phases.throughput.fit_batch``, ``env.cost.batch_fit.BatchFit``). It prices any
plan at any micro-batch the search considers (``batches``: every size up to the ladder's top, or up to where the fit puts the lowest peak
over the largest cap when that is further (``extend``); a geometric grid of ``GRID_POINTS`` beyond
``ALL_SIZES_UP_TO``; only the ladder when ``--micro-batches`` gave it), its peaks and step times each
scaled by what the plans measured at the nearest micro-batch showed (``MeasuredScale``: measured over
predicted, for peaks wherever a peak was measured, for times wherever steps were timed), and proposes:

- the exact solver's frontier at every ladder micro-batch and the largest priced (``solved``), and at every
  micro-batch priced where a cap's model-optimal (plan, micro-batch) may lie (``model_optimal``): the
  yardstick (the solver compares states in steps of ``relative``: ``THROUGHPUT_EXACT_UNITS``);
- the plans of the agent (``agents.batch_conditioned``; the phase trains it);
- all of them at every micro-batch priced, ranked by predicted samples per second (``candidates``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Sequence

import numpy as np

from agents.exact import FrontierPoint, exact_frontier
from agents.throughput import BatchChoice, model_optimal, ranked
from env.cost.batch_fit import BatchFit, FitCheck
from env.cost.cost_model import CostModel
from env.cost.headroom import lowest_and_keep_peak
from env.data.codec import PlanCodec
from env.data.measured import MeasuredPlan
from env.data.plan import Action
from env.data.types import Indices
from search.engine.throughput.caps import ThroughputSetup
from search.engine.throughput.peers import largest_under

ALL_SIZES_UP_TO = 64  # every micro-batch up to here is priced; beyond, a geometric grid
THROUGHPUT_EXACT_UNITS = 24  # more units: the ladder's solves merge labels in 0.5% steps, as the agents' teacher does
GRID_POINTS = 48


def solver_relative(n_units: int) -> float:
    """The exact solver's step for the ladder's solves: exact up to ``THROUGHPUT_EXACT_UNITS`` units; beyond, one
    solve per ladder size at 48 layered units took a minute on 2 loaded cores, and the 0.5% step keeps
    nearly all of the frontier (``agents.imitation``)."""
    return 0.0 if n_units <= THROUGHPUT_EXACT_UNITS else 0.005


def search_batches(ladder: Sequence[int], fixed: bool = False) -> list[int]:
    """The micro-batches the model prices: every size up to the ladder's top, or a grid with the ladder; the
    ladder alone when it is ``fixed`` (``--micro-batches``)."""
    top = max(ladder)
    if fixed:
        return sorted(ladder)
    if top <= ALL_SIZES_UP_TO:
        return list(range(1, top + 1))
    grid = np.unique(np.geomspace(1, top, GRID_POINTS).round().astype(int)).tolist()
    return sorted(set(grid) | set(ladder))


def ladder_plans(codec: PlanCodec, lowest: Indices) -> dict[str, Indices]:
    """The plans measured along the ladder and checked against the fit, by the label their checks carry."""
    return {"all keep": codec.uniform(Action.KEEP), "lowest-memory plan": lowest}


class MeasuredScale:
    """Measured over predicted, averaged per micro-batch and read at the nearest micro-batch measured (1 before
    any). The fit is a line per unit through two profiles taken minutes apart; the plans measured at a
    micro-batch show how far off it is there, and the same factor for every plan keeps the fit's order of the
    plans at one micro-batch while it corrects the comparison across micro-batches."""

    def __init__(self) -> None:
        self.ratios: dict[int, list[float]] = {}

    def add(self, micro_batch: int, measured: float, predicted: float) -> None:
        if predicted > 0:
            self.ratios.setdefault(micro_batch, []).append(measured / predicted)

    def at(self, micro_batch: int) -> float:
        """The mean ratio at the measured micro-batch nearest ``micro_batch`` in ratio (the smaller of two as near)."""
        if not self.ratios:
            return 1.0
        nearest = min(self.ratios, key=lambda b: (abs(math.log(b / micro_batch)), b))
        return float(np.mean(self.ratios[nearest]))


class ThroughputModel:
    """Predicted (plan, micro-batch) throughput under caps, from a fit and what was measured per micro-batch."""

    def __init__(self, fit: BatchFit, setup: ThroughputSetup, relative: float = 0.0) -> None:
        self.fit, self.setup, self.relative = fit, setup, relative
        self.batches = search_batches(setup.ladder, setup.fixed)
        self.checks: list[FitCheck] = []
        self.peaks, self.times = MeasuredScale(), MeasuredScale()  # the times: where steps were timed
        self.cost_model = lru_cache(maxsize=None)(self._cost_model)
        self.lowest_peak = lru_cache(maxsize=None)(self._lowest_peak)
        self._fronts: dict[int, list[FrontierPoint]] = {}  # the exact frontier per micro-batch solved
        profile = fit.template
        self.codec = PlanCodec(profile.units, profile.actions, profile.fingerprint)  # the fit's action indices

    def extend(self, cap: int, limit: int) -> list[int]:
        """Price micro-batches beyond the ladder up to the largest at which the fit puts some plan's peak under
        ``cap`` (at most ``limit``): the ladder follows one plan, and another may grow less per sample."""
        top = max(self.batches)
        if self.setup.fixed:
            return self.batches
        high = min(limit, 2 * top)
        while high < limit and self.lowest_peak(high) <= cap:
            top, high = high, min(limit, 2 * high)
        last = largest_under(self.lowest_peak, cap, range(top, high + 1))
        if last is not None and last > max(self.batches):
            self.batches = search_batches([*self.setup.ladder, last])
        return self.batches

    def _cost_model(self, micro_batch: int) -> CostModel:
        return self.fit.cost_model(micro_batch)

    def _lowest_peak(self, micro_batch: int) -> int:
        """The lowest peak any plan reaches at ``micro_batch`` on the fit, as a cap counts it."""
        return self.counted(lowest_and_keep_peak(self.fit.profile_at(micro_batch))[0], micro_batch)

    def check(self, micro_batch: int, plan: Indices, label: str, m: MeasuredPlan) -> FitCheck:
        """A plan measured at ``micro_batch`` against the fit: recorded, and it scales the predicted peaks there,
        and the predicted step times where its steps were timed."""
        check = self.fit.check_at(micro_batch, plan, label, m.peak_bytes, m.step_seconds)
        self.checks.append(check)
        self.peaks.add(micro_batch, check.measured_peak_bytes, check.predicted_peak_bytes)
        if check.measured_seconds is not None:
            self.times.add(micro_batch, check.measured_seconds, check.predicted_seconds)
        self.lowest_peak.cache_clear()
        return check

    @property
    def timed_checks(self) -> set[tuple[int, str]]:
        """(micro-batch, label) of every check whose steps were timed."""
        return {(c.micro_batch, c.plan) for c in self.checks if c.measured_seconds is not None}

    def fit_checks(self) -> list[FitCheck]:
        """The checks of all keep and the lowest-memory plan (not the candidates'), by micro-batch, a peak alone
        left out where the same plan was timed at the same micro-batch too."""
        timed = self.timed_checks
        return sorted((c for c in self.checks if c.plan != "candidate"
                       and (c.measured_seconds is not None or (c.micro_batch, c.plan) not in timed)),
                      key=lambda c: (c.micro_batch, c.plan))

    def counted(self, predicted_peak: int, micro_batch: int) -> int:
        """A predicted peak as a cap counts it: scaled by the measurements, the gradients added when accumulating."""
        return self.setup.counted(int(predicted_peak * self.peaks.at(micro_batch)), micro_batch)

    def predicted_peak(self, plan: Indices, micro_batch: int) -> int:
        return self.counted(self.cost_model(micro_batch).peak_bytes(list(plan)), micro_batch)

    def fit_seconds(self, plan: Indices, micro_batch: int) -> float:
        """The step time the fit alone predicts, before any measurement scales it."""
        return self.cost_model(micro_batch).predict(list(plan)).step_seconds

    def predicted_seconds(self, plan: Indices, micro_batch: int) -> float:
        """The fit's step time scaled by the steps timed at the nearest micro-batch (``MeasuredScale``)."""
        return self.fit_seconds(plan, micro_batch) * self.times.at(micro_batch)

    def predicted_rate(self, answer: tuple[int, MeasuredPlan]) -> float:
        """Samples per second the model prices a measured (micro-batch, plan) at."""
        b, m = answer
        return b / self.predicted_seconds(self.codec.indices(m.actions), b)

    def priced(self, micro_batch: int) -> CostModel:
        """The fit's cost model at ``micro_batch`` with its step times scaled as ``predicted_seconds`` scales them."""
        cm, scale = self.cost_model(micro_batch), self.times.at(micro_batch)
        return cm if scale == 1.0 else cm.with_step_seconds(cm.seconds * scale, cm.fixed_seconds * scale)

    @property
    def solved(self) -> list[int]:
        """Where the exact solver runs for the plans it proposes: the ladder and the largest micro-batch priced;
        ``model_optimal`` solves wherever else a cap's answer may lie."""
        return sorted({*self.setup.ladder, max(self.batches)})

    def frontier_at(self, micro_batch: int) -> list[FrontierPoint]:
        """The exact frontier at ``micro_batch`` on the fit alone (solved once): scaling every plan's peak or time
        by one factor there keeps the same plans on it."""
        if micro_batch not in self._fronts:
            self._fronts[micro_batch] = exact_frontier(self.cost_model(micro_batch), relative=self.relative)
        return self._fronts[micro_batch]

    def model_optimal(self, cap: int) -> BatchChoice | None:
        """The (plan, micro-batch) of the most samples per second predicted under ``cap`` over every micro-batch
        priced. The solver runs at each, most promising first (``rate_bound``), until none left could beat the
        best found: a solve per size would cost as many solves as sizes (up to ``GRID_POINTS``)."""
        bounds = {b: self.rate_bound(b) for b in self.batches if self.lowest_peak(b) <= cap}
        best: BatchChoice | None = None
        for b in sorted(bounds, key=lambda b: (-bounds[b], b)):
            if best is not None and best.samples_per_second >= bounds[b]:
                break
            choice = model_optimal({b: self.frontier_at(b)}, cap, self.counted)
            if choice is None:
                continue
            choice = replace(choice, step_seconds=choice.step_seconds * self.times.at(b))
            if best is None or choice.samples_per_second > best.samples_per_second:
                best = choice
        return best

    def rate_bound(self, micro_batch: int) -> float:
        """Samples per second no plan exceeds at ``micro_batch``: each unit at its fastest action."""
        cm = self.priced(micro_batch)
        fastest = cm.fixed_seconds + float(cm.seconds.min(axis=1).sum())
        return micro_batch / fastest if fastest > 0 else math.inf

    def exact_plans(self) -> list[Indices]:
        """The plans of the exact frontiers at ``solved`` and wherever ``model_optimal`` solves for the caps, so
        that each cap's model-optimal plan is a candidate at every micro-batch, its own among them."""
        for b in self.solved:
            self.frontier_at(b)
        for cap in self.setup.caps:
            self.model_optimal(cap)
        return list(dict.fromkeys(tuple(p.plan) for front in self._fronts.values() for p in front))

    def candidates(self, plans: Sequence[Indices], cap: int) -> list[BatchChoice]:
        """Every plan at every micro-batch predicted to fit ``cap``, most samples per second first."""
        return ranked(plans, self.priced, self.batches, cap, self.counted)

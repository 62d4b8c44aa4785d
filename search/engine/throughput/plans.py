"""The throughput search's cost-model side: the fit in the micro-batch, its checks, and the plans to measure.

``ThroughputModel`` is made once the profiles are in (the workload's own one and one a few times its
batch: ``search.engine.phases.throughput.fit_batch``, ``env.cost.batch_fit.BatchFit``). It prices any
plan at any micro-batch the search considers (``batches``: every size up to the ladder's top, or up to where the fit puts the lowest peak
over the largest cap when that is further (``extend``); a geometric grid of ``GRID_POINTS`` beyond
``ALL_SIZES_UP_TO``; only the ladder when ``--micro-batches`` gave it), scaled by what the plans
measured at each micro-batch showed (``peak_scale``: measured over predicted peak at the nearest
measured size), and proposes:

- the exact solver's frontier at every ladder micro-batch (``solved``), whose best fitting point over
  them is the model-optimal (plan, micro-batch) per cap (``agents.throughput.model_optimal``): the
  yardstick (the solver compares states in steps of ``relative``: ``THROUGHPUT_EXACT_UNITS``);
- the plans of the agent (``agents.batch_conditioned``; the phase trains it);
- all of them at every micro-batch priced, ranked by predicted samples per second (``candidates``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from agents.exact import FrontierPoint
from agents.throughput import BatchChoice, exact_frontiers, model_optimal, ranked
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


class ThroughputModel:
    """Predicted (plan, micro-batch) throughput under caps, from a fit and what was measured per micro-batch."""

    def __init__(self, fit: BatchFit, setup: ThroughputSetup, relative: float = 0.0) -> None:
        self.fit, self.setup, self.relative = fit, setup, relative
        self.batches = search_batches(setup.ladder, setup.fixed)
        self.checks: list[FitCheck] = []
        self._scales: dict[int, float] = {}
        self.cost_model = lru_cache(maxsize=None)(self._cost_model)
        profile = fit.template
        self.codec = PlanCodec(profile.units, profile.actions, profile.fingerprint)  # the fit's action indices

    def extend(self, cap: int, limit: int) -> list[int]:
        """Price micro-batches beyond the ladder up to the largest at which the fit puts some plan's peak under
        ``cap`` (at most ``limit``): the ladder follows one plan, and another may grow less per sample."""
        def lowest(b: int) -> int:
            return self.counted(lowest_and_keep_peak(self.fit.profile_at(b))[0], b)

        top = max(self.batches)
        if self.setup.fixed:
            return self.batches
        high = min(limit, 2 * top)
        while high < limit and lowest(high) <= cap:
            top, high = high, min(limit, 2 * high)
        last = largest_under(lowest, cap, range(top, high + 1))
        if last is not None and last > max(self.batches):
            self.batches = search_batches([*self.setup.ladder, last])
        return self.batches

    def _cost_model(self, micro_batch: int) -> CostModel:
        return self.fit.cost_model(micro_batch)

    def check(self, micro_batch: int, plan: Indices, label: str, m: MeasuredPlan) -> FitCheck:
        """A plan measured at ``micro_batch`` against the fit: recorded, and it scales the predicted peaks there."""
        check = self.fit.check_at(micro_batch, plan, label, m.peak_bytes, m.step_seconds)
        self.checks.append(check)
        ratios = [c.measured_peak_bytes / c.predicted_peak_bytes for c in self.checks if c.micro_batch == micro_batch]
        self._scales[micro_batch] = float(np.mean(ratios))
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

    def peak_scale(self, micro_batch: int) -> float:
        """Measured over predicted peak at the nearest micro-batch where plans were measured (1 before any)."""
        if not self._scales:
            return 1.0
        nearest = min(self._scales, key=lambda b: (abs(np.log(b / micro_batch)), b))
        return self._scales[nearest]

    def counted(self, predicted_peak: int, micro_batch: int) -> int:
        """A predicted peak as a cap counts it: scaled by the measurements, the gradients added when accumulating."""
        return self.setup.counted(int(predicted_peak * self.peak_scale(micro_batch)), micro_batch)

    def predicted_peak(self, plan: Indices, micro_batch: int) -> int:
        return self.counted(self.cost_model(micro_batch).peak_bytes(list(plan)), micro_batch)

    def predicted_seconds(self, plan: Indices, micro_batch: int) -> float:
        return self.cost_model(micro_batch).predict(list(plan)).step_seconds

    def predicted_rate(self, answer: tuple[int, MeasuredPlan]) -> float:
        """Samples per second the fit prices a measured (micro-batch, plan) at."""
        b, m = answer
        return b / self.predicted_seconds(self.codec.indices(m.actions), b)

    @property
    def solved(self) -> list[int]:
        """Where the exact solver runs: the ladder and the largest micro-batch priced (a solve at every size
        priced would cost as many solves as sizes; ``candidates`` prices the plans at every size)."""
        return sorted({*self.setup.ladder, max(self.batches)})

    def frontiers(self) -> dict[int, list[FrontierPoint]]:
        """The exact frontier at every micro-batch of ``solved`` (cached after the first call)."""
        if not hasattr(self, "_frontiers"):
            self._frontiers = exact_frontiers(self.cost_model, self.solved, self.relative)
        return self._frontiers

    def model_optimal(self, cap: int) -> BatchChoice | None:
        return model_optimal(self.frontiers(), cap, self.counted)

    def exact_plans(self) -> list[Indices]:
        return list(dict.fromkeys(tuple(p.plan) for front in self.frontiers().values() for p in front))

    def candidates(self, plans: Sequence[Indices], cap: int) -> list[BatchChoice]:
        """Every plan at every micro-batch predicted to fit ``cap``, most samples per second first."""
        return ranked(plans, self.cost_model, self.batches, cap, self.counted)

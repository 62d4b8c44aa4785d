"""What users do instead, each at the largest micro-batch it fits under a cap: the throughput search's peers.

A ``Contender`` is one configuration users pick: a rule of our plan space (no checkpointing,
recompute everything, every n-th unit, ``checkpoint_sequential``-style segments) or a peer of
``env.measure.peers`` (transformers' checkpointing on zoo models, ``checkpoint_sequential`` on a chain
of blocks, torch.compile's memory budgets with ``--peers all``). Under a cap it is quoted at the
largest micro-batch whose measured peak fits, which ``largest_fitting`` finds by measurement:

1. an estimate of its peak at every micro-batch: a line through its measured peaks once it has two
   (peaks grow linearly in the micro-batch), else the fitted cost model's prediction scaled by its
   one measurement (rules), or two anchor measurements first (peers, which the cost model cannot price: at
   the workload's own micro-batch and twice it, where a step is cheap);
2. the largest micro-batch the estimate fits is measured; with what it measured the estimate is
   redrawn and the next guess measured, until no size between the largest measured to fit and the
   smallest measured not to is left that the estimate puts under the cap, or ``MAX_TRIES`` guesses.
   Every search goes in rounds, all contenders and caps at once, so that several Evaluators measure
   side by side.

``contenders_for`` makes the run's contenders (the rules users pick and, with ``--peers``, the peers that apply
to the workload), and ``peers_at_caps`` finds each at the largest micro-batch it fits under each cap (their peaks
measured; no step is timed there: the quote times them).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from agents.baselines import baseline_rules
from env.cost.line_fit import fit_line
from env.data.measured import MeasuredPlan
from env.data.types import Indices
from env.measure.peers import Peer, PeerKind, kinds_selected, measurable
from search.engine import ray_session
from search.engine.batch_book import Job
from search.engine.context import RunContext

if TYPE_CHECKING:
    from search.engine.phases.throughput import ThroughputRun
    from search.engine.throughput.plans import ThroughputModel

MAX_TRIES = 5  # micro-batches measured per contender and cap, at most

RULE_LABELS = {"none": "no checkpointing", "all": "recompute everything", "every_2": "every 2nd unit recomputed",
               "every_3": "every 3rd unit recomputed", "every_4": "every 4th unit recomputed",
               "segments_2": "checkpoint_sequential-style, 2 segments (a plan)"}


@dataclass(frozen=True, eq=False)
class Contender:
    """A rule (``plan``: its actions in the run's codec) or a peer, as the quote names it."""

    name: str  # rule:<name> or peer:<name>
    label: str
    plan: Indices | None = None
    peer: Peer | None = None

    def job(self, names: Callable[[Indices], tuple[str, ...]], micro_batch: int) -> Job:
        return Job(self.peer if self.peer is not None else names(self.plan or ()), micro_batch, self.name)


@dataclass
class FitSearch:
    """One contender under one cap: what it measured, the largest micro-batch that fits so far, the next guess."""

    contender: Contender
    cap: int
    fits: tuple[int, MeasuredPlan] | None = None  # the largest micro-batch measured to fit, with its record
    too_big: int | None = None  # the smallest measured not to fit
    tries: int = 0
    next: int | None = None
    done: bool = False
    seen: dict[int, MeasuredPlan] = field(default_factory=dict)


def _line(points: dict[int, int]) -> tuple[float, float] | None:
    """(intercept, slope) through the measured peaks, when there are two sizes or more."""
    if len(points) < 2:
        return None
    return tuple(fit_line(list(points), list(points.values())))


def largest_under(estimate: Callable[[int], float], cap: int, sizes: Sequence[int]) -> int | None:
    """The largest of ``sizes`` (ascending) with ``estimate(b) <= cap`` (estimate non-decreasing); None if not
    even the first."""
    if not len(sizes) or estimate(sizes[0]) > cap:
        return None
    lo, hi = 0, len(sizes) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if estimate(sizes[mid]) <= cap else (lo, mid - 1)
    return sizes[lo]


def guess(search: FitSearch, counted: Callable[[int, int], int], prior: Callable[[int], int] | None,
          sizes: Sequence[int]) -> int | None:
    """The next micro-batch of ``sizes`` (ascending) to measure for ``search`` (None: it is decided)."""
    points = {b: counted(m.peak_bytes, b) for b, m in search.seen.items() if not m.oom}
    line = _line(points)
    if line is not None and line[1] > 0:
        estimate: Callable[[int], float] = lambda b: line[0] + line[1] * b  # noqa: E731
    elif prior is not None:
        scale = np.mean([p / prior(b) for b, p in points.items()]) if points else 1.0
        estimate = lambda b: prior(b) * scale  # noqa: E731
    else:
        return None
    low = search.fits[0] + 1 if search.fits else 0
    high = (search.too_big - 1) if search.too_big else sizes[-1]
    window = sizes[bisect.bisect_left(sizes, low):bisect.bisect_right(sizes, high)]
    if not len(window):
        return None  # the largest size that fits is next to the smallest that does not (or the first does not fit)
    b = largest_under(estimate, search.cap, window)
    if b is None:  # the estimate says no size above what fits does: measure the smallest left once, when none fits
        return None if search.fits else window[0]
    return b


def advance(search: FitSearch, m: MeasuredPlan, micro_batch: int, counted: Callable[[int, int], int],
            guessed: bool = True) -> None:
    """What measuring ``micro_batch`` showed, into the search (``guessed``: one of its guesses, which are counted)."""
    search.seen[micro_batch] = m
    search.tries += guessed
    if not m.oom and counted(m.peak_bytes, micro_batch) <= search.cap:
        if search.fits is None or micro_batch > search.fits[0]:
            search.fits = (micro_batch, m)
    elif search.too_big is None or micro_batch < search.too_big:
        search.too_big = micro_batch


def largest_fitting(searches: Sequence[FitSearch], measure: Callable[[list[Job]], list[MeasuredPlan]],
                    names: Callable[[Indices], tuple[str, ...]], counted: Callable[[int, int], int],
                    prior_of: Callable[[Contender], Callable[[int], int] | None], sizes: Sequence[int],
                    anchors: Sequence[int]) -> None:
    """Each search's largest micro-batch of ``sizes`` (ascending) that fits its cap, found in rounds (module
    docstring). ``anchors``: the micro-batches every peer is measured at before its first guess (not counted
    as guesses)."""
    peers = {s.contender.name: s.contender for s in searches if s.contender.peer is not None}
    jobs = [c.job(names, b) for c in peers.values() for b in anchors]
    for job, m in zip(jobs, measure(jobs)):
        for s in searches:
            if s.contender.name == job.source:
                advance(s, m, job.micro_batch, counted, guessed=False)
    while True:
        todo = []
        for s in (s for s in searches if not s.done):
            b = guess(s, counted, prior_of(s.contender), sizes) if s.tries < MAX_TRIES else None
            s.done = b is None
            if b is not None:
                todo.append((s, b))
        if not todo:
            return
        for (s, b), m in zip(todo, measure([s.contender.job(names, b) for s, b in todo])):
            advance(s, m, b, counted)


def contenders_for(ctx: RunContext) -> list[Contender]:
    """The rules of ``RULE_LABELS`` the run's actions allow and the peers of ``--peers`` that apply;
    ``checkpoint_sequential`` itself replaces its plan-space version where the model has a chain."""
    codec = ctx.ledger.codec
    rules = baseline_rules(codec.n_units, list(codec.actions), seed=ctx.cfg.seed)
    out = [Contender(f"rule:{k}", label, tuple(rules[k])) for k, label in RULE_LABELS.items() if k in rules]
    kinds = kinds_selected(ctx.cfg.peers)
    if kinds:
        offered = ctx.measurer.pool.first.peers.remote(list(kinds), list(ctx.cfg.peer_budgets))
        peers, lines = measurable(ray_session.get(offered))
        for line in lines:
            ctx.ledger.note(line)
        if any(p.kind is PeerKind.CHECKPOINT_SEQUENTIAL for p in peers):
            out = [c for c in out if c.name != "rule:segments_2"]
        out += [Contender(p.digest, p.label, None, p) for p in peers]
    return out


def peers_at_caps(ctx: RunContext, run: "ThroughputRun", model: "ThroughputModel",
                  contenders: list[Contender]) -> dict[int, list[FitSearch]]:
    """Each contender's largest micro-batch that fits each cap (``largest_fitting``), by cap: by their peaks
    alone. On gpt/small the steps these measurements timed were 40% of the throughput search's peers phase, and
    the quote times every contender at its fit again, apart from them."""
    setup, codec = run.setup, ctx.ledger.codec
    searches = {cap: [FitSearch(c, cap) for c in contenders] for cap in setup.caps}
    top = max(setup.ladder)
    low = min(setup.base, top)
    if setup.fixed:
        anchors = sorted({setup.ladder[0], setup.ladder[-1]})
    else:  # small: a peer's peak is a line in the micro-batch; on gpt/small anchors at the top (40) took 16 s
        anchors = sorted({low, min(2 * low, top)}) if low != top else sorted({max(1, top // 2), top})

    def prior_of(c: Contender) -> Callable[[int], int] | None:
        return None if c.plan is None else (lambda b: model.predicted_peak(c.plan, b))  # type: ignore[arg-type]

    largest_fitting([s for group in searches.values() for s in group],
                    lambda jobs: run.measurer.measure_at(jobs, timed=False), codec.names, setup.counted, prior_of,
                    setup.sizes(), anchors)
    return searches

"""The throughput search's answers and quote, and the curve made of them (its peers: ``peers``).

- ``measured_under``: the measured (plan, micro-batch)s that fit a cap, most samples per second first, from
  which the search takes its finalists.
- ``quote_and_curve``: every cap's answer and peers measured again, alike, in ``QUOTE_ROUNDS``
  interleaved rounds (first in order, then reversed), so that the table compares measurements taken
  side by side and none of those that selected the answer (a best-of-many measurement flatters); the
  ``ThroughputCurve`` of them goes to the store (meta ``throughput``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from env.data.codec import PlanCodec
from env.data.measured import MeasuredPlan
from env.data.types import Indices
from search.engine import passes
from search.engine.batch_book import Job
from search.engine.measurer import Measurer
from search.engine.context import RunContext
from search.engine.throughput.peers import FitSearch
from search.engine.throughput.plans import ThroughputModel, ladder_plans
from search.records import meta
from search.records.pareto import nondominated
from search.records.throughput import CapRow, FitCheckRow, ThroughputCurve, ThroughputPoint, mib

if TYPE_CHECKING:
    from search.engine.phases.throughput import ThroughputRun

QUOTE_ROUNDS = 2
Answer = tuple[int, MeasuredPlan]  # (micro-batch, the plan's record there)
PROPOSERS = ("exact", "agent")  # who proposed a configuration: the prefix of its source
AGENT = "agent:micro-batch-conditioned"
BOTH = "+"  # a source that names several proposers: exact+agent:micro-batch-conditioned


def proposed_by(m: MeasuredPlan, prefix: str) -> bool:
    """Whether a proposer whose source starts with ``prefix`` proposed ``m`` (alone or with others)."""
    return any(names_proposer(src, prefix) for src in m.sources)


def names_proposer(source: str, prefix: str) -> bool:
    """Whether ``source`` names a proposer whose source starts with ``prefix`` (alone or with others)."""
    return any(part.startswith(prefix) for part in source.split(BOTH))


def samples_per_second(answer: Answer) -> float:
    """A (micro-batch, record)'s samples per second at its median step."""
    return answer[0] / answer[1].step_seconds


def measured_under(run: "ThroughputRun", cap: int) -> list[Answer]:
    """Every plan measured at a micro-batch (candidates, rules, probes) whose counted peak fits ``cap``, most
    samples per second first."""
    fits = [(b, m) for (b, digest), m in run.book.records.items()
            if not digest.startswith("peer:") and not m.oom and m.step_seconds_samples
            and run.setup.counted(m.peak_bytes, b) <= cap]
    return sorted(fits, key=lambda bm: (-samples_per_second(bm), bm[1].peak_bytes))


def best_by_proposer(run: "ThroughputRun", cap: int) -> dict[str, Answer]:
    """Per proposer (``PROPOSERS``), the measured (plan, micro-batch) it proposed that fits ``cap`` with the most
    samples per second on the search's measurements: the agent's answer against the exact solver's."""
    measured = measured_under(run, cap)
    out = {}
    for who in PROPOSERS:
        best = next((a for a in measured if proposed_by(a[1], who)), None)
        if best is not None:
            out[who] = best
    return out


def interleaved_rounds(measurer: Measurer, jobs: dict[tuple[str, int], Job], rounds: int,
                       record: bool = False) -> dict[tuple[str, int], MeasuredPlan]:
    """Every job measured afresh once a round, in order and then reversed, turn by turn (``search.engine.passes``);
    each one's measurements merged (none of the book's: these are compared with each other only). The order puts
    the largest micro-batches in the middle (``middle_out``), so that neither round ends on its longest steps
    while the other Evaluators wait for the next round. ``record``: each measurement also into the book as it
    arrives (the deciding rounds; a quote's are shown only in the curve)."""
    return passes.rounds(measurer, {k: jobs[k] for k in middle_out(list(jobs), key=lambda k: jobs[k].micro_batch)},
                         rounds, record)


def middle_out(items: list[Any], key: Callable[[Any], int]) -> list[Any]:
    """``items`` by ``key``, the smallest at both ends and the largest in the middle, in turn (1 3 5 6 4 2):
    reversed, it ends on small ones too."""
    ranked = sorted(items, key=key)
    return ranked[0::2] + ranked[1::2][::-1]


def _point(run: "ThroughputRun", m: MeasuredPlan, b: int, name: str, label: str,
           units: list[str] | None) -> ThroughputPoint:
    s = run.setup
    return ThroughputPoint.of(m, name, label, b, s.global_batch, s.gradient_bytes, s.tokens_per_sample, units)


def quote_and_curve(ctx: RunContext, run: "ThroughputRun", model: ThroughputModel, answers: dict[int, Answer | None],
                    searches: dict[int, list[FitSearch]]) -> ThroughputCurve:
    """The quote (module docstring) and the curve; written to the store and returned."""
    codec, units = ctx.ledger.codec, list(ctx.ledger.codec.units)
    jobs: dict[tuple[str, int], Job] = {}
    proposed = {cap: best_by_proposer(run, cap) for cap in answers}
    for cap, answer in answers.items():
        for b, m in [*([answer] if answer is not None else []), *proposed[cap].values()]:
            jobs.setdefault((m.digest, b), Job(tuple(m.actions), b, "ours"))
        for s in searches[cap]:
            if s.fits is not None:
                jobs[(s.fits[1].digest, s.fits[0])] = s.contender.job(codec.names, s.fits[0])
    quoted = interleaved_rounds(run.measurer, jobs, QUOTE_ROUNDS)
    rows = [_cap_row(run, model, codec, units, cap, answers[cap], searches[cap], quoted, proposed[cap])
            for cap in run.setup.caps]  # priced by the model that chose: the quote's measurements scale nothing yet
    check_where_quoted(model, codec, run.setup.lowest, quoted)
    curve = ThroughputCurve(
        caps=rows, micro_batches=run.setup.ladder, default_micro_batch=run.setup.base,
        global_batch=run.setup.global_batch, tokens_per_sample=run.setup.tokens_per_sample,
        gradient_bytes=run.setup.gradient_bytes, batching=run.setup.how, profiled_batches=model.fit.batches,
        fit_checks=[FitCheckRow(**c.__dict__) for c in model.fit_checks()],
        frontiers=_frontiers(run, units), quote_rounds=QUOTE_ROUNDS, evaluators=len(run.measurer.pool.live),
        not_fitting=not_fitting(run, codec))
    ctx.ledger.store.write(meta.THROUGHPUT, curve)
    return curve


def not_fitting(run: "ThroughputRun", codec: PlanCodec) -> list[str]:
    """Each configuration measured as not fitting (an allocation of its step failed, or it killed its Evaluators:
    ``env.measure.measurement.not_fitting``), in words: plan or peer, micro-batch, the bytes it asked for."""
    said: dict[str, int] = {}  # plans that differ in which units they recompute read alike: counted
    for (b, digest), m in sorted(run.book.records.items()):
        if m.oom:
            what = digest if digest.startswith("peer:") else codec.plan(codec.indices(m.actions)).summary()
            asked = f", its allocation asked for {mib(m.requested_bytes)}" if m.requested_bytes else ""
            said[f"{what} at micro-batch {b}{asked}"] = said.get(f"{what} at micro-batch {b}{asked}", 0) + 1
    return [f"{text} ({n} plans)" if n > 1 else text for text, n in said.items()]


def check_where_quoted(model: ThroughputModel, codec: PlanCodec, lowest: Indices,
                       quoted: dict[tuple[str, int], MeasuredPlan]) -> None:
    """The fit checked against the quote's measurements of all keep and the lowest-memory plan wherever the
    ladder's probe did not time them: between the ladder's sizes, and above the largest micro-batch the fit was
    made from, where the probe measures peaks alone (``measure_ladder``)."""
    timed = model.timed_checks
    plans = {codec.digest(plan): (label, plan) for label, plan in ladder_plans(codec, lowest).items()}
    for (digest, b), m in sorted(quoted.items(), key=lambda kv: kv[0][1]):
        label, plan = plans.get(digest, ("", None))
        if plan is not None and not m.oom and m.step_seconds_samples and (b, label) not in timed:
            model.check(b, plan, label, m)


def _cap_row(run: "ThroughputRun", model: ThroughputModel, codec: PlanCodec, units: list[str], cap: int,
             answer: Answer | None, searches: list[FitSearch], quoted: dict[tuple[str, int], MeasuredPlan],
             proposed: dict[str, Answer]) -> CapRow:
    row: dict[str, Any] = {"cap_bytes": cap, "by_proposer": {
        who: _point(run, quoted[(m.digest, b)], b, who, codec.plan(codec.indices(m.actions)).summary(), units)
        for who, (b, m) in proposed.items()}}
    if answer is not None:
        b, m = answer
        label = codec.plan(codec.indices(m.actions)).summary()
        row["selected"] = _point(run, m, b, "ours", label, units)
        row["answer"] = _point(run, quoted[(m.digest, b)], b, "ours", label, units)
        plan = codec.indices(m.actions)
        row["fit_seconds"], row["predicted_seconds"] = model.fit_seconds(plan, b), model.predicted_seconds(plan, b)
    else:
        low = min((r for (b, d), r in run.book.records.items() if not r.oom), key=lambda r: r.peak_bytes, default=None)
        row["why"] = f"no plan measured fits {mib(cap)}" + (f"; the lowest measured peak is {mib(low.peak_bytes)}"
                                                            if low else "")
    best = model.model_optimal(cap)
    if best is not None:
        row["model_optimal"] = ThroughputPoint(
            name="model-optimal", label=codec.plan(best.plan).summary() + " (predicted)",
            digest=codec.digest(best.plan),
            plan=dict(zip(units, codec.plan(best.plan).action_list(units))), micro_batch=best.micro_batch,
            peak_bytes=best.peak_bytes, counted_peak_bytes=best.peak_bytes, step_seconds=best.step_seconds,
            samples_per_second=best.samples_per_second, source="exact")
    quote = [row["answer"]] if answer is not None else []
    unfit = {}
    for s in searches:
        c = s.contender
        if s.fits is None:
            seen = min(s.seen.items(), default=None)
            unfit[c.name] = (f"does not fit at micro-batch {seen[0]} ("
                             f"{'out of memory' if seen[1].oom else mib(seen[1].peak_bytes)})" if seen else "not measured")
            continue
        b, m = s.fits
        quote.append(_point(run, quoted[(m.digest, b)], b, c.name, c.label, units if c.plan is not None else None))
    return CapRow(**row, quote=quote, unfit=unfit)


def _frontiers(run: "ThroughputRun", units: list[str]) -> dict[int, list[ThroughputPoint]]:
    """The measured memory/time frontier of our plans at every micro-batch measured."""
    out: dict[int, list[ThroughputPoint]] = {}
    for b in sorted({b for b, _ in run.book.records}):
        rows = [m for m in run.book.at(b) if not m.digest.startswith("peer:") and not m.oom and m.step_seconds_samples]
        if not rows:
            continue
        keep = nondominated(np.array([[m.peak_bytes, m.step_seconds] for m in rows]))
        front = sorted((m for m, k in zip(rows, keep) if k), key=lambda m: m.peak_bytes)
        out[b] = [_point(run, m, b, "plan", m.source, units) for m in front]
    return out

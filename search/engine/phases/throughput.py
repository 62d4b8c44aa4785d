"""The throughput search (``--memory-cap``): the fastest (plan, micro-batch) per cap, measured, beside the peers.

``probe_throughput`` runs right after the profile, so that a cap nothing fits fails in seconds: the
workload's batch facts, the caps and the ladder of micro-batches (``search.engine.throughput.caps``), from
measured peaks alone, found while the first Evaluator takes the fit's second profile (``early_fit_batch``);
then, while it still profiles, all keep and the lowest-memory plan are measured along the ladder (step 1's
checks), on the first Evaluator too once its profile is done.
``search_throughput`` runs after the run's own search, in this order (on CPUs a throughput search measures on
one Evaluator per ``--measure-threads`` cores, ``search.engine.evaluator_pool.throughput_evaluators``):

1. the per-unit fit through the workload's own profile and the probe's (``env.cost.batch_fit``; ``fitted``); all keep
   and the lowest-memory plan measured at every ladder size, timed up to the largest size the fit was made from
   (``measure_ladder``), and checked against the fit there (``ThroughputCurve.fit_checks``);
2. the plans: the exact solver's at the ladder's micro-batches and at every micro-batch priced where a cap's
   model-optimal may lie (``search.engine.throughput.plans``; the fit's peaks and step times scaled by those
   measured at the nearest micro-batch) and those of one PPO agent conditioned on the micro-batch and the budget
   (``agents.batch_conditioned``), with the rules;
3. the peers, each at the largest micro-batch it fits under each cap, by their peaks alone
   (``search.engine.throughput.peers``), measured while the agent of step 2 trains (``plans_and_peers``);
4. per cap, the (plan, micro-batch)s the model ranks first that are not measured yet, ``CANDIDATES`` at a
   time for ``CANDIDATE_ROUNDS`` rounds, and each proposer's first (``measure_candidates``); then the
   finalists (``finalists``: the ``DECIDING`` best measured that fit, rules and probes counted, as they are
   plans too, and any other within ``NEAR`` of the best, up to ``DECIDING_MOST``; with the rules the model
   prices within ``NEAR`` of the fastest rule at the largest micro-batch each fits), those the correctness
   gate passes (``passed_gate``), measured again side by side, then the first two on those measured again (the run-off), and the answer is the one of the most
   samples per second on the run-off's measurements whose measured peak fits, or where those cannot tell the
   two apart the one the fit prices faster (``decide``, ``the_faster``);
5. the quote (``search.engine.throughput.quote``): every cap's answer and peers measured again,
   alike, in ``QUOTE_ROUNDS`` interleaved rounds; the curve (store meta ``throughput``) shows those.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import torch

from agents.batch_agents import reachable_range
from agents.batch_conditioned import MicroBatchConditionedAgent
from agents.exact import exact_frontier
from env.cost.batch_fit import BatchFit
from env.data.codec import PlanCodec
from env.data.measured import MeasuredPlan, within_spreads
from env.data.model_profile import ModelProfile
from env.data.plan import Action
from env.data.types import Indices
from search.engine import ray_session
from search.engine.batch_book import BatchBook, BatchTerms, Job
from search.engine.context import RunContext
from search.engine.measurer import Measurer
from search.engine.phases.gate import check_plans
from search.engine.throughput.caps import (MAX_MICRO_BATCH, ThroughputError, ThroughputSetup, find_ladder,
                                          no_plan_fits, resolve_caps)
from search.engine.throughput.peers import FitSearch, contenders_for, peers_at_caps
from search.engine.throughput.plans import ThroughputModel, ladder_plans, solver_relative
from search.engine.throughput.quote import (AGENT, BOTH, PROPOSERS, Answer, interleaved_rounds, measured_under,
                                            names_proposer, quote_and_curve, samples_per_second)
from search.records import meta
from search.records.config import SearchConfig

CANDIDATES = 3  # (plan, micro-batch)s measured per cap and round
CANDIDATE_ROUNDS = 2
FIT_SPAN = 4  # the fit's second profile: at the smallest ladder size this many times the own batch (``fit_batch``)
SLOPE_SPAN = 3  # samples between the two sizes the lowest plan per sample is judged at
DECIDING = 3  # per cap, the best measured (plan, micro-batch)s measured again side by side before the answer
NEAR = 0.85  # and any other measured within this fraction of the best's samples per second ...
DECIDING_MOST = 6  # ... up to this many
DECIDING_ROUNDS = 2
RUNOFF_ROUNDS = 2  # the deciding rounds' first two per cap measured again, alone, before the answer
T = TypeVar("T")
PlanAgent = tuple[MicroBatchConditionedAgent, dict[int, list[int]]]  # the agent and the budgets it is asked at


@dataclass(frozen=True)
class ThroughputRun:
    """A throughput search's fixed setup, and the run's measurer (which measures at micro-batches by the setup's
    ``BatchTerms``)."""

    setup: ThroughputSetup
    measurer: Measurer

    @property
    def book(self) -> BatchBook:
        """What the run measured at other micro-batches (``Ledger.batches``)."""
        return self.measurer.ledger.batches


def probe_throughput(ctx: RunContext) -> ThroughputRun:
    """Batch facts, caps and ladder (module docstring); a cap nothing fits raises ``ThroughputError``. While the
    ladder is found from peaks, the first Evaluator takes the fit's second profile (``early_fit_batch``), so the
    two take the time of the longer, not their sum; it is stored for ``fitted``. The fit's
    checks along the ladder (``ladder_jobs``) follow the ladder on the other Evaluators, and on the first once
    it has profiled (``EvaluatorPool.first_aside``)."""
    cfg, ledger, pool = ctx.cfg, ctx.ledger, ctx.measurer.pool
    batch_dim = cfg.batch_dim if cfg.batch_dim >= 0 else None
    facts = ray_session.get(pool.first.batch_facts.remote(batch_dim))
    caps = resolve_caps(cfg.memory_cap, facts["device_memory_bytes"])
    codec = ledger.codec
    setup = ThroughputSetup.of(facts, caps, [], cfg.global_batch, ())
    measurer = ctx.measurer
    measurer.batch_terms = BatchTerms(batch_dim, lambda b: max(caps) - setup.counted(0, b), setup.base)
    limit = min(cfg.global_batch or MAX_MICRO_BATCH, MAX_MICRO_BATCH)
    smallest = min(cfg.micro_batches) if cfg.micro_batches else 1
    lowest = lowest_per_sample(ctx, measurer, setup, smallest, limit)
    what = f"the lowest-memory plan ({codec.plan(lowest).summary()})"

    def measure_lowest(b: int) -> MeasuredPlan:
        return measurer.measure_at([Job(codec.names(lowest), b, "throughput:lowest")], timed=False)[0]

    if cfg.micro_batches:
        ladder = sorted({b for b in cfg.micro_batches if b <= limit}) or [smallest]
    elif ledger.store.read(meta.THROUGHPUT_PROFILES):  # a resumed run: profiled already
        ladder = find_ladder(measure_lowest, caps, setup.counted, limit, what)
    else:  # the fit's profile on the first Evaluator while the others find the ladder by peaks alone
        far = early_fit_batch(setup, {b: measure_lowest(b) for b in sizes_of_lowest(cfg, smallest, limit)}, limit)

        def find() -> list[int]:
            found = find_ladder(measure_lowest, caps, setup.counted, limit, what)
            measure_ladder(measurer, ladder_jobs(codec, found, lowest), max(far, setup.base))  # step 1's, on the
            return found  # first Evaluator too once it has profiled

        ladder, _ = profile_beside(ctx, far, batch_dim, find, setup.base)  # no profile (CUDA, out of memory): ``fitted``'s
    return ThroughputRun(ThroughputSetup.of(facts, caps, ladder, cfg.global_batch, lowest, bool(cfg.micro_batches)),
                         measurer)


def lowest_per_sample(ctx: RunContext, measurer: Measurer, setup: ThroughputSetup, smallest: int,
                      limit: int) -> Indices:
    """Of the exact solver's lowest-memory plan at the workload's own batch and recompute everything, the one
    whose measured peak grows least per sample from ``smallest`` to ``SLOPE_SPAN`` samples more: the plan that
    fits the largest micro-batch (at the own batch the lowest plan may keep a unit whose bytes grow with it).
    Refuses (``ThroughputError``) when neither fits the lowest cap at ``smallest``."""
    codec, cm = ctx.ledger.codec, ctx.ledger.setup.cost_model
    plans = [tuple(exact_frontier(cm, relative=solver_relative(codec.n_units))[0].plan)]
    if Action.RECOMPUTE in codec.actions:
        plans.append(codec.uniform(Action.RECOMPUTE))
    plans = list(dict.fromkeys(plans))
    sizes = sizes_of_lowest(ctx.cfg, smallest, limit)
    jobs = [Job(codec.names(p), b, "throughput:lowest") for p in plans for b in sizes]
    got = dict(zip([(p, b) for p in plans for b in sizes], measurer.measure_at(jobs, timed=False)))
    peak = {k: (m.peak_bytes if m.oom else setup.counted(m.peak_bytes, k[1])) for k, m in got.items()}
    fitting = [p for p in plans if not got[(p, smallest)].oom and peak[(p, smallest)] <= setup.caps[0]]
    if not fitting:
        low = min(plans, key=lambda p: peak[(p, smallest)])
        raise no_plan_fits(setup.caps[0], peak[(low, smallest)], smallest, f"{codec.plan(low).summary()}"
                           + (" (out of memory)" if got[(low, smallest)].oom else ""))
    return min(fitting, key=lambda p: (peak[(p, sizes[-1])] - peak[(p, smallest)], peak[(p, sizes[-1])]))


def sizes_of_lowest(cfg: SearchConfig, smallest: int, limit: int) -> list[int]:
    """The micro-batches ``lowest_per_sample`` measures its plans at: the first two given, or ``smallest`` and
    ``SLOPE_SPAN`` samples more."""
    given = sorted(cfg.micro_batches)
    return given[:2] if given else ([smallest, min(smallest + SLOPE_SPAN, limit)] if limit > smallest else [smallest])


def early_fit_batch(setup: ThroughputSetup, lowest: dict[int, MeasuredPlan], limit: int) -> int:
    """The fit's second micro-batch, chosen before the ladder is known so that its profile runs while the ladder is
    found: the smallest power of two at least ``FIT_SPAN`` times the own batch (at most ``limit``), as ``fit_batch``
    chooses on a ladder that reaches it; where a line through the lowest plan's peaks at two sizes (``lowest``)
    puts the ladder's top below half of that, that top (``fit_batch`` takes a short ladder's top). Where all keep
    runs out of memory there (CUDA), the profile says so and ``fitted`` profiles where all keep ran."""
    want = min(limit, 1 << (FIT_SPAN * setup.base - 1).bit_length())
    peaks = sorted((b, setup.counted(m.peak_bytes, b)) for b, m in lowest.items() if not m.oom)
    if len(peaks) >= 2 and peaks[-1][1] > peaks[0][1]:
        (b1, p1), (b2, p2) = peaks[0], peaks[-1]
        top = b2 + int((max(setup.caps) - p2) * (b2 - b1) // (p2 - p1))
        if top < want // 2:
            want = max(top, 1)
    return want if want != setup.base else fit_batch([], setup.base)


def fitted(ctx: RunContext, run: ThroughputRun) -> BatchFit:
    """The fit through the workload's own profile and one at another micro-batch: the one ``probe_throughput``
    took while it found the ladder (``early_fit_batch``), or where there is none (a given ladder, or that profile
    ran out of memory) one at ``fit_batch`` of the ladder sizes where all keep runs, measured first (a profile
    steps every action, and on a GPU all keep runs out of memory long before the lowest-memory plan does),
    while the other Evaluators measure the lowest-memory plan along the ladder. All keep and the lowest plan are
    measured at every ladder size (``probe_ladder`` checks the fit against them)."""
    base = run.setup.base
    profiles = ctx.ledger.store.read(meta.THROUGHPUT_PROFILES)
    if not profiles:  # else the probe took it, and measured along the ladder (``probe_ladder`` completes that)
        jobs = ladder_jobs(ctx.ledger.codec, run.setup.ladder, run.setup.lowest)
        keep, lowest = jobs[0::2], jobs[1::2]
        kept = run.measurer.measure_at(keep)
        far = fit_batch([j.micro_batch for j, m in zip(keep, kept) if not m.oom and j.micro_batch != base], base)
        _, profiles = profile_beside(ctx, far, run.measurer.batch_terms.batch_dim,
                                     lambda: measure_ladder(run.measurer, lowest, max(base, far)), base)
        if profiles is None:
            raise ThroughputError(f"the profile at micro-batch {far} ran out of memory where all keep did not; "
                                  "give the micro-batches to search (--micro-batches) below it")
    return BatchFit({base: ctx.ledger.setup.profile, **profiles})


def profile_beside(ctx: RunContext, far: int, batch_dim: int | None, work: Callable[[], T],
                   base: int) -> tuple[T, dict[int, ModelProfile] | None]:
    """``work``'s result, with the fit's second profile at micro-batch ``far`` taken on the first Evaluator
    while ``work`` measures on the others, and on the first once it has profiled (``EvaluatorPool.first_aside``);
    the profile stored for a resumed run, or None where it did not fit (an allocation failed, or the kernel killed
    the Evaluator's process in it: restarted)."""
    pool = ctx.measurer.pool
    with pool.first_aside(lambda first: first.profile_at.remote(far, batch_dim), f"the profile at micro-batch {far}") \
            as profiled:
        done = work()
    codec = ctx.ledger.codec
    seconds = pool.deadlines.profile(codec.n_units, len(codec.actions), far / base)
    got = pool.aside_result(profiled, seconds)  # None: out of memory, or its process killed on it
    if got is None:
        return done, None
    profiles = {far: ModelProfile.model_validate(got)}
    ctx.ledger.store.write(meta.THROUGHPUT_PROFILES, profiles)
    return done, profiles


def ladder_jobs(codec: PlanCodec, ladder: list[int], lowest: Indices) -> list[Job]:
    """All keep and the lowest-memory plan at every ladder size, in turn, largest first (no Evaluator left
    waiting on a long step at the end): what ``probe_ladder`` checks the fit against."""
    plans = [codec.names(p) for p in ladder_plans(codec, lowest).values()]
    return [Job(p, b, "throughput:probe") for b in sorted(ladder, reverse=True) for p in plans]


def measure_ladder(measurer: Measurer, jobs: list[Job], timed_to: int) -> list[MeasuredPlan]:
    """``jobs`` measured, steps timed up to micro-batch ``timed_to`` (the largest the fit was made from) and
    the peaks alone above it. A step's time above the fit checks an extrapolation the quote checks too, where
    it measures all keep or the lowest-memory plan there (``check_where_quoted``), and the lowest plan's steps at
    the ladder's top are the slowest of a search (docs/throughput.md, "Why the steps are as they are"). Where
    such a configuration is an answer, the fit prices it first and the candidates' step times it."""
    measurer.measure_at([j for j in jobs if j.micro_batch > timed_to], timed=False)
    measurer.measure_at([j for j in jobs if j.micro_batch <= timed_to])
    return [measurer.known_at(j) for j in jobs]  # type: ignore[misc]


def fit_batch(runs: list[int], base: int) -> int:
    """The micro-batch of the fit's second profile: of ``runs`` (the ladder sizes but the workload's own batch
    ``base`` where all keep runs), the smallest at least ``FIT_SPAN`` times ``base``, else the largest; with
    none, half of ``base`` (2 for a batch of 1). Not the far end of the ladder: a profile times every action
    of every unit, so there it costs far more than a measurement. The fit is a line per unit
    through the two profiles; its predictions at the other ladder sizes are checked against the plans
    measured there (``ThroughputCurve.fit_checks``)."""
    if not runs:
        return base // 2 if base > 1 else 2
    return min((b for b in runs if b >= FIT_SPAN * base), default=max(runs))


def probe_ladder(ctx: RunContext, run: ThroughputRun, model: ThroughputModel) -> None:
    """All keep and the lowest-memory plan at every ladder size (``measure_ladder``), each checked against the
    fit."""
    jobs = [(label, p, Job(ctx.ledger.codec.names(p), b, "throughput:probe")) for b in run.setup.ladder
            for label, p in ladder_plans(ctx.ledger.codec, run.setup.lowest).items()]
    for (label, p, job), m in zip(jobs, measure_ladder(run.measurer, [j for *_, j in jobs], max(model.fit.batches))):
        if not m.oom:
            model.check(job.micro_batch, p, label, m)


def conditioned_agent(ctx: RunContext, run: ThroughputRun, model: ThroughputModel) -> PlanAgent | None:
    """The PPO agent conditioned on the micro-batch and the budget, told what the book holds so far, with the
    budgets it will be asked at; None where it has nothing to learn (``--throughput-timesteps 0``, or every cap
    above all keep's peak or below the lowest at every size)."""
    if ctx.cfg.throughput_timesteps <= 0:
        return None
    # the agent's envs scale predicted peaks by the plans measured there (observe); the gradients kept when
    # accumulating are not in a plan's peak: they come off the cap
    budgets = {b: [c - run.setup.counted(0, b) for c in run.setup.caps] for b in run.setup.ladder}
    profiles = {b: model.fit.profile_at(b) for b in run.setup.ladder}
    if not any(reachable_range(p, budgets[b]) for b, p in profiles.items()):
        return None
    agent = MicroBatchConditionedAgent(profiles, budgets, seed=ctx.cfg.seed)
    codec = ctx.ledger.codec
    for b in agent.env.envs:
        agent.observe(b, [(codec.indices(m.actions), m.peak_bytes, m.step_seconds)
                          for m in run.book.at(b) if m.actions and not m.oom and m.step_seconds_samples])
    return agent, budgets


def plan_pool(ctx: RunContext, model: ThroughputModel, agent: PlanAgent | None) -> dict[Indices, str]:
    """The exact solver's plans at the ladder's micro-batches and the agent's (``conditioned_agent``, trained
    here) at every ladder size and cap, each with who proposed it ("exact+agent:..." where both did)."""
    pool = dict.fromkeys(model.exact_plans(), "exact")
    if agent is not None:
        conditioned, budgets = agent
        conditioned.train(ctx.cfg.throughput_timesteps * len(conditioned.env.envs))
        for plans in conditioned.plans(budgets).values():
            for p in plans:
                pool[p] = AGENT if p not in pool else f"{pool[p]}{BOTH}{AGENT}"  # both proposed it: both named
    return pool


def plans_and_peers(ctx: RunContext, run: ThroughputRun, model: ThroughputModel
                    ) -> tuple[dict[Indices, str], dict[int, list[FitSearch]]]:
    """Steps 2 and 3 at once: the agent trains in this process while the Evaluators measure the peers' peaks
    (no step is timed there, and a peak is exact however busy the cores are); the agent learns from what the
    book held before the peers were measured."""
    contenders = contenders_for(ctx)
    agent = conditioned_agent(ctx, run, model)
    with ThreadPoolExecutor(1, thread_name_prefix="throughput-peers") as meanwhile, one_torch_thread():
        peers = meanwhile.submit(peers_at_caps, ctx, run, model, contenders)
        pool = plan_pool(ctx, model, agent)
        searches = peers.result()
    for c in contenders:
        if c.plan is not None:
            pool.setdefault(c.plan, c.name)
    return pool, searches


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """This process's torch on one thread while the Evaluators measure on the other cores: the agent's small
    policy trains about as fast on one thread as on two, and on two it spins against the Evaluators beside it,
    whose measurements it slows."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_candidates(ctx: RunContext, run: ThroughputRun, model: ThroughputModel, pool: dict[Indices, str]) -> None:
    """Per cap, the best-ranked (plan, micro-batch)s not measured yet, ``CANDIDATES`` a round; then, where not
    measured yet, each proposer's best-ranked (``PROPOSERS``), so that the quote sets the agent's answer beside
    the exact solver's at every cap, even where the model ranks every plan of one proposer above the other's. A
    plan of the pool that the book measured first under another name is credited to whoever proposed it
    (``BatchBook.credit``)."""
    codec = ctx.ledger.codec

    def ranked(cap: int) -> list[Job]:
        return [Job(codec.names(c.plan), c.micro_batch, pool[c.plan]) for c in model.candidates(list(pool), cap)]

    def measure(jobs: list[Job]) -> None:
        for job, m in zip(jobs, run.measurer.measure_at(jobs)):
            if not m.oom:
                model.check(job.micro_batch, codec.indices(job.item), "candidate", m)  # type: ignore[arg-type]

    for _ in range(CANDIDATE_ROUNDS):
        jobs: list[Job] = []
        for cap in run.setup.caps:
            jobs += [j for j in ranked(cap) if run.measurer.lacks_at(j)][:CANDIDATES]
        if not jobs:
            break
        measure(jobs)
    firsts: list[Job] = []
    for cap in run.setup.caps:
        jobs = ranked(cap)  # once per cap: it ranks every plan of the pool at every micro-batch
        for who in PROPOSERS:
            first = next((j for j in jobs if names_proposer(j.source, who)), None)
            if first is not None and run.measurer.lacks_at(first):
                firsts.append(first)
    measure(firsts)
    by_digest = {codec.digest(p): source for p, source in pool.items()}  # timed first under another name (the probe's)
    run.book.credit({key: by_digest.get(key[1], "") for key, m in run.book.records.items() if m.step_seconds_samples})


def near_rules(searches: list[FitSearch], model: ThroughputModel) -> list[Answer]:
    """The rules (contenders that are plans of the run's space) at the largest micro-batch each fits that the
    fitted model prices within ``NEAR`` of the fastest of them, fastest first (finding that micro-batch measured
    peaks only, so the model ranks them). One rule is not enough where several are close: the one the model
    ranks first need not be the one a quote measures fastest, and a rule no deciding round timed is no answer."""
    rated = sorted(((s.fits[0] / model.predicted_seconds(s.contender.plan, s.fits[0]), s.fits) for s in searches
                    if s.contender.plan is not None and s.fits is not None and not s.fits[1].oom),
                   key=lambda rf: -rf[0])
    return [fits for rate, fits in rated if rate >= NEAR * rated[0][0]]


def finalists(run: ThroughputRun, cap: int, searches: list[FitSearch], model: ThroughputModel) -> list[Answer]:
    """The (plan, micro-batch)s ``decide`` measures again for ``cap``: the ``DECIDING`` best measured that fit,
    any other measured within ``NEAR`` of the best's samples per second (``DECIDING_MOST`` in all), and the rules
    the fitted model prices within ``NEAR`` of the fastest rule at the largest micro-batch each fits
    (``near_rules``). The book's samples were taken minutes apart, through a load that changes, so a plan
    behind on them is not out: the deciding rounds measure the group side by side."""
    measured = measured_under(run, cap)
    best = samples_per_second(measured[0]) if measured else 0.0
    group = [a for i, a in enumerate(measured) if i < DECIDING or samples_per_second(a) >= NEAR * best][:DECIDING_MOST]
    for rule in near_rules(searches, model):
        if all((b, m.digest) != (rule[0], rule[1].digest) for b, m in group):
            group.append(rule)
    return group


def passed_gate(ctx: RunContext, finalists_of: dict[int, list[Answer]]) -> dict[int, list[Answer]]:
    """Each cap's finalists that the correctness gate passes (``search.engine.phases.gate``): every plan among
    them that has no verdict yet is checked once, on the workload at its own batch (a plan recomputes the same
    way at every micro-batch), so that an answer keeps the gradients as every plan of the frontier does. A plan
    the gate refuses is no cap's answer, and its units are kept by every plan proposed after it."""
    plans = {m.digest: m for group in finalists_of.values() for _, m in group}
    known = ctx.ledger.store.read(meta.GATE)
    check_plans(ctx, [m for digest, m in plans.items() if digest not in known])
    verdicts = ctx.ledger.store.read(meta.GATE)
    return {cap: [(b, m) for b, m in group if verdicts[m.digest].passed] for cap, group in finalists_of.items()}


def decide(run: ThroughputRun, finalists_of: dict[int, list[Answer]], model: ThroughputModel
           ) -> dict[int, Answer | None]:
    """Per cap, its ``finalists`` (``finalists_of``, those the correctness gate passed) measured again side by side in ``DECIDING_ROUNDS`` interleaved rounds (each
    once a round, however many caps name it), then the run-off: the first two on those measurements measured
    again in ``RUNOFF_ROUNDS`` interleaved rounds, and the answer is the one of the most samples per second on
    the run-off's measurements alone, whose measured peak fits. Measured minutes apart, under a load that
    changes, two plans compare by the load as much as by the plans; side by side they do not. And the first of
    several finalists is the one whose measurements read luckiest, so its lead on the measurements that chose
    it overstates what a quote gives. The run-off's measurements chose nothing before, so they rank the two as
    a quote would; where they cannot tell the two apart, the fit does (``the_faster``)."""
    got = _measured_again(run, [m for group in finalists_of.values() for m in group], DECIDING_ROUNDS)
    first_two = {cap: sorted(_fitting(run, cap, [(b, got[(m.digest, b)]) for b, m in group]),
                             key=samples_per_second, reverse=True)[:2] for cap, group in finalists_of.items()}
    again = _measured_again(run, [m for pair in first_two.values() if len(pair) > 1 for m in pair], RUNOFF_ROUNDS)
    answers: dict[int, Answer | None] = {}
    for cap, pair in first_two.items():
        fits = _fitting(run, cap, [(b, again[(m.digest, b)]) for b, m in pair]) if len(pair) > 1 else pair
        answers[cap] = the_faster(fits, model) if fits else (pair[0] if pair else None)
    return answers


def the_faster(answers: list[Answer], model: ThroughputModel) -> Answer:
    """The one of the most samples per second; of two whose seconds per sample differ by no more than either's
    spread per sample (as the bench judges a quote), the one the fitted model prices faster. There the
    measurements cannot tell the two apart and the model can: recomputing a unit never makes a step cheaper,
    and the fit knows that."""
    best = max(answers, key=samples_per_second)
    if len(answers) != 2:
        return best
    if not within_spreads(*((m.step_seconds, b, m.spread_seconds) for b, m in answers)):
        return best
    return max(answers, key=model.predicted_rate)


def _measured_again(run: ThroughputRun, answers: list[Answer], rounds: int) -> dict[tuple[str, int], MeasuredPlan]:
    """Each distinct (micro-batch, plan) of ``answers`` measured afresh in ``rounds`` interleaved rounds, each
    measurement recorded in the book as it arrives (``interleaved_rounds``); by (digest, micro-batch), on those
    measurements alone."""
    jobs = {(m.digest, b): Job(tuple(m.actions), b, m.source) for b, m in answers}
    return interleaved_rounds(run.measurer, jobs, rounds, record=True) if jobs else {}


def _fitting(run: ThroughputRun, cap: int, answers: list[Answer]) -> list[Answer]:
    """The ``answers`` that ran and whose measured peak (with what accumulating keeps) fits ``cap``."""
    return [(b, m) for b, m in answers if not m.oom and run.setup.counted(m.peak_bytes, b) <= cap]


def search_throughput(ctx: RunContext, run: ThroughputRun) -> None:
    """Steps 1-5 of the module docstring; the curve goes to the store (meta ``throughput``)."""
    if ctx.ledger.store.read(meta.THROUGHPUT) is not None:
        return  # a resumed run that finished it
    setup, phase = run.setup, ctx.clock.phase
    with phase("throughput: fit"):
        model = ThroughputModel(fitted(ctx, run), setup, solver_relative(ctx.ledger.codec.n_units))
        probe_ladder(ctx, run, model)
        model.extend(max(setup.caps), min(setup.global_batch or MAX_MICRO_BATCH, MAX_MICRO_BATCH))
    with phase("throughput: plans and peers"):
        pool, peers = plans_and_peers(ctx, run, model)
    with phase("throughput: candidates"):
        measure_candidates(ctx, run, model, pool)
    with phase("throughput: correctness gate"):
        finalists_of = passed_gate(ctx, {cap: finalists(run, cap, peers.get(cap, []), model) for cap in setup.caps})
    with phase("throughput: deciding"):
        answers = decide(run, finalists_of, model)
    with phase("throughput: quote"):
        quote_and_curve(ctx, run, model, answers, peers)

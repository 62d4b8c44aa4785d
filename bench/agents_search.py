"""The agents in the real search, quoted on fresh measurements: their own plans against the exact
solver's, the rules, and recomputing every unit an expert would name.

    python bench/agents_search.py                # every row below, ~2 h on 2 cores
    python bench/agents_search.py --rows 0 2     # some rows (indices into ROWS)
    python bench/agents_search.py --rows 4 5 --append   # and keep the other rows of the result file
    python bench/agents_search.py --quick        # gpt/tiny only, for the smoke test
    python bench/agents_search.py --reanalyse    # measure nothing: the rows' figures from their kept samples

Each row is one ``python -m search.run`` with its defaults (hybrid reward, 4 agents, 4,096
timesteps each, 30 + units/2 measurements) plus the row's flags, timed by the wall clock. Most rows run
``--no-warm-start``: the exact solver's plans are then never proposed or measured in the search,
and every plan the agents measure is their own find. Then, apart from the search (selection and
quote never share a measurement), one fresh Evaluator in this process measures, in ``--rounds``
interleaved rounds (``repeats`` timed steps each, the same for every plan; the i-th agent plan beside the
i-th exact plan, rounds forward and backward):

- the agents' own frontier: the non-dominated measured plans of the search that an agent proposed
  (on the times the search ranked them by: ``search.records.ranking.Ranking``);
- as many of the exact solver's plans (on the profiled cost model, as a planner that trusts the
  estimate would pick them), evenly spread over its frontier;
- the measured rules (none, all, every_2, every_3, sqrt_n, segments_2, all_selective);
- ``recompute every expert unit``: all-recompute over the units a person who read the model would
  name (every block; the expert sets of ``bench.workloads.EXPERT_UNITS``);
- the control: the exact plans once more, as records of their own. Identical plans, so the ratio of
  their hypervolumes (``control``) shows how far from 1 the quote's noise alone moves a ratio.

From the quote: the hypervolume of the agents' frontier over the exact plans' (baseline-normalised,
``search.records.pareto``); the quote's noise (``quote_noise``: how far identical plans' medians lie apart in the
control, 95th percentile); the rules that no agent plan weakly dominates, with how much slower the agents'
fastest plan at no more memory is, and those slower by more than the noise; at 20 budgets evenly from the
lowest quoted peak to the baseline's the agents' fastest fitting plan against the exact plans' (ratio;
where it lies beyond the noise); and at the expert plan's memory the agents' fastest fitting plan against
it. Then a second quote (``confirm``): each rule the first put beyond the noise is measured again beside
the agents' plan it lost to, in fresh rounds; it counts as beyond (``rules_beyond_confirmed``) only where
both quotes say so. All but the hypervolumes come from the quoted samples the result file keeps (``analyse``;
``--reanalyse`` computes them again without measuring). Clock: the search's (the measuring thread's CPU
time on CPU), named in each row with the machine's load and the commit it ran on; the result is
written after each row, and ``--append`` keeps the file's other rows (a replaced row goes to
``earlier_runs``, which BENCHMARKS.md lists as the rows' history).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.baselines import baseline_rules  # noqa: E402
from agents.exact import exact_frontier  # noqa: E402
from bench.common import BenchError, code_commit, machine_info, read_result, write_json  # noqa: E402
from bench.harness import Bench, Run, execute, parse  # noqa: E402
from env.data.rounds import serpentine  # noqa: E402
from bench.measuring import Ledger, check_equal_samples, evenly_mixed, hv_of, run_search  # noqa: E402
from bench.workloads import EXPERT_UNITS, USER_UNET  # noqa: E402
from env.cost.cost_model import CostModel  # noqa: E402
from env.data.codec import PlanCodec  # noqa: E402
from env.data.measured import MeasuredPlan  # noqa: E402
from env.data.model_profile import ModelProfile  # noqa: E402
from env.data.plan import Action  # noqa: E402
from env.data.types import MIB  # noqa: E402
from env.measure.measurement import measure as measure_plan  # noqa: E402
from env.runtime.apply import plan_for  # noqa: E402
from env.units.choice import resolve_units  # noqa: E402
from search.engine.archive import frontier_of, spread_picks  # noqa: E402
from search.engine.driver import RULES_MEASURED, exact_relative  # noqa: E402
from search.engine.evaluator import Evaluator  # noqa: E402
from search.records.store import RunStore  # noqa: E402

Plan = tuple[int, ...]
GPT_EXPERT = ("blocks.*",)


@dataclass(frozen=True)
class Row:
    flags: tuple[str, ...]
    expert: tuple[str, ...]  # globs of the units an expert would recompute


ROWS: tuple[Row, ...] = (
    Row(("--workload", "gpt/small", "--no-warm-start"), GPT_EXPERT),
    Row(("--workload", "gpt/small?n_layer=12", "--units", "sub-blocks"), GPT_EXPERT),
    Row(("--workload", "gpt/small?n_layer=12", "--units", "sub-blocks", "--no-warm-start"), GPT_EXPERT),
    Row(("--workload", "gpt/small?n_layer=24", "--units", "sub-blocks", "--no-warm-start"), GPT_EXPERT),
    *(Row(("--workload", r.spec, "--no-warm-start"), r.expert) for r in EXPERT_UNITS if r.spec != USER_UNET),
)
QUICK: tuple[Row, ...] = (
    Row(("--workload", "gpt/tiny", "--agents", "2", "--timesteps", "256", "--max-measurements", "12", "--no-warm-start"),
        GPT_EXPERT),
)
COVERAGE_BUDGETS = 20


@dataclass
class SearchOutcome:
    """What the quote needs from a finished search (read from its folder before it is removed)."""
    spec: str
    seed: int
    repeats: int
    threads: int
    profile: ModelProfile
    agents_front: list[Plan]  # the agents' own measured frontier, by the search's measurements
    lowest_peak: int  # lowest measured peak of the search (any plan)
    baseline_measurements: int  # how often the search measured the baseline (its references, when paired)
    paired: bool  # the search ranked plans on times paired with its references (``search.records.ranking.paired``)


def read_search(run_dir: Path) -> SearchOutcome:
    cfg = json.loads((run_dir / "config.json").read_text())
    with RunStore(run_dir, readonly=True) as store:
        prof = ModelProfile.model_validate(store.get_meta("profile"))
        base = store.baseline()
        rank = store.ranking()
        measured = [rank(m) for m in store.measured() if not m.oom]  # as the search ranked them
    codec = PlanCodec(prof.units, prof.actions, prof.fingerprint)
    mine = frontier_of([m for m in measured if any(s.startswith("agent") for s in m.sources)])
    return SearchOutcome(cfg["workload"], int(cfg["seed"]), int(cfg["repeats"]), int(cfg["measure_threads"]), prof,
                         [tuple(codec.indices(m.actions)) for m in mine], min(m.peak_bytes for m in measured),
                         base.n_measurements, base.has_references)


def exact_picks(prof: ModelProfile, k: int) -> tuple[list[Plan], int]:
    """``k`` plans evenly spread over the exact frontier of the profiled cost model, as the search solves it
    (all of them when it has fewer), and the frontier's size."""
    front = exact_frontier(CostModel(prof), relative=exact_relative(len(prof.units)))
    return spread_picks([tuple(p.plan) for p in front], k), len(front)


def quote(out: SearchOutcome, expert_globs: Sequence[str], rounds: int) -> dict[str, Any]:
    """Fresh interleaved measurements of the agents' frontier, the exact picks, the rules and the expert plan."""
    prof = out.profile
    ev = Evaluator(out.spec, out.seed, prof.units, prof.actions, out.repeats, "cpu", out.threads, name="quote")
    if list(ev.units) != list(prof.units):
        raise BenchError(f"{out.spec}: the quoting Evaluator resolved other units than the search's")
    ledger = Ledger(ev.evaluate, [Action(a) for a in prof.actions])
    rules = {k: tuple(v) for k, v in baseline_rules(len(prof.units), ledger.actions, seed=out.seed).items()
             if k in RULES_MEASURED}
    exact, exact_front = exact_picks(prof, len(out.agents_front))
    expert = resolve_units(ev.workload, list(expert_globs))
    expert_plan = plan_for(ev.workload.model, expert.units, [Action.RECOMPUTE] * len(expert.units))
    got: dict[str, MeasuredPlan] = {}

    def expert_once() -> None:
        m = measure_plan(ev.workload, expert_plan, expert.units, repeats=out.repeats, warmup=2, source="expert",
                    measurement_id=f"expert-{uuid.uuid4().hex[:8]}")
        got["expert"] = got["expert"].merged(m) if "expert" in got else m

    keep = rules["none"]
    ev.warm_up()  # as the search's Evaluators do: the first steps of a process are not quoted
    control = Ledger(ev.evaluate, ledger.actions)  # the exact plans once more, as records of their own

    def quoted(p: Plan) -> Callable[[], Any]:
        return lambda: ledger.measure(p, "quote", again=True)

    # each group spread evenly over a round (the i-th agent plan beside the i-th exact plan and its
    # copy when they are as many, both sorted by peak), rounds forward and backward: whatever drifts
    # over a round's minutes reaches the groups compared with each other alike
    agents_plans = list(dict.fromkeys(out.agents_front))  # each plan measured once a round, in its first group
    exact_plans = [p for p in dict.fromkeys(exact) if p not in agents_plans]
    others = [p for p in dict.fromkeys([keep, *rules.values()]) if p not in agents_plans and p not in exact_plans]
    jobs = evenly_mixed([quoted(p) for p in agents_plans], [quoted(p) for p in exact_plans],
                         [lambda p=p: control.measure(p, "quote:control", again=True) for p in exact],
                         [*(quoted(p) for p in others), expert_once])
    for r in range(rounds):
        for job in serpentine(jobs, r):
            job()
    samples = check_equal_samples([*ledger.records.values(), *control.records.values(), got["expert"]], out.spec)
    return {"evaluator": ev, "ledger": ledger, "control": control, "base": ledger.records[keep], "rules": rules,
            "exact": exact, "exact_front": exact_front,
            "expert": got["expert"], "expert_units": expert.units, "samples_per_plan": samples}


def confirm(q: dict[str, Any], agents: Sequence[Plan], quoted: dict[str, Any], found: dict[str, Any],
            rounds: int) -> dict[str, dict[str, Any]]:
    """The second quote: every rule the first put beyond the agents' frontier by more than its noise, with
    the agents' plan it was compared with (their fastest at no more memory, as the first quote ranked them),
    measured again by the same Evaluator in ``rounds`` fresh interleaved rounds, each as often as the other.
    The first quote chose these pairs out of 3-7 per row, so its verdict on them is a selection; a rule
    counts as beyond only where these measurements, apart from that selection, put it beyond the same
    band (``analyse``). Identical plans' medians still fall outside that band one time in twenty, so a
    row with several rules near the agents' plans shows one now and then whatever the agents do."""
    flagged = [n for n in found["rules_beyond_noise"] if found["rules_beyond_by"][n] is not None]
    if not flagged:
        return {}
    by_digest = {s["digest"]: p for s, p in zip(quoted["agents"], agents)}
    pairs = {n: (by_digest[_fastest(quoted["agents"], quoted["rules"][n]["peak_bytes"])["digest"]], q["rules"][n])
             for n in flagged}
    again = Ledger(q["evaluator"].evaluate, q["ledger"].actions)

    def job(p: Plan) -> Callable[[], Any]:
        return lambda: again.measure(p, "quote:confirm", again=True)

    jobs = evenly_mixed([job(p) for p in dict.fromkeys(a for a, _ in pairs.values())],
                        [job(p) for p in dict.fromkeys(r for _, r in pairs.values())])
    for r in range(rounds):
        for j in serpentine(jobs, r):
            j()
    check_equal_samples(list(again.records.values()), "the second quote")
    return {n: {"agents": _samples(again.records[a]), "rule": _samples(again.records[r])} for n, (a, r) in pairs.items()}


def control_summary(hv_first: float, control: Ledger, ledger: Ledger, exact: Sequence[Plan],
                    base: MeasuredPlan) -> dict[str, Any]:
    """The quote's own noise: the exact plans quoted twice, in the same rounds, as separate records.
    Their hypervolume ratio (copy / first; ``hv_first`` the first's) is what measurement alone does to a
    ratio of identical plans; per plan, the copy's time over the first's (``quote_noise`` takes its band)."""
    ratios = [control.records[p].step_seconds / ledger.records[p].step_seconds for p in exact]
    return {"hv_ratio": hv_of(control, exact, base) / hv_first if hv_first else None,
            "time_ratio_median": float(np.median(ratios)), "time_ratio_min": min(ratios),
            "time_ratio_max": max(ratios)}


NOISE_PERCENTILE = 95  # the control's band: identical plans' medians differ by less, 19 times in 20


def _median(p: dict[str, Any]) -> float:
    return float(np.median(p["step_seconds_samples"]))


def quote_noise(quoted: dict[str, Any]) -> float | None:
    """What the quote cannot tell apart: over the exact plans quoted twice (``control``), the
    ``NOISE_PERCENTILE``-th percentile of how far the copy's median step time lies from the first's
    (``|copy / first - 1|``). Identical plans measured in the same rounds: two plans whose times
    differ by less than this are, as far as the quote can say, equally fast. None before the control."""
    devs = [abs(_median(c) / _median(e) - 1.0) for e, c in zip(quoted.get("exact", []), quoted.get("control", []))]
    return float(np.percentile(devs, NOISE_PERCENTILE)) if devs else None


def beyond_noise(seconds: float, other: float, noise: float | None) -> bool | None:
    """Whether two quoted times differ by more than the quote's noise (None without a control)."""
    return None if noise is None else abs(seconds / other - 1.0) > noise


def _fastest(plans: Sequence[dict[str, Any]], budget: int) -> dict[str, Any] | None:
    """The quoted plan (``_samples`` form) with the lowest median step time whose peak fits the budget."""
    fits = [p for p in plans if p["peak_bytes"] <= budget]
    return min(fits, key=_median) if fits else None


def analyse(quoted: dict[str, Any]) -> dict[str, Any]:
    """Everything a row concludes from its quoted samples (``quoted``, as the result file keeps them),
    so that a row can be analysed again without measuring (``--reanalyse``):

    - ``rules_beyond_agents``: the rules no agent plan weakly dominates (no more memory, no more time);
    - ``rules_beyond_by``: for each, how much slower the agents' fastest plan at no more memory is
      (its median over the rule's, minus 1), None where no agent plan fits the rule's memory;
    - ``rules_beyond_noise``: those slower by more than ``quote_noise`` (or with nothing that fits);
    - with a second quote (``quoted["confirmation"]``, see ``confirm``): ``rules_confirmed_by``, for each
      rule it measured, the agents' plan's median over the rule's there, minus 1, and
      ``rules_beyond_confirmed``: the rules beyond the noise in both quotes (or with nothing that fits);
    - ``coverage``: at ``COVERAGE_BUDGETS`` budgets evenly from the lowest quoted peak to the
      baseline's, the agents' and the exact plans' fastest fitting plan, their ratio, and whether it
      lies beyond the noise."""
    noise = quote_noise(quoted)
    agents, exact, rules = quoted["agents"], quoted["exact"], quoted["rules"]
    by: dict[str, float | None] = {}
    for name, rule in rules.items():
        best = _fastest(agents, rule["peak_bytes"])
        if best is None:
            by[name] = None
        elif _median(best) > _median(rule):
            by[name] = _median(best) / _median(rule) - 1.0
    low = min(p["peak_bytes"] for p in [*agents, *exact, *rules.values()])
    cov = []
    for b in np.linspace(low, rules["none"]["peak_bytes"], COVERAGE_BUDGETS).round().astype(int).tolist():
        a, e = _fastest(agents, b), _fastest(exact, b)
        row: dict[str, Any] = {"budget_bytes": b, "agents_seconds": _median(a) if a else None,
                               "exact_seconds": _median(e) if e else None}
        if a and e:
            row["agents_over_exact"] = _median(a) / _median(e)
            row["beyond_noise"] = beyond_noise(_median(a), _median(e), noise)
        cov.append(row)
    far = [n for n, m in by.items() if m is None or (noise is not None and m > noise)]
    out = {"quote_noise": noise, "rules_beyond_agents": list(by), "rules_beyond_by": by, "rules_beyond_noise": far,
           "coverage": cov}
    if "confirmation" in quoted:
        again = {n: _median(c["agents"]) / _median(c["rule"]) - 1.0 for n, c in quoted["confirmation"].items()}
        out["rules_confirmed_by"] = again
        out["rules_beyond_confirmed"] = [n for n in far if by[n] is None or (n in again and again[n] > noise)]
    return out


def _samples(r: MeasuredPlan) -> dict[str, Any]:
    """A quoted plan's numbers as the result file keeps them: every figure can be computed again."""
    return {"digest": r.digest, "peak_bytes": r.peak_bytes, "step_seconds_samples": r.step_seconds_samples}


def run_row(row: Row, rounds: int, keep: Path | None = None) -> dict[str, Any]:
    flags = list(row.flags)
    with tempfile.TemporaryDirectory(prefix="bench_agents_") as tmp:
        folder = Path(tempfile.mkdtemp(prefix="run_", dir=keep)) if keep else Path(tmp)
        rep, wall = run_search(["--no-batch-scaling", "--peers", "none", *flags], out=folder)
        outcome = read_search(folder / "run")
    t0 = time.perf_counter()
    q = quote(outcome, row.expert, rounds)
    ledger, base, rules = q["ledger"], q["base"], q["rules"]
    agents, exact = outcome.agents_front, q["exact"]
    hv_a, hv_e = hv_of(ledger, agents, base), hv_of(ledger, exact, base)
    x = q["expert"]
    quoted = {"agents": [_samples(ledger.records[p]) for p in agents],
              "exact": [_samples(ledger.records[p]) for p in exact],
              "control": [_samples(q["control"].records[p]) for p in exact],
              "rules": {name: _samples(ledger.records[p]) for name, p in rules.items()}, "expert": _samples(x)}
    found = analyse(quoted)
    t1 = time.perf_counter()
    quoted["confirmation"] = confirm(q, agents, quoted, found, rounds)
    found = analyse(quoted)
    confirm_seconds = time.perf_counter() - t1
    at_expert = _fastest(quoted["agents"], x.peak_bytes)
    at_expert_seconds = _median(at_expert) if at_expert else None
    spreads = [r.spread_seconds / r.step_seconds for r in ledger.records.values()]
    hv = rep["hypervolume"]
    out = {
        "flags": " ".join(flags), "workload": rep["workload"], "units": rep["units"], "measured": rep["measured"],
        "evaluations": rep["evaluations"], "wall_seconds": wall, "clock": base.clock,
        "search_paired": outcome.paired, "search_baseline_measurements": outcome.baseline_measurements,
        "warm_start": "--no-warm-start" not in flags,
        "search": {"hv_frontier": hv["frontier"], "hv_agents_own": hv["agents_only"],
                   "agents_over_exact": hv["agents_over_exact"], "lowest_peak_mb": outcome.lowest_peak / MIB},
        "baseline": {"peak_mb": base.peak_bytes / MIB, "step_seconds": base.step_seconds},
        "quote": {"rounds": rounds, "samples_per_plan": q["samples_per_plan"], "plans": len(ledger.records) + 1,
                  "control_plans": len(q["control"].records),
                  "agents_plans": len(agents), "exact_plans": len(exact),
                  "exact_frontier_plans": q["exact_front"], "wall_seconds": time.perf_counter() - t0,
                  "second_quote_seconds": confirm_seconds,
                  "median_relative_spread": float(np.median(spreads))},
        "hv_agents_own": hv_a, "hv_exact_measured": hv_e, "agents_over_exact": hv_a / hv_e if hv_e else None,
        "control": control_summary(hv_e, q["control"], ledger, exact, base),
        "lowest_peak_mb": min(ledger.records[p].peak_bytes for p in agents) / MIB,
        **found,
        "expert": {"units": len(q["expert_units"]), "peak_mb": x.peak_bytes / MIB, "step_seconds": x.step_seconds,
                   "spread_seconds": x.spread_seconds,
                   "agents_peak_mb": at_expert["peak_bytes"] / MIB if at_expert else None,
                   "agents_seconds": at_expert_seconds,
                   "agents_spread_seconds": (max(at_expert["step_seconds_samples"]) - min(at_expert["step_seconds_samples"])
                                             if at_expert else None),
                   "agents_over_expert": at_expert_seconds / x.step_seconds if at_expert_seconds else None},
        "quoted": quoted,
        "load_average_1": os.getloadavg()[0], "commit": code_commit(),
        "run_dir": str(folder / "run") if keep else None,
    }
    print(f"{out['flags']}: {out['units']} units, agents/exact {out['agents_over_exact']}, rules beyond "
          f"{found['rules_beyond_by']} (beyond the quote's noise {found['quote_noise']}: {found['rules_beyond_noise']}; "
          f"in the second quote {found['rules_confirmed_by']}: {found['rules_beyond_confirmed']}), "
          f"at the expert's memory {out['expert']['agents_over_expert']}, the exact plans against themselves "
          f"{out['control']['hv_ratio']}, search {wall:.0f} s", file=sys.stderr)
    return out


STALE_KEYS = ("rules_beyond_agents_by_more_than_spread", "rules_beyond_margin")  # what rows analysed before kept


def reanalyse(path: Path) -> int:
    """Analyse again every row of the result file that kept its quoted samples (``analyse``); the
    measurements, the machine and the date stay as they were. Returns how many rows were."""
    result = read_result(path)
    done = 0
    for row in result["rows"]:
        if row.get("quoted"):
            for key in STALE_KEYS:
                row.pop(key, None)
            row.get("control", {}).pop("beyond_spread", None)
            row.update(analyse(row["quoted"]))
            done += 1
    result["reanalysed_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json(path, result)
    return done


def measure(run: Run) -> None:
    args = run.args
    table = QUICK if args.quick else tuple(ROWS[i] for i in (args.rows or range(len(ROWS))))
    run.result["machine_at_start"] = machine_info()
    for row in table:
        run.add_row(run_row(row, args.rounds, args.keep))  # written after every row: a long run keeps what it did


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rows", type=int, nargs="+", help="indices into ROWS (default all)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved quoting rounds over the plans")
    ap.add_argument("--keep", type=Path, help="keep each search's run folder under this folder (to inspect it)")
    ap.add_argument("--reanalyse", action="store_true",
                    help="measure nothing: analyse again the rows of the result file that kept their quoted samples")


BENCH = Bench("agents_search", __doc__, options, rows="rows", row_id=lambda r: r["flags"], quick={"rounds": 1})


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(BENCH, argv)
    if args.reanalyse:
        path = args.out or Run(BENCH, args).path
        print(f"{reanalyse(path)} rows analysed again: {path}")
        return
    execute(BENCH, measure, args)


if __name__ == "__main__":
    main()

"""Search quality at equal numbers of measured plans: PPO agents, random, NSGA-II, rules, exact.

    python bench/search_quality.py                       # gpt, cnn, lstm, user: ~5 min each on 2 cores
    python bench/search_quality.py --workloads gpt --measurements 24
    python bench/search_quality.py --quick               # tiny sizes, for the smoke test

For each workload, in one process and through one ``search.engine.evaluator.Evaluator`` (one
measurement function, one cache):

1. the search service (``search.engine.driver.Driver``, as ``python -m search.run --reward hybrid
   --no-warm-start --peers none --max-measurements M``): K PPO agents; it measures the baseline rules it
   always shows (7 on gpt/tiny's 5 units), then the agents' candidates, up to M plans in all;
2. random search: M distinct plans, each unit's action uniform;
3. NSGA-II (``optuna.samplers.NSGAIISampler``): one categorical per unit, objectives measured
   peak bytes and step seconds, M trials;
4. the rules of ``agents.baselines`` (none, all, every n, sqrt(n), segments, all selective);
5. the yardstick: the exact solver's frontier on the profile, each plan measured.

Then every method's frontier plans and the baseline are measured once more (interleaved, so
load that changed over the run falls on all alike), and each method's hypervolume is computed
from all its plans' merged records on the ``search.records.pareto`` axes. Reported per method: the
hypervolume, its ratio to the measured exact frontier's, the evaluations after which it first
reached 99% of that, and for the agents whether any rule lies beyond their own plans'
frontier, with a verdict in words. Each measurement is ``--repeats`` timed steps by the
Evaluator's clock (the measuring thread's CPU time, ``--threads`` torch threads); each workload's
row records the machine and its load. ``--append`` (or ``--merge``) keeps the file's other workloads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.baselines import baseline_rules  # noqa: E402
from agents.exact import exact_frontier  # noqa: E402
from bench.common import machine_info  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from bench.measuring import Ledger, front_of, hv_of, point_row, random_plans  # noqa: E402
from bench.workloads import workload_specs  # noqa: E402
from env.cost.cost_model import CostModel  # noqa: E402
from env.data.measured import MeasuredPlan  # noqa: E402
from search.engine import ray_session  # noqa: E402
from search.engine.driver import Driver, prepare  # noqa: E402
from search.engine.evaluator_pool import EvaluatorPool  # noqa: E402
from search.engine.ledger import Ledger as SearchLedger  # noqa: E402
from search.records.config import SearchConfig  # noqa: E402
from search.records.pareto import hypervolume  # noqa: E402
from search.records.store import RunStore  # noqa: E402

Plan = tuple[int, ...]
TARGET = 0.99  # agents / exact hypervolume the search aims for


class TracedLedger(SearchLedger):
    """The search service's ledger, noting the order in which it measures new plans."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order: dict[str, tuple[tuple[str, ...], str]] = {}  # digest -> (action names, source), in order

    def record(self, m: MeasuredPlan) -> MeasuredPlan:
        if m.digest not in self.order:
            self.order[m.digest] = (tuple(m.actions), m.source)
        return super().record(m)


@dataclass
class SearchRun:
    """A finished search: its driver (agents, evaluator) and traced ledger."""

    driver: Driver
    ledger: TracedLedger


@dataclass
class Method:
    """One method's evaluations in the order it asked for them (a repeat counts again)."""

    name: str
    asked: list[Plan]
    note: str = ""


def nsga2(ledger: Ledger, n_units: int, count: int, population: int, seed: int) -> list[Plan]:
    """NSGA-II over one categorical per unit; measured (peak, seconds) both minimised."""
    try:
        import optuna
    except ImportError:
        raise SystemExit("search_quality.py: NSGA-II needs optuna (the bench extra); install it with "
                         "pip install -e '.[bench]'") from None

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = [a.value for a in ledger.actions]
    sampler = optuna.samplers.NSGAIISampler(population_size=population, seed=seed)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    asked: list[Plan] = []
    for _ in range(count):
        trial = study.ask()
        plan = tuple(names.index(trial.suggest_categorical(f"unit_{i}", names)) for i in range(n_units))
        rec = ledger.measure(plan, "nsga2")
        study.tell(trial, [float(rec.peak_bytes), rec.step_seconds])
        asked.append(plan)
    return asked


def run_search(spec: str, args: argparse.Namespace, run_root: Path) -> SearchRun:
    cfg = SearchConfig(workload=spec, agents=args.agents, timesteps=args.timesteps, reward="hybrid",
                       actions=["keep", "recompute", "selective"],  # random plans and NSGA-II draw per-unit actions
                       max_measurements=args.measurements, repeats=args.repeats, warm_start=False,
                       batch_scaling=False, out=str(run_root), name=spec.replace("/", "-").replace(":", "-")[:40],
                       seed=args.seed, measure_threads=args.threads, chunk_timesteps=args.chunk_timesteps,
                       progress=False, peers="none").validate()  # peers' plans are no method's evaluations
    run_dir = run_root / cfg.name
    run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(run_dir / "store.sqlite")
    store.set_meta("config", json.loads(cfg.to_json()))
    pool = EvaluatorPool(cfg)
    ledger = TracedLedger(prepare(store, pool), store)
    driver = Driver(cfg, run_dir, ledger, pool)
    driver.run()
    return SearchRun(driver, ledger)


def curve(ledger: Ledger, asked: Sequence[Plan], base: MeasuredPlan) -> list[float]:
    """Hypervolume after each evaluation (final records)."""
    return [hv_of(ledger, asked[:k], base) for k in range(1, len(asked) + 1)]


def first_reaching(values: Sequence[float], target: float) -> int | None:
    return next((k + 1 for k, v in enumerate(values) if v >= target), None)


def rules_beyond(ledger: Ledger, rules: dict[str, Plan], agents: Sequence[Plan], base: MeasuredPlan) -> list[dict[str, Any]]:
    """Rules no agent plan weakly dominates, each with the agents' best time at its memory."""
    out = []
    for name, plan in rules.items():
        r = ledger.records[plan]
        if any(ledger.records[a].peak_bytes <= r.peak_bytes and ledger.records[a].step_seconds <= r.step_seconds
               for a in agents):
            continue
        fit = [ledger.records[a].step_seconds for a in agents if ledger.records[a].peak_bytes <= r.peak_bytes]
        out.append({"rule": name, "peak_ratio": r.peak_bytes / base.peak_bytes,
                    "time_ratio": r.step_seconds / base.step_seconds,
                    "agents_time_ratio_at_that_memory": min(fit) / base.step_seconds if fit else None})
    return out


def spread(plans: Sequence[Plan], k: int) -> list[Plan]:
    """At most ``k`` of ``plans`` evenly spaced (ends kept), in order."""
    if len(plans) <= k:
        return list(plans)
    return [plans[i] for i in sorted(set(np.linspace(0, len(plans) - 1, k).round().astype(int)))]


def measure_methods(search: SearchRun, args: argparse.Namespace) -> tuple[Ledger, list[Method], dict[str, Plan]]:
    """Every method's plans measured through the search's own Evaluator."""
    traced, ev = search.ledger, search.driver.pool.first
    prof, codec = traced.setup.profile, traced.codec
    ledger = Ledger(lambda names, src, again: ray_session.get(ev.evaluate.remote(names, src, again)), prof.actions)
    n, n_actions = len(prof.units), len(prof.actions)
    run = [(codec.indices(names), src) for names, src in traced.order.values()]
    for (plan, _), digest in zip(run, traced.order):
        ledger.adopt(plan, traced.archive.measured[digest])
    rules = {k: tuple(v) for k, v in baseline_rules(n, prof.actions, seed=args.seed).items()
             if not k.startswith("random")}
    n_rules = sum(s.startswith("rule:") for _, s in run)
    methods = [Method("agents (search run)", [p for p, _ in run],
                      f"{n_rules} of its plans are rules the search always measures"),
               Method("agents' own plans", [p for (p, s), d in zip(run, traced.order)
                                            if any(x.startswith("agent") for x in traced.archive.measured[d].sources)])]
    rand = random_plans(n, n_actions, args.measurements, args.seed)
    for p in rand:
        ledger.measure(p, "random")
    methods.append(Method("random", rand))
    population = max(2, min(args.population, args.measurements))
    methods.append(Method("NSGA-II", nsga2(ledger, n, args.measurements, population, args.seed),
                          f"population {population}"))
    for name, p in rules.items():
        ledger.measure(p, f"rule:{name}")
    methods.append(Method("rules", list(rules.values())))
    exact = [tuple(p.plan) for p in exact_frontier(CostModel(prof))]
    chosen = spread(exact, args.max_exact)
    for p in chosen:
        ledger.measure(p, "exact")
    methods.append(Method("exact (measured)", chosen, f"{len(chosen)} of the {len(exact)} points the exact solver "
                                                      "finds on the profile"))
    return ledger, methods, rules


def remeasure(ledger: Ledger, methods: list[Method], base_plan: Plan) -> None:
    """One more measurement of the baseline and every method's frontier plans."""
    base = ledger.records[base_plan]
    todo = [base_plan] + [p for m in methods for p in front_of(ledger, m.asked, base)]
    for p in dict.fromkeys(todo):
        ledger.measure(p, "remeasure", again=True)



def method_rows(ledger: Ledger, methods: list[Method], base: MeasuredPlan) -> dict[str, dict[str, Any]]:
    exact_hv = hv_of(ledger, methods[-1].asked, base)
    n_agents = len(methods[0].asked)
    rows = {}
    for m in methods:
        hvs = curve(ledger, m.asked, base)
        hv = hvs[-1] if hvs else 0.0
        rows[m.name] = {
            "evaluations": len(m.asked), "distinct_plans": len(set(m.asked)), "hypervolume": hv,
            "ratio_to_exact": hv / exact_hv if exact_hv else None,
            "evaluations_to_99pct_of_exact": first_reaching(hvs, TARGET * exact_hv),
            "hypervolume_at_agents_evaluations": hvs[min(n_agents, len(hvs)) - 1] if hvs and n_agents else None,
            "hypervolume_curve": hvs, "note": m.note,
            "frontier": [point_row(ledger, p, base) for p in front_of(ledger, m.asked, base)],
        }
    return rows


def verdict(rows: dict[str, dict[str, Any]], beyond: list[dict[str, Any]], n_plans: int, m: int) -> list[str]:
    """Plain statements about who won and, where the agents did not, the facts that explain it."""
    agents = rows["agents (search run)"]
    best = max((k for k in rows if not k.startswith("exact")), key=lambda k: rows[k]["hypervolume"])
    out = [f"highest hypervolume among the searches: {best} ({rows[best]['hypervolume']:.4f})"]
    ratio = agents["ratio_to_exact"]
    if ratio is not None:
        out.append(f"agents / exact = {ratio:.3f}: target {TARGET} {'met' if ratio >= TARGET else 'NOT met'}")
    for other in ("random", "NSGA-II", "rules"):
        if rows[other]["hypervolume"] > agents["hypervolume"]:
            out.append(f"{other} beat the agents ({rows[other]['hypervolume']:.4f} vs {agents['hypervolume']:.4f})")
    if agents["evaluations"] < m:
        out.append(f"the search measured {agents['evaluations']} plans, fewer than the {m} allowed: it measures only "
                   "plans the (corrected) cost model predicts non-dominated, and had no more")
    exact = rows["exact (measured)"]["hypervolume"]
    if exact and rows[best]["hypervolume"] > 1.05 * exact:
        out.append(f"{best} beats the exact solver's plans, measured, by {rows[best]['hypervolume'] / exact - 1:.0%}: "
                   "the cost model's optimal frontier is not the measured one here")
        if not best.startswith("agents"):
            out.append("the agents learn on the cost model, corrected by the few plans measured; "
                       f"{best} sees only measurements, so it is not misled where the model is wrong")
    if m >= 0.25 * n_plans:
        out.append(f"{m} measurements cover {m / n_plans:.0%} of the {n_plans} plans: random search samples the "
                   "space densely here, which favours it")
    if beyond:
        out.append("rules beyond the agents' own frontier: " + ", ".join(b["rule"] for b in beyond))
    else:
        out.append("no rule lies beyond the agents' own frontier")
    return out


def evaluate_workload(label: str, spec: str, args: argparse.Namespace, run_root: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    search = run_search(spec, args, run_root)
    search_s = time.perf_counter() - t0
    try:
        ledger, methods, rules = measure_methods(search, args)
        remeasure(ledger, methods, rules["none"])
    finally:
        import ray

        for slot in search.driver.agents.slots:
            if slot.handle is not None:
                ray.kill(slot.handle)
        for e in search.driver.pool.slots:
            ray.kill(e.handle)
        search.ledger.store.close()
    prof = search.ledger.setup.profile
    base = ledger.records[rules["none"]]
    rows = method_rows(ledger, methods, base)
    beyond = rules_beyond(ledger, rules, methods[1].asked + [rules["none"]], base)
    n_plans = len(prof.actions) ** len(prof.units)
    cm = CostModel(prof)
    exact_pred = [(p.peak_bytes / cm.peak_bytes(rules["none"]), p.step_seconds / cm.step_seconds(rules["none"]))
                  for p in exact_frontier(cm)]
    return {
        "label": label, "workload": spec, "batch_shape": prof.batch_shape, "n_units": len(prof.units),
        "actions": [a.value for a in prof.actions], "plans_in_space": n_plans,
        "baseline": point_row(ledger, rules["none"], base),
        "exact_predicted_hypervolume": hypervolume(exact_pred),
        "methods": rows, "rules_beyond_agents_frontier": beyond,
        "verdict": verdict(rows, beyond, n_plans, args.measurements),
        "new_measurements": ledger.new_measurements + search.ledger.n_new_measurements,
        "search_seconds": search_s, "wall_seconds": time.perf_counter() - t0,
        "events": search.ledger.events, "machine": machine_info(),
    }


def measure(run: Run) -> None:
    args = run.args
    import ray

    os.environ["OMP_NUM_THREADS"] = "1"
    ray_session.start_ray(num_cpus=max(os.cpu_count() or 1, args.agents))  # a logical CPU per agent
    run.result["target_ratio"] = TARGET
    try:
        with tempfile.TemporaryDirectory(prefix="search_quality_") as tmp:
            for label, spec in workload_specs(args.workloads, args.quick).items():
                row = evaluate_workload(label, spec, args, Path(tmp))
                print(f"{label} ({spec}): " + "; ".join(row["verdict"]), file=sys.stderr)
                run.add_row(row)
    finally:
        ray.shutdown()


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=["gpt", "cnn", "lstm", "user"],
                    help="gpt, cnn, lstm, user (bench sizes, see bench/workloads.py) or any workload spec")
    ap.add_argument("--measurements", type=int, default=24, help="measured plans per method (search: rules included)")
    ap.add_argument("--agents", type=int, default=4, help="PPO agents of the search")
    ap.add_argument("--timesteps", type=int, default=4096, help="env steps per agent")
    ap.add_argument("--chunk-timesteps", type=int, default=1024, help="agent steps between measurement rounds")
    ap.add_argument("--population", type=int, default=8,
                    help="NSGA-II population (M trials make M / population generations)")
    ap.add_argument("--max-exact", type=int, default=24, help="most exact-frontier plans measured (evenly spread)")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--merge", dest="append", action="store_true", help="the same as --append")


BENCH = Bench("search_quality", __doc__, options, threads=1, rows="workloads", row_id=lambda r: r["label"],
              quick={"measurements": 8, "agents": 2, "timesteps": 128, "chunk_timesteps": 64, "population": 4,
                     "max_exact": 6, "repeats": 1})

if __name__ == "__main__":
    main(BENCH, measure)

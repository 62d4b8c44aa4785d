"""Budget-conditioned agents against the exact frontier at 6 to 96 units, on the cost model.

    python bench/agents_scale.py                  # layered 6, 24, 48, 96 units + the gpt profile (~6 min)
    python bench/agents_scale.py --sizes 6 24     # quicker
    python bench/agents_scale.py --quick          # 6 and 12 units, hybrid at 12, no comparison (seconds)

Profiles: ``bench.synthetic.layered_profile(n, 0)`` (units of random kinds and sizes: the exact
frontier has hundreds to thousands of points) and ``bench/profiles/gpt_small_12_subblock.json``
(``env.measure.profiler.profile`` of ``gpt/small?n_layer=12`` at sub-block units, 48 units, recorded on
this machine's CPU with one torch thread by::

    w = load_workload("gpt/small?n_layer=12")
    profile(w, find_units(w.model, "sub-block"), repeats=3, baseline=False).model_dump_json(indent=1)

). For each: ``--agents`` agents (``agents.ppo.PPOAgent``), agent k covering
the k-th slice of the budgets from the lowest reachable peak to the baseline's, each trained
``--chunks`` chunks of ``--chunk-episodes`` episodes of PPO after cloning the exact solver's
plans (as the driver would run them, one after another here; on 2 cores the driver runs two
at once). Reported, all on the cost model:

- ``hv_ratio``: hypervolume of every plan the agents reported over the reference frontier's
  (``search.records.pareto`` convention: axes over the all-keep plan, reference (1.1, 2.0)); the
  reference is the exact frontier up to 64 units, beyond that ``exact_frontier(relative=0.001)``
  (its hypervolume is at most the exact one's, so the ratio there is an upper bound);
- ``coverage``: at 20 budgets evenly spread from the lowest reachable peak to the baseline's,
  the step time of the agents' fastest plan that fits over the reference's;
- ``rules_beyond``: rules of ``agents.baselines`` that no agent plan weakly dominates;
- ``train_seconds``: wall time of all the agents' training (cloning, PPO, reporting).

``--compare`` (48 layered units): PPO without cloning for ``--scratch-timesteps`` steps in all
(the search's default, 4 x 4096), one budget-conditioned agent and four one-budget agents
(the design this replaced, with this env's observations). ``--hybrid``
(``--hybrid-units``, 48): the search's hybrid loop against a "measured" model whose recompute and
selective times differ per unit from the profile's (0.5x..2x): after each chunk the 10
agents' plans predicted best are "measured" and fed back with ``observe``; the agents' plans
are then judged on the measured model against its exact frontier, beside the exact plans of
the uncorrected profile (a warm start without correction).

Nothing is measured on the model: every figure but the training seconds is a cost-model prediction,
and those are by the wall clock (``time.perf_counter``) with one torch thread, on whatever else the
machine does (its load is recorded with the result).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.baselines import baseline_rules  # noqa: E402
from agents.exact import FrontierPoint, exact_frontier, pareto_points  # noqa: E402
from agents.ppo import AgentConfig, PPOAgent, budget_slices  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from bench.synthetic import layered_profile  # noqa: E402
from env.cost.cost_model import CostModel  # noqa: E402
from env.data.model_profile import ModelProfile  # noqa: E402
from env.data.plan import Action  # noqa: E402
from search.records.pareto import hypervolume, normalise  # noqa: E402

GPT_PROFILE = Path(__file__).resolve().parent / "profiles" / "gpt_small_12_subblock.json"
EXACT_MAX_UNITS = 64
Point = tuple[int, float]


def reference(cm: CostModel) -> tuple[list[FrontierPoint], str, float]:
    t0 = time.perf_counter()
    if cm.n_units <= EXACT_MAX_UNITS:
        return exact_frontier(cm), "exact", time.perf_counter() - t0
    return exact_frontier(cm, relative=0.001), "exact_frontier(relative=0.001)", time.perf_counter() - t0


def baseline(cm: CostModel) -> Point:
    keep = [cm.action_index(Action.KEEP)] * cm.n_units
    return cm.peak_bytes(keep), cm.step_seconds(keep)


def hv(points: Sequence[Point], base: Point) -> float:
    return hypervolume(normalise(points, *base))


def coverage(points: Sequence[Point], ref: Sequence[FrontierPoint], base: Point, n_budgets: int = 20) -> list[float]:
    """At budgets evenly spread from the reference's lowest peak to the baseline's: the fastest
    fitting point's seconds over the reference's (inf if nothing fits)."""
    out = []
    for b in np.linspace(ref[0].peak_bytes, base[0], n_budgets):
        best = min(p.step_seconds for p in ref if p.peak_bytes <= b)
        fits = [s for peak, s in points if peak <= b]
        out.append(min(fits) / best if fits else float("inf"))
    return out


def rules_beyond(cm: CostModel, points: Sequence[Point]) -> dict[str, float]:
    """Rules no point weakly dominates, with the step-time excess (over the baseline's) of the
    fastest point within the rule's peak."""
    base = baseline(cm)
    out = {}
    for name, plan in baseline_rules(cm.n_units, cm.profile.actions, seed=0).items():
        peak, seconds = cm.peak_bytes(plan), cm.step_seconds(plan)
        fits = [s for p, s in points if p <= peak]
        excess = (min(fits) - seconds) / base[1] if fits else float("inf")
        if excess > 0:
            out[name] = excess
    return out


def train_agents(prof: ModelProfile, n_agents: int, chunks: int, chunk_episodes: int, seed: int,
                 config: AgentConfig | None = None, budgets: Sequence[Any] | None = None) -> dict[str, Any]:
    """Agents over the budget slices (or the given budgets), trained one after another."""
    n = len(prof.units)
    slices = budgets if budgets is not None else budget_slices(n_agents)
    plans: dict[tuple[int, ...], Point] = {}
    clone_only: dict[tuple[int, ...], Point] = {}
    per_agent = []
    t_all = time.perf_counter()
    for k, budget in enumerate(slices):
        t0 = time.perf_counter()
        agent = PPOAgent(f"agent_{k}", prof, budget, seed=seed + k, reward_mode="model", config=config)
        first = agent.train(0)
        clone_only.update({tuple(p["actions"]): (p["peak_bytes"], p["step_seconds"]) for p in first["plans"]})
        reports = [first] + [agent.train(chunk_episodes * n) for _ in range(chunks)]
        for r in reports:
            plans.update({tuple(p["actions"]): (p["peak_bytes"], p["step_seconds"]) for p in r["plans"]})
        per_agent.append({"budget": dataclasses.asdict(budget) if dataclasses.is_dataclass(budget) else budget, "seconds": time.perf_counter() - t0, "clone": first["clone"],
                          "timesteps": reports[-1]["timesteps"], "episodes": reports[-1]["episodes"]})
    return {"plans": plans, "clone_only": clone_only, "agents": per_agent, "seconds": time.perf_counter() - t_all}


def judge(cm: CostModel, ref: Sequence[FrontierPoint], plans: dict[tuple[int, ...], Point]) -> dict[str, Any]:
    base = baseline(cm)
    points = list(plans.values())
    ref_hv = hv([(p.peak_bytes, p.step_seconds) for p in ref], base)
    cov = coverage(points, ref, base)
    front = pareto_points([(p, s, k) for k, (p, s) in plans.items()])
    return {"hv_ratio": hv(points, base) / ref_hv, "plans": len(plans), "frontier_points": len(front),
            "coverage": cov, "coverage_mean": float(np.mean(cov)), "coverage_max": float(np.max(cov)),
            "rules_beyond": rules_beyond(cm, points)}


def scale_row(label: str, prof: ModelProfile, args: argparse.Namespace) -> dict[str, Any]:
    cm = CostModel(prof)
    ref, kind, ref_seconds = reference(cm)
    run = train_agents(prof, args.agents, args.chunks, args.chunk_episodes, args.seed)
    row = {"profile": label, "n_units": cm.n_units, "reference": kind, "reference_points": len(ref),
           "reference_seconds": ref_seconds, "agents": args.agents, "train_seconds": run["seconds"],
           "per_agent": run["agents"], **judge(cm, ref, run["plans"]),
           "clone_only_hv_ratio": judge(cm, ref, run["clone_only"])["hv_ratio"]}
    print(f"{label}: {cm.n_units} units, HV {row['hv_ratio']:.4f} of the {kind} frontier ({len(ref)} points), "
          f"coverage mean {row['coverage_mean']:.4f} max {row['coverage_max']:.4f}, rules beyond "
          f"{len(row['rules_beyond'])}, training {row['train_seconds']:.1f} s", file=sys.stderr)
    return row


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """At 48 layered units: cloning against PPO alone, budget-conditioned and one agent per budget."""
    prof = layered_profile(48, 0)
    cm = CostModel(prof)
    ref, _, _ = reference(cm)
    scratch = AgentConfig(clone_updates=0, learning_rate=3e-4, ent_coef=0.01, clip_range=0.2)
    lo, hi = ref[0].peak_bytes, baseline(cm)[0]
    chunks = args.scratch_timesteps // (args.chunk_episodes * 48)  # PPO alone: the search's default steps in all
    rows = []
    for name, kw in [
        ("cloned, budget-conditioned", {"n_agents": args.agents, "chunks": args.chunks}),
        ("PPO alone, budget-conditioned", {"n_agents": 1, "chunks": chunks, "config": scratch}),
        ("PPO alone, one agent per budget (4)", {"n_agents": 4, "chunks": chunks // 4, "config": scratch,
                                                 "budgets": [int(lo + (hi - lo) * i / 3) for i in range(4)]}),
    ]:
        run = train_agents(prof, kw.pop("n_agents"), kw.pop("chunks"), args.chunk_episodes, args.seed, **kw)
        rows.append({"design": name, "train_seconds": run["seconds"],
                     "timesteps": sum(a["timesteps"] for a in run["agents"]), **judge(cm, ref, run["plans"])})
        print(f"{name}: HV {rows[-1]['hv_ratio']:.4f}, coverage mean {rows[-1]['coverage_mean']:.4f}, "
              f"{rows[-1]['train_seconds']:.1f} s", file=sys.stderr)
    return rows


def measured_model(prof: ModelProfile, seed: int) -> ModelProfile:
    """The profile with each unit's recompute and selective extra backward seconds scaled by
    0.5x..2x (log-uniform): a stand-in for measurements that disagree with the profile per unit."""
    rng = np.random.default_rng(seed)
    costs = {a: [c.model_copy(deep=True) for c in prof.costs[a]] for a in prof.actions}
    for a in (Action.RECOMPUTE, Action.SELECTIVE):
        for i, c in enumerate(costs[a]):
            keep_bwd = prof.costs[Action.KEEP][i].bwd.seconds
            c.bwd.seconds = keep_bwd + (c.bwd.seconds - keep_bwd) * float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))
    return prof.model_copy(update={"costs": costs})


def hybrid(args: argparse.Namespace, per_round: int = 10) -> dict[str, Any]:
    """The driver's hybrid loop on a stand-in measured model; see the module docstring."""
    n_units = args.hybrid_units
    prof = layered_profile(n_units, 0)
    truth = CostModel(measured_model(prof, seed=1))
    ref, _, _ = reference(truth)
    base = baseline(truth)
    agents = [PPOAgent(f"agent_{k}", prof, b, seed=args.seed + k, reward_mode="hybrid")
              for k, b in enumerate(budget_slices(args.agents))]
    keep = tuple([0] * n_units)
    measured: dict[tuple[int, ...], Point] = {keep: (truth.peak_bytes(keep), truth.step_seconds(keep))}
    for a in agents:
        a.observe([(list(keep), *measured[keep])])
    rounds = []
    t0 = time.perf_counter()
    plans: dict[tuple[int, ...], Point] = {}
    for r in range(args.chunks + 1):
        reports = [a.train(0 if r == 0 else args.chunk_episodes * n_units) for a in agents]
        new = {tuple(p["actions"]) for rep in reports for p in rep["plans"]}
        plans.update({k: (truth.peak_bytes(k), truth.step_seconds(k)) for k in new})
        rounds.append({"round": r, "measured": len(measured), **{k: v for k, v in judge(truth, ref, plans).items()
                                                                  if k in ("hv_ratio", "coverage_mean")}})
        print(f"hybrid round {r}: {len(measured)} measured, HV {rounds[-1]['hv_ratio']:.4f}, coverage mean "
              f"{rounds[-1]['coverage_mean']:.4f} (on the measured model)", file=sys.stderr)
        predicted = agents[0].env.correction.predict  # every agent's correction has the same measurements
        front = pareto_points([(*predicted(k), k) for k in new if k not in measured])
        picks = [front[round(j)].plan for j in np.linspace(0, len(front) - 1, min(per_round, len(front)))] if front else []
        fed = [(list(k), truth.peak_bytes(k), truth.step_seconds(k)) for k in picks]
        measured.update({tuple(k): (p, s) for k, p, s in fed})
        for a in agents:
            a.observe(fed)
    uncorrected = {p.plan: (truth.peak_bytes(p.plan), truth.step_seconds(p.plan)) for p in exact_frontier(CostModel(prof), relative=0.005)}
    return {"n_units": n_units, "per_round": per_round, "rounds": rounds, "seconds": time.perf_counter() - t0,
            "final": judge(truth, ref, plans), "uncorrected_exact_plans": judge(truth, ref, uncorrected),
            "baseline": base}


def measure(run: Run) -> None:
    args = run.args
    rows = [scale_row(f"layered-{n}", layered_profile(n, 0), args) for n in args.sizes]
    if args.gpt and GPT_PROFILE.is_file():
        rows.append(scale_row("gpt/small?n_layer=12 sub-block", ModelProfile.model_validate_json(GPT_PROFILE.read_text()),
                              args))
    run.result["rows"] = rows
    if args.compare:
        run.result["compare_48"] = compare(args)
    if args.hybrid:
        run.result["hybrid"] = hybrid(args)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=int, nargs="*", default=[6, 24, 48, 96], help="layered profile sizes")
    p.add_argument("--agents", type=int, default=2, help="agents, one budget slice each")
    p.add_argument("--chunks", type=int, default=2, help="PPO chunks per agent after cloning")
    p.add_argument("--chunk-episodes", type=int, default=16, help="episodes per chunk (timesteps = this x units)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scratch-timesteps", type=int, default=4 * 4096,
                   help="--compare: PPO steps, all agents together, without cloning (the search's default: 4 x 4096)")
    p.add_argument("--gpt", action=argparse.BooleanOptionalAction, default=True, help="the recorded gpt profile too")
    p.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hybrid", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hybrid-units", type=int, default=48, help="--hybrid: the layered profile's units")


# one torch thread: the agents' small MLPs, as in a Ray actor with one CPU
BENCH = Bench("agents_scale", __doc__, options, threads=1,
              quick={"sizes": [6, 12], "gpt": False, "compare": False, "hybrid_units": 12, "chunks": 1})

if __name__ == "__main__":
    main(BENCH, measure)

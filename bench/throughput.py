"""The fastest way to train on the memory you have: the throughput search against what users do.

    python bench/throughput.py                   # gpt/small, hf/llama, cnn/small, diffusers/unet2d; grid on gpt/small
    python bench/throughput.py --quick           # gpt/tiny, a small grid and agents (smoke test)
    python bench/throughput.py --workloads cnn/small --grid --append   # one more workload beside the others
    python bench/throughput.py --device cuda     # on a GPU (bench/gpu.py runs it)

For each workload:

1. Caps: ``1.2 x`` the lowest reachable peak at the workload's default batch (the lower of the exact
   solver's lowest-memory plan and recompute everything, measured), the no-checkpointing peak at the
   default batch, and ``2 x`` that.
2. ``python -m search.run --memory-cap <caps>`` (its wall time): per cap our answer and the peers (no
   checkpointing, recompute everything, every n-th unit, transformers' checkpointing on zoo models,
   ``checkpoint_sequential``), each at the largest micro-batch it fits, as the run quoted them
   (measured again after the choice, in interleaved rounds).
3. The grid (gpt/small; ``--grid`` names others): every micro-batch of the search's ladder x the exact
   frontier there (on the run's fitted cost model, at most ``--grid-plans`` spread over it), each
   measured once in this process; per cap the grid's best measured (plan, micro-batch) that fits, then
   it and our answer measured again side by side in ``--rounds`` interleaved rounds: ours / grid (where our
   answer is the grid's best, the same plan at the same micro-batch, it is quoted once: 1.00x, not the noise
   between two quotes of one configuration).
   On gpt/small (``--against-default``) the same search without caps runs first: the wall time a
   throughput search adds.
4. ``--agents``: the design choice, on the run's fitted cost model: one budget-conditioned agent per
   ladder micro-batch (``agents.batch_agents``, what the search runs) against one agent conditioned on
   the micro-batch too (``agents.batch_conditioned``), at equal PPO steps; per cap the predicted samples
   per second of each design's best (plan, micro-batch) against the model-optimal one, and training time.
   ``--agents-layered 24 48`` does the same on synthetic layered models of that many units.

Writes ``bench/results/throughput.json`` after every workload, with the machine and its load.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Bench, Run, main  # noqa: E402
from env.data.rounds import interleaved  # noqa: E402
from bench.measuring import check_equal_samples, run_search  # noqa: E402
from env.data.measured import MeasuredPlan, within_spreads  # noqa: E402
from env.data.plan import Action  # noqa: E402
from env.data.types import MIB  # noqa: E402

DEFAULT_WORKLOADS = ["gpt/small", "hf/llama", "cnn/small", "diffusers/unet2d"]
SEARCH = ["--peers", "eager", "--no-batch-scaling"]
QUICK_SEARCH = ["--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128", "--max-measurements", "10",
                "--repeats", "1", "--throughput-timesteps", "64", "--peers", "none", "--no-batch-scaling"]


def caps_for(spec: str, device: str, repeats: int) -> dict[str, int]:
    """The three caps (bytes) from the workload's default batch, measured here (module docstring, step 1)."""
    from agents.exact import exact_frontier
    from env.cost.cost_model import CostModel
    from env.measure.measurement import measure, warm_up
    from env.measure.profiler import profile
    from env.runtime.apply import plan_for
    from env.units.choice import resolve_units
    from env.workloads.workload import load_workload

    w = load_workload(spec, device=device)
    units = resolve_units(w, ["auto"], 32).units
    prof = profile(w, units, repeats=1, baseline=False, check=False)
    cm = CostModel(prof)
    lowest = [prof.actions[a] for a in exact_frontier(cm)[0].plan]
    warm_up(w)
    peaks = {name: measure(w, plan_for(w.model, prof.units, acts), prof.units, repeats=repeats).peak_bytes
             for name, acts in (("lowest", lowest), ("all", [Action.RECOMPUTE] * len(units)),
                                ("none", [Action.KEEP] * len(units)))}
    low = min(peaks["lowest"], peaks["all"])
    return {"1.2 x lowest": int(1.2 * low), "no checkpointing": peaks["none"],
            "2 x no checkpointing": 2 * peaks["none"]}


def search(spec: str, caps: dict[str, int], device: str, flags: Sequence[str], folder: Path) -> dict[str, Any]:
    """One throughput search; its curve as quoted and its wall time (module docstring, step 2)."""
    cap_flags = ["--memory-cap", *(f"{c / MIB:.3f}" for c in caps.values())]
    report, wall = run_search(["--workload", spec, "--device", device, *cap_flags, *flags], out=folder)
    return search_row(report, "python -m search.run " + " ".join(["--workload", spec, *cap_flags, *flags]), wall)


def search_row(report: dict[str, Any], command: str, wall: float) -> dict[str, Any]:
    """A throughput search's report.json as a result row: per cap our answer, the peers, as the run quoted them."""
    curve = report["throughput"]
    rows = []
    for row in curve["caps"]:
        answer = row["answer"]
        rows.append({"cap_bytes": row["cap_bytes"], "answer": answer, "selected": row["selected"],
                     "model_optimal": row["model_optimal"], "peers": [p for p in row["quote"] if p["name"] != "ours"],
                     "unfit": row["unfit"], "why": row["why"], "by_proposer": row.get("by_proposer", {}),
                     "ours_over_best_peer": _over_best(answer, row["quote"])})
    return {"command": command, "wall_seconds": wall, "clock": report["clock"], "micro_batches": curve["micro_batches"],
            "default_micro_batch": curve["default_micro_batch"], "fit_checks": curve["fit_checks"],
            "quote_rounds": curve["quote_rounds"], "caps": rows, "load_average_1": os.getloadavg()[0],
            "phase_seconds": report.get("phase_seconds", {})}


def _over_best(answer: dict[str, Any] | None, quote: list[dict[str, Any]]) -> float | None:
    peers = [p["samples_per_second"] for p in quote if p["name"] != "ours"]
    return answer["samples_per_second"] / max(peers) if answer and peers and max(peers) > 0 else None


def _run_facts(run_dir: Path) -> tuple[Any, list[str], list[Action], Any]:
    """The run's fit in the micro-batch, its units and actions, and its throughput curve."""
    from env.cost.batch_fit import BatchFit
    from search.records import meta
    from search.records.store import RunStore

    with RunStore(run_dir, readonly=True) as store:
        own, others, curve = store.read(meta.PROFILE), store.read(meta.THROUGHPUT_PROFILES), store.read(meta.THROUGHPUT)
    fit = BatchFit({curve.default_micro_batch: own, **others})
    return fit, list(own.units), list(own.actions), curve


def grid(spec: str, run_dir: Path, device: str, repeats: int, plans_per_batch: int, rounds: int) -> dict[str, Any]:
    """Every ladder micro-batch x the exact frontier there, measured; per cap its best against ours, quoted
    side by side (module docstring, step 3)."""
    from agents.exact import exact_frontier
    from env.measure.measurement import warm_up
    from env.measure.micro_batch import AtMicroBatch
    from env.workloads.workload import load_workload
    from search.engine.archive import spread_picks

    fit, units, actions, curve = _run_facts(run_dir)
    w = load_workload(spec, device=device)
    at = AtMicroBatch(w, units, actions, repeats)
    warm_up(w)
    names = [a.value for a in actions]
    t0, measured, ids = time.perf_counter(), {}, itertools.count()
    for b in curve.micro_batches:
        for p in spread_picks([tuple(x.plan) for x in exact_frontier(fit.cost_model(b))], plans_per_batch):
            measured[(p, b)] = at.measure([names[a] for a in p], b, None, "grid", f"grid:{next(ids)}")
    rows = []
    for row in curve.caps:
        fits = [(k, m) for k, m in measured.items() if not m.oom and m.peak_bytes <= row.cap_bytes]
        if not fits or row.answer is None:
            rows.append({"cap_bytes": row.cap_bytes, "grid_best": None})
            continue
        (plan, b), best = max(fits, key=lambda km: km[0][1] / km[1].step_seconds)
        ours = [row.answer.plan[u].value for u in units]
        same = ours == [names[a] for a in plan] and row.answer.micro_batch == b  # one configuration: quoted once
        jobs: dict[str, Callable[[], MeasuredPlan]] = {
            "grid": lambda: at.measure([names[a] for a in plan], b, None, "quote", f"quote:{next(ids)}")}
        if not same:
            jobs["ours"] = lambda: at.measure(ours, row.answer.micro_batch, None, "quote", f"quote:{next(ids)}")
        got = interleaved(jobs, rounds)
        check_equal_samples(list(got.values()), spec)
        size = {"ours": row.answer.micro_batch, "grid": b}
        rate = {k: size[k] / m.step_seconds for k, m in got.items()}
        spread = {k: m.spread_seconds for k, m in got.items()}  # seconds a step, across the quote's samples
        rate.setdefault("ours", rate["grid"])
        spread.setdefault("ours", spread["grid"])
        rows.append({"cap_bytes": row.cap_bytes, "grid_best": {"micro_batch": b, "plan": [names[a] for a in plan],
                                                               "peak_bytes": best.peak_bytes,
                                                               "selected_samples_per_second": b / best.step_seconds,
                                                               "quoted_samples_per_second": rate["grid"],
                                                               "quoted_spread_seconds": spread["grid"]},
                     "ours": {"micro_batch": row.answer.micro_batch, "quoted_samples_per_second": rate["ours"],
                              "quoted_spread_seconds": spread["ours"]},
                     "same_configuration": same, "ours_over_grid": rate["ours"] / rate["grid"],
                     "within_spreads": same or within_spreads(
                         *((got[k].step_seconds, size[k], got[k].spread_seconds) for k in ("ours", "grid")))})
    return {"plans_measured": len(measured), "plans_per_batch": plans_per_batch, "rounds": rounds,
            "wall_seconds": time.perf_counter() - t0, "caps": rows, "load_average_1": os.getloadavg()[0]}


def agents_compared(fit: Any, ladder: Sequence[int], caps: Sequence[int], timesteps: int) -> dict[str, Any]:
    """Per-micro-batch agents against one micro-batch-conditioned agent on a fitted cost model (module
    docstring, step 4): per cap, the predicted samples/s of each design's best (plan, micro-batch) over the
    ladder against the exact solver's, and each design's training time."""
    from agents.batch_agents import MicroBatchAgents
    from agents.batch_conditioned import MicroBatchConditionedAgent
    from agents.throughput import exact_frontiers, model_optimal, ranked

    profiles = {b: fit.profile_at(b) for b in ladder}
    budgets = {b: list(caps) for b in ladder}
    same = lambda peak, b: peak  # noqa: E731  the fitted model's own peaks
    frontiers = exact_frontiers(fit.cost_model, ladder)
    out: dict[str, Any] = {"timesteps_per_micro_batch": timesteps, "micro_batches": list(ladder), "designs": {}}
    for design in ("one agent per micro-batch", "one agent conditioned on the micro-batch"):
        t0 = time.perf_counter()
        if design.startswith("one agent per"):
            agent: Any = MicroBatchAgents(profiles, budgets)
            agent.train(timesteps)
            n_agents = len(agent.agents)
        else:
            agent = MicroBatchConditionedAgent(profiles, budgets)
            n_agents = 1
            agent.train(timesteps * len(agent.env.envs))
        plans = agent.plans(budgets)
        seconds = time.perf_counter() - t0
        rows = []
        for cap in caps:
            best = model_optimal(frontiers, cap, same)
            mine = ranked([p for ps in plans.values() for p in ps], fit.cost_model, ladder, cap, same)
            got = mine[0].samples_per_second if mine else 0.0
            rows.append({"cap_bytes": cap, "model_optimal": best.samples_per_second if best else None,
                         "design": got, "regret": (1 - got / best.samples_per_second) if best else None})
        out["designs"][design] = {"agents": n_agents, "train_seconds": seconds, "caps": rows}
    return out


def agents_on_run(run_dir: Path, timesteps: int) -> dict[str, Any]:
    """The designs on a throughput run's fitted cost model, its ladder and its caps."""
    fit, _, _, curve = _run_facts(run_dir)
    return agents_compared(fit, curve.micro_batches, [r.cap_bytes for r in curve.caps], timesteps)


def agents_on_layered(n_units: int, timesteps: int) -> dict[str, Any]:
    """The designs on ``bench.synthetic.layered_profile(n_units, 0)`` (units of random kinds and sizes, many
    more frontier points than a stack of equal blocks) as micro-batch 1 and the same model 8x as large as
    micro-batch 8, its step 4x as long (a fixed part: without one, samples per second would not change with
    the micro-batch); the ladder 1, 2, 4, 8, and a cap halfway between the lowest reachable peak and all
    keep's at each of 2, 4 and 8."""
    from env.cost.batch_fit import BatchFit
    from env.cost.headroom import lowest_and_keep_peak
    from env.data.model_profile import ModelProfile
    from bench.synthetic import layered_profile

    one, big = layered_profile(n_units, 0), layered_profile(n_units, 0, hidden_bytes=8 * 262_144)
    data, small = big.model_dump(mode="json"), one.model_dump(mode="json")
    for name in ("pre", "post", "tail"):
        data[name]["seconds"] = 4 * small[name]["seconds"]
    for a, costs in data["costs"].items():
        for c, s in zip(costs, small["costs"][a]):
            c["fwd"]["seconds"], c["bwd"]["seconds"] = 4 * s["fwd"]["seconds"], 4 * s["bwd"]["seconds"]
    fit = BatchFit({1: one, 8: ModelProfile.model_validate(data)})
    caps = [sum(lowest_and_keep_peak(fit.profile_at(b))) // 2 for b in (2, 4, 8)]
    return {"units": n_units, **agents_compared(fit, [1, 2, 4, 8], caps, timesteps)}


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    ap.add_argument("--grid", nargs="*", default=["gpt/small"], help="workloads that get the measured grid")
    ap.add_argument("--grid-plans", type=int, default=8, help="exact frontier plans measured per micro-batch")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the grid's quote")
    ap.add_argument("--agents", action="store_true", help="also compare the two agent designs (step 4)")
    ap.add_argument("--agent-timesteps", type=int, default=2048, help="PPO steps per micro-batch in --agents")
    ap.add_argument("--agents-layered", type=int, nargs="*", default=[],
                    help="also compare the agent designs on synthetic layered models of these many units")
    ap.add_argument("--against-default", nargs="*", default=["gpt/small"],
                    help="workloads whose default search (the same flags, no caps) runs just before, for the wall time")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per measurement (caps, grid)")
    ap.add_argument("--budget-seconds", type=float, default=0, help="start no workload after this long (0: none)")
    ap.add_argument("--search", nargs=argparse.REMAINDER, default=[], help="further search.run flags")


BENCH = Bench("throughput", __doc__, options=options, threads=1, rows="workloads", row_id=lambda r: r["workload"],
              quick={"workloads": ["gpt/tiny"], "grid": ["gpt/tiny"], "against_default": [], "grid_plans": 3,
                     "rounds": 1, "repeats": 1, "agents": True, "agent_timesteps": 64})


def measure(run: Run) -> None:
    args = run.args
    run.device = args.device
    flags = [*(QUICK_SEARCH if args.quick else SEARCH), *args.search]
    t0 = time.perf_counter()
    for spec in args.workloads:
        if args.budget_seconds and time.perf_counter() - t0 > args.budget_seconds:
            run.result["skipped"] = run.result.get("skipped", []) + [spec]
            continue
        caps = caps_for(spec, args.device, args.repeats)
        with tempfile.TemporaryDirectory(prefix="bench_throughput_") as tmp:
            row: dict[str, Any] = {"workload": spec, "caps": list(caps)}
            if spec in args.against_default:  # the same search without caps, just before: what a user waits less
                _, row["default_wall_seconds"] = run_search(["--workload", spec, "--device", args.device, *flags],
                                                            out=Path(tmp) / "default")
            row["search"] = search(spec, caps, args.device, flags, Path(tmp))
            run_dir = Path(tmp) / "run"
            if spec in args.grid:
                row["grid"] = grid(spec, run_dir, args.device, args.repeats, args.grid_plans, args.rounds)
            if args.agents:
                row["agents"] = agents_on_run(run_dir, args.agent_timesteps)
        run.add_row(row)
        print(f"{spec}: {row['search']['wall_seconds']:.0f} s", file=sys.stderr)
    if args.agents_layered:
        run.result["agents_layered"] = [agents_on_layered(n, args.agent_timesteps) for n in args.agents_layered]


if __name__ == "__main__":
    main(BENCH, measure)

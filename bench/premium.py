"""The checkpointing premium per architecture: memory saved against step time paid, measured.

    python bench/premium.py                    # gpt (default size), hf/llama, a ResNet-style cnn, hf/resnet50, lstm
    python bench/premium.py --workloads gpt --device cuda
    python bench/premium.py --saving activation   # targets on activation memory instead of the peak
    python bench/premium.py --quick            # tiny sizes, for the smoke test

For each workload, through one ``search.engine.evaluator.Evaluator`` in this process: the baseline
(every unit kept), every unit recomputed, every unit selective, the rules of
``agents.baselines``, and the searched plans: the exact solver's frontier on the profile (up to
``--max-exact`` spread over it, plus the four predicted fastest near each target), then, as the
search's hybrid mode does, the exact frontier on the profile corrected by all those measurements
(``env.cost.correction``: per-unit times fitted to the measured plans), each measured. For 30%,
50% and 70% saving of the peak (``--saving peak``, the default) or of the activation memory
(``--saving activation``) the searched plan is the fastest measured exact-frontier plan reaching
at least that saving (or "unreachable"), chosen on those selection measurements.

The tables quote none of the selection measurements: every quoted plan (the baseline, the
uniform plans, every rule and the searched plan per target) is then measured ``--rounds`` times
afresh, interleaved (the order rotates each round), ``--repeats`` timed steps each, and every
quoted number comes from these alone, so the searched plan has exactly as many as each rule it is
compared with (``check_equal_measurements``) and is not the luckiest of many noisy samples.
Clock: the Evaluator's (the measuring thread's CPU time on CPU with ``--threads`` torch threads;
``torch.cuda.synchronize``-bounded wall time on CUDA), named in each row; the machine's load is
recorded with the result. Savings are of the total peak and of the activation part (peak minus
what is live before the step: parameters, gradients, AdamW state, inputs), which is what
checkpointing acts on. Beside them, the commonly cited figures (``CITED``) and whether each holds
here; at 50% saving, the searched plan's step time against every rule reaching that saving.

The default workloads: the transformer at the built-in default size (``gpt``: 6 blocks, d=384,
batch 8x256), ``hf/llama``, a ResNet-style CNN of 3 stages x 6 blocks (the cited CNN figures are
for deep ResNets; at 2 blocks a stage the stem's full-resolution backward bounds the peak and no
plan saves 50%), ``hf/resnet50`` and the LSTM at its bench size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.baselines import baseline_rules  # noqa: E402
from agents.exact import exact_frontier  # noqa: E402
from bench.common import BenchError  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from env.data.rounds import rotated  # noqa: E402
from bench.measuring import Ledger, point_row  # noqa: E402
from bench.workloads import workload_specs  # noqa: E402
from env.cost.correction import MeasuredCorrection  # noqa: E402
from env.cost.cost_model import CostModel  # noqa: E402
from env.data.measured import MeasuredPlan  # noqa: E402
from env.data.model_profile import ModelProfile  # noqa: E402
from env.data.plan import Action  # noqa: E402
from search.engine.evaluator import Evaluator  # noqa: E402

Plan = tuple[int, ...]
TARGETS = (0.3, 0.5, 0.7)  # saving (of the peak, or of the activations) the searched plans must reach
DEFAULT_WORKLOADS = ["gpt=gpt", "llama=hf/llama", "cnn=cnn/small?image_size=96&batch_size=32&blocks_per_stage=6",
                     "resnet50=hf/resnet50", "lstm"]
QUICK_WORKLOADS = ["gpt", "cnn", "lstm"]
ARCHITECTURE = {"gpt": "transformer", "llama": "transformer", "cnn": "cnn", "resnet50": "cnn", "lstm": "rnn"}
# (activation memory saved %, step-time cost %), low-high, as commonly cited for checkpointing
CITED: dict[str, dict[str, Any]] = {
    "transformer": {"plan": "all", "saving_pct": (65, 75), "slowdown_pct": (20, 30)},
    "cnn": {"plan": "all", "saving_pct": (50, 60), "slowdown_pct": (15, 25)},
    "rnn": {"plan": "all", "saving_pct": (40, 50), "slowdown_pct": (10, 20)},
    "selective": {"plan": "all_selective", "saving_pct": (50, 60), "slowdown_pct": (10, 15)},
}


def compare(value_pct: float, low: float, high: float, lower_is_better: bool) -> str:
    """'in range', or above/below it with whether that is better or worse than cited."""
    if low <= value_pct <= high:
        return "in range"
    above = value_pct > high
    better = above != lower_is_better
    return f"{'above' if above else 'below'} ({'better' if better else 'worse'})"


def cited_check(row: dict[str, Any], cited: dict[str, Any]) -> dict[str, Any]:
    """Measured activation saving and slowdown of a plan against a cited (saving, cost) claim."""
    saving, slowdown = 100 * row["activation_saving"], 100 * row["slowdown"]
    mem = compare(saving, *cited["saving_pct"], lower_is_better=False)
    cost = compare(slowdown, *cited["slowdown_pct"], lower_is_better=True)
    holds = "better" in mem or mem == "in range"
    holds = holds and ("better" in cost or cost == "in range")
    return {"cited_saving_pct": list(cited["saving_pct"]), "cited_slowdown_pct": list(cited["slowdown_pct"]),
            "measured_activation_saving_pct": saving, "measured_peak_saving_pct": 100 * row["peak_saving"],
            "measured_slowdown_pct": slowdown, "memory": mem, "time": cost, "holds": holds}


def saving_of(ledger: Ledger, plan: Plan, base: MeasuredPlan, kind: str) -> float:
    """The measured saving of ``plan`` against ``base``: of the peak, or of the activations."""
    return point_row(ledger, plan, base)[f"{kind}_saving"]


def fastest_reaching(ledger: Ledger, plans: Sequence[Plan], base: MeasuredPlan, target: float, kind: str,
                     k: int = 1) -> list[Plan]:
    """The ``k`` fastest measured plans whose saving (``kind``) is at least ``target``."""
    ok = [p for p in plans if saving_of(ledger, p, base, kind) >= target]
    return sorted(ok, key=lambda p: ledger.records[p].step_seconds)[:k]


def searched_plans(cm: CostModel, max_exact: int, kind: str, per_target: int = 4) -> list[Plan]:
    """Exact-frontier plans to measure: at most ``max_exact`` spread over the frontier, plus per
    target the ``per_target`` predicted fastest whose predicted saving (``kind``) is within 5
    points of it (the profile's prediction is close, not exact)."""
    front = exact_frontier(cm)
    keep_peak = cm.peak_bytes([cm.action_index(Action.KEEP)] * cm.n_units)
    floor = 0 if kind == "peak" else cm.profile.base_bytes
    saving = {tuple(p.plan): 1 - (p.peak_bytes - floor) / (keep_peak - floor) for p in front}
    step = max(1, -(-len(front) // max_exact))  # ceil: every step-th point, both ends kept
    chosen = [tuple(p.plan) for p in front[::step]] + [tuple(front[-1].plan)]
    for t in TARGETS:
        near = sorted((p for p in front if saving[tuple(p.plan)] >= t - 0.05), key=lambda p: p.step_seconds)
        chosen += [tuple(p.plan) for p in near[:per_target]]
    return list(dict.fromkeys(chosen))


def measure_all(ledger: Ledger, prof: ModelProfile, max_exact: int, seed: int,
                kind: str) -> tuple[dict[str, Plan], list[Plan]]:
    """Rules (incl. none/all/all_selective) and the searched plans, each measured once."""
    rules = {k: tuple(v) for k, v in baseline_rules(len(prof.units), prof.actions, seed=seed).items()
             if not k.startswith("random")}
    for name, p in rules.items():
        ledger.measure(p, f"rule:{name}")
    exact = searched_plans(CostModel(prof), max_exact, kind)
    for p in exact:
        ledger.measure(p, "exact")
    return rules, exact


def measure_corrected(ledger: Ledger, prof: ModelProfile, max_exact: int, kind: str) -> list[Plan]:
    """The search's hybrid step: the exact frontier on the cost model corrected by every
    measurement so far (``env.cost.correction``), its plans near each target measured too."""
    correction = MeasuredCorrection(CostModel(prof))
    for plan, rec in ledger.records.items():
        correction.add(plan, rec.peak_bytes, rec.step_seconds)
    plans = searched_plans(correction.corrected_model(), max(2, max_exact // 2), kind)
    for p in plans:
        ledger.measure(p, "exact-corrected")
    return plans


def quote(selection: Ledger, rules: dict[str, Plan], exact: list[Plan], rounds: int,
          kind: str) -> tuple[Ledger, dict[str, Plan]]:
    """A fresh ledger of the quoted plans (baseline, rules, the searched plan per target, chosen on
    the selection measurements), each measured ``rounds`` times anew, interleaved."""
    base = selection.records[rules["none"]]
    searched = {t: best[0] for t in TARGETS if (best := fastest_reaching(selection, exact, base, t, kind))}
    quoted = list(dict.fromkeys([rules["none"], *rules.values(), *searched.values()]))
    fresh = Ledger(selection.evaluate, selection.actions)  # records of quoting measurements only
    for r in range(rounds):
        for p in rotated(quoted, r):
            fresh.measure(p, "quote", again=True)
    return fresh, {f"{round(100 * t)}%": p for t, p in searched.items()}


def check_equal_measurements(row: dict[str, Any]) -> None:
    """Refuse a result whose quoted searched plan has fewer measurements than a rule it is compared with."""
    rules = {name: r["n_measurements"] for name, r in row["rules"].items()}
    for key, t in row["targets"].items():
        if t["reachable"] and t["searched"]["n_measurements"] < max(rules.values()):
            raise BenchError(f"{row['label']}: the searched plan at {key} has {t['searched']['n_measurements']} "
                             f"measurements, the rules up to {max(rules.values())}; quote plans measured alike")


def at_targets(ledger: Ledger, rules: dict[str, Plan], searched: dict[str, Plan], reach: float,
               base: MeasuredPlan, kind: str) -> dict[str, Any]:
    """Per target: the searched plan (quoting measurements), or why there is none, and the rules against it."""
    out: dict[str, Any] = {}
    for t in TARGETS:
        key = f"{round(100 * t)}%"
        if key not in searched:
            out[key] = {"reachable": False, "max_searched_saving": reach}
            continue
        row = point_row(ledger, searched[key], base)
        versus = {}
        for name, p in rules.items():
            r = point_row(ledger, p, base)
            versus[name] = {"reaches": r[f"{kind}_saving"] >= t, "saving": r[f"{kind}_saving"],
                            "time_ratio_to_searched": r["step_seconds"] / row["step_seconds"]}
        out[key] = {"reachable": True, "searched": row, "rules": versus}
    return out


def premium_row(label: str, spec: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    ev = Evaluator(spec, args.seed, [], ["keep", "recompute", "selective"], args.repeats, args.device,
                   args.threads)
    prof = ModelProfile.model_validate(ev.profile())
    ledger = Ledger(ev.evaluate, prof.actions)
    rules, exact = measure_all(ledger, prof, args.max_exact, args.seed, args.saving)
    exact = list(dict.fromkeys(exact + measure_corrected(ledger, prof, args.max_exact, args.saving)))
    selection_base = ledger.records[rules["none"]]
    reach = max(saving_of(ledger, p, selection_base, args.saving) for p in exact)
    frontier = [point_row(ledger, p, selection_base) for p in exact]  # selection measurements
    selection_measurements = ledger.new_measurements
    ledger, searched = quote(ledger, rules, exact, args.rounds, args.saving)
    base = ledger.records[rules["none"]]
    uniform = {name: point_row(ledger, rules[name], base) for name in ("none", "all", "all_selective")}
    arch = ARCHITECTURE.get(label)
    cited = {}
    if arch:
        cited[arch] = cited_check(uniform["all"], CITED[arch])
    cited["selective"] = cited_check(uniform["all_selective"], CITED["selective"])
    return {
        "label": label, "architecture": arch or label, "workload": spec, "batch_shape": prof.batch_shape,
        "n_units": len(prof.units), "device": ev.device, "baseline": uniform["none"],
        "saving": args.saving, "uniform": uniform,
        "targets": at_targets(ledger, rules, searched, reach, base, args.saving), "cited": cited,
        "searched_frontier_selection": frontier,
        "rules": {name: point_row(ledger, p, base) for name, p in rules.items()},
        "selection_measurements": selection_measurements, "quoting_measurements": ledger.new_measurements,
        "quoting_rounds": args.rounds, "clock": base.clock, "wall_seconds": time.perf_counter() - t0,
    }


def measure(run: Run) -> None:
    args = run.args
    workloads = args.workloads or (QUICK_WORKLOADS if args.quick else DEFAULT_WORKLOADS)
    run.result.update({"targets": list(TARGETS), "cited": CITED, "workloads": []})
    for label, spec in workload_specs(workloads, args.quick).items():
        row = premium_row(label, spec, args)
        print(f"{label} ({spec}): all recompute saves {row['uniform']['all']['activation_saving']:.0%} of activations "
              f"for {row['uniform']['all']['slowdown']:+.0%}", file=sys.stderr)
        check_equal_measurements(row)
        run.device = row["device"]
        run.result["workloads"].append(row)
        run.save()  # after every workload: a long run keeps what it did


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+",
                    help="gpt, cnn, lstm (bench sizes, see bench/workloads.py), label=spec or any workload spec "
                         f"(default: {' '.join(DEFAULT_WORKLOADS)}; with --quick {' '.join(QUICK_WORKLOADS)})")
    ap.add_argument("--saving", choices=["peak", "activation"], default="peak",
                    help="what the 30/50/70%% targets save: the whole peak, or the activation memory")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per measurement")
    ap.add_argument("--rounds", type=int, default=2,
                    help="fresh interleaved measurements of every quoted plan (selection measurements are not quoted)")
    ap.add_argument("--max-exact", type=int, default=12,
                    help="exact-frontier plans measured spread over the frontier (plus 4 near each target)")
    ap.add_argument("--seed", type=int, default=0)


BENCH = Bench("premium", __doc__, options, quick={"repeats": 1, "rounds": 1, "max_exact": 4}, threads=1)

if __name__ == "__main__":
    main(BENCH, measure)

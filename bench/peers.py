"""Side by side with what users pick instead: the peers, selected in the search's own run, quoted apart.

    python bench/peers.py                                   # gpt, cnn, hf/llama, diffusers/unet2d, eager
    python bench/peers.py --workloads gpt/tiny --compile    # compiled training steps
    python bench/peers.py --compile --search --compile-scope both  # ours compiled by units or whole, as found
    python bench/peers.py --workloads hf/llama --append     # and keep the file's other workloads
    python bench/peers.py --quote-only                      # quote the file's searches again
    python bench/peers.py --gradients-only                  # check the file's peers' gradients again
    python bench/peers.py --quick                           # gpt/tiny, two budgets (smoke test)
    python bench/peers.py --run runs/gpt-20261207-020000    # quote a search run already made (bench/gpu.py)
    python bench/peers.py --default --workloads gpt/small --rounds 5  # the README's first command, its verdicts quoted

For each workload, one ``python -m search.run --peers all``: its Evaluator measures the searched
plans and the peers (torch.compile's ``activation_memory_budget`` and PyTorch's auto-SAC at ``--budgets``,
transformers' checkpointing every 1-4 layers on HF models, ``checkpoint_sequential`` on chains, torchtitan's
policies on blocks). From that run's
measurements (selection), for every peer: our fastest frontier plan at no more memory. Then the
quote, apart from the search (selection and quote never share a measurement): one fresh Evaluator
in this process (warmed up as the search's are) measures the baseline, every peer and every
selected plan of ours ``--rounds`` times, interleaved with the order rotated each round, each
with the search's timed steps, so every quoted plan has exactly as many samples
(``check_equal_samples``). The table quotes these medians, their spreads (max - min of the
samples) and the ratio of step times (peer / ours; above 1: ours is faster), and says where the
difference is within the two spreads. Each quoted peer's gradients are checked against the
unplanned model's (``env.measure.peers.gradient_error``, dropout on): a peer that changes them
(torch 2.13's compile budgets below 1.0 on a model with dropout, pytorch/pytorch#190758) is shown
with its times but does not count as faster than ours. Clock: the search's (the measuring
thread's CPU time on CPU), named in each row; each quote records the machine's load beside it. The
quote and the gradient check run on the device the search measured on (its ``config.json``'s
``--device``), and a quote whose device model differs from the search's is refused.
An auto-SAC peer's entry also holds its own estimates of its peak and recompute time beside the measured ones
(``auto_sac``). The result (``peers_compiled`` with ``--compile``) is written after each workload.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BenchError, code_commit, read_result, write_json  # noqa: E402
from bench.harness import Bench, Run, main  # noqa: E402
from env.data.rounds import interleaved  # noqa: E402
from bench.measuring import check_equal_samples, run_search  # noqa: E402
from bench.views.peers import compile_budgets  # noqa: E402
from env.data.measured import MeasuredPlan, compare_times  # noqa: E402
from env.data.plan import action_summary  # noqa: E402
from env.measure.compiled import CompileOptions  # noqa: E402
from env.measure.peer_installs import auto_sac_plan  # noqa: E402
from env.measure.peers import GRADIENT_TOLERANCE, Peer, PeerKind, gradient_error, peers_for  # noqa: E402
from env.runtime.chains import training_step  # noqa: E402
from env.workloads.workload import load_workload  # noqa: E402
from search.engine.evaluator import Evaluator, resolve_device  # noqa: E402
from search.records import meta  # noqa: E402
from search.records.config import SearchConfig  # noqa: E402
from search.records.store import RunStore  # noqa: E402

DEFAULT_WORKLOADS = ["gpt/small", "cnn/small", "hf/llama", "diffusers/unet2d"]
ALL_KINDS = [k.value for k in PeerKind]
SEARCH_SETTINGS = ("seed", "repeats", "measure_threads", "compile_scope", "device")  # what the quote takes from it


def search(workload: str, budgets: Sequence[float], compiled: bool, extra: Sequence[str],
           default: bool = False) -> dict[str, Any]:
    """One search with every peer kind (``--peers all`` at ``budgets``), or with ``default`` the README's first
    command as it is (``python -m search.run``, its default peers) on ``workload``: its row (``run_row``)."""
    flags = (["--workload", workload, *extra] if default else
             ["--workload", workload, "--peers", "all", "--peer-budgets", *map(str, budgets), "--no-batch-scaling",
              *extra, *(["--compile"] if compiled else [])])
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        _, wall = run_search(flags, out=Path(tmp))
        row = run_row(Path(tmp) / "run", "python -m search.run " + " ".join(flags), wall)
    print(f"{workload}: {len(row['peers'])} peers, {wall:.0f} s", file=sys.stderr)
    return {**row, "load_average_1": load_before}


def run_row(run_dir: Path, command: str, wall: float | None) -> dict[str, Any]:
    """A search's run folder as a row: its report's figures, the peers' verdicts from its ``frontier.json``, the
    settings the quote takes from its ``config.json`` (the device among them) and what the run cost in baseline
    steps. A run stopped at a budget (SIGINT) has them too, from what it measured by then."""
    files = {name: run_dir / f"{name}.json" for name in ("report", "config", "frontier")}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise BenchError(f"{run_dir}: no {', '.join(missing)}; give the folder of a search run that measured its "
                         "baseline (search.run writes them when it finishes or is stopped)")
    report, cfg, frontier = (json.loads(f.read_text()) for f in files.values())
    base = report["baseline"]["step_seconds"]
    with RunStore(run_dir, readonly=True) as store:  # each peer as the search measured it: auto-SAC's decisions too
        specs = {name: e["spec"] for name, e in store.read(meta.PEERS).items() if e.get("spec")}
    return {"workload": cfg["workload"], "compiled": bool(cfg["compile"]), "command": command,
            "wall_seconds": wall, "baseline_steps": wall / base if wall else None,
            "phase_seconds": report.get("phase_seconds"), "evaluator_seconds": report.get("evaluator_seconds"),
            "measured": report["measured"], "clock": report["clock"], "device": report["device"],
            "baseline": report["baseline"], "hypervolume": report["hypervolume"],
            "search": {k: cfg[k] for k in SEARCH_SETTINGS}, "units": frontier["units"],
            "frontier": report["frontier"], "peers": report["peers"], "peer_specs": specs,
            "load_average_1": os.getloadavg()[0]}


def selected(row: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Per measured peer: the plan the search answered it with (our fastest plan of the strict frontier at no more
    memory, ``search.records.peer_verdicts``): its ``plan`` and ``compile_scope`` (how the search measured it)."""
    out: dict[str, dict[str, Any] | None] = {}
    for p in row["peers"]:
        if p.get("measured") is not None:
            ours = p.get("ours")
            out[p["peer"]] = None if ours is None else {"plan": dict(zip(row["units"], ours["actions"])),
                                                        "compile_scope": row.get("search", {}).get("compile_scope")
                                                        if row["compiled"] else None}
    return out


def _figures(m: MeasuredPlan) -> dict[str, Any]:
    return {"peak_bytes": m.peak_bytes, "step_seconds": m.step_seconds, "spread_seconds": m.spread_seconds,
            "samples": len(m.step_seconds_samples)}


def search_settings(row: dict[str, Any]) -> dict[str, Any]:
    """The row's search settings (``SEARCH_SETTINGS``); rows written before they were recorded ran with the
    defaults (and no compile scope), rows written before the device was recorded on the CPU."""
    defaults = SearchConfig()
    given = row.get("search", {k: getattr(defaults, k) for k in ("seed", "repeats", "measure_threads")})
    return {"device": "cpu", **given}


def check_device(row: dict[str, Any], measured_on: str) -> None:
    """Refuse a quote taken on another device model than the search's: peers are quoted where the search ran."""
    searched_on = row.get("device")
    if searched_on is not None and searched_on.split(" (")[0] != measured_on.split(" (")[0]:
        raise BenchError(f"{row['workload']}: the search measured on {searched_on}, this quote on {measured_on}; "
                         "quote a run on the machine (and device) it ran on")


def quote(row: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Fresh interleaved measurements of the baseline, the peers and our plans selected against them."""
    picks = selected(row)
    searched_verdicts = {p["peer"]: p.get("verdict") for p in row["peers"]}
    units = row["units"]
    actions = sorted({a for f in row["frontier"] for a in f["plan"].values()} | {"keep"})
    search = search_settings(row)
    scope = search.get("compile_scope", "model")  # rows written before there were scopes compiled the whole model
    ev = Evaluator(row["workload"], int(search["seed"]), units, actions, int(search["repeats"]), search["device"],
                   int(search["measure_threads"]) or None, name="quote",  # our plans as the search measured them:
                   compile=CompileOptions(scope="model" if scope == "model" else "units") if row["compiled"] else False)
    specs = {name: Peer.model_validate(spec) for name, spec in row.get("peer_specs", {}).items() if name in picks}
    budgets = [b for b, _ in compile_budgets(row["peers"])]
    peers = specs if set(specs) == set(picks) else {  # rows written before the specs were kept: offered again
        p.name: specs.get(p.name, p) for p in ev.peers(ALL_KINDS, budgets) if p.name in picks}
    if set(peers) != set(picks):
        raise SystemExit(f"{row['workload']}: the quoting Evaluator offers other peers than the search measured "
                         f"({sorted(set(picks) ^ set(peers))})")
    ours = {json.dumps(p, sort_keys=True): p for p in picks.values() if p is not None}

    def measure_ours(p: dict[str, Any]) -> MeasuredPlan:
        actions = [p["plan"][u] for u in units]
        if p.get("compile_scope") == "model" and scope == "both":  # found whole-model by --compile-scope both
            return ev.evaluate_whole_model(actions, "quote")
        return ev.evaluate(actions, "quote", again=True)

    jobs: dict[str, Callable[[], MeasuredPlan]] = {
        "baseline": lambda: ev.evaluate(["keep"] * len(units), "quote", again=True),
        **{f"ours:{k}": lambda p=p: measure_ours(p) for k, p in ours.items()},
        **{f"peer:{name}": lambda peer=peer: ev.evaluate_peer(peer) for name, peer in peers.items()}}
    t0 = time.perf_counter()
    ev.warm_up()
    got = interleaved(jobs, rounds)
    check_device(row, got["baseline"].device)
    samples = check_equal_samples(list(got.values()), row["workload"])
    rows = []
    for name, plan in picks.items():
        peer = got[f"peer:{name}"]
        mine = got.get(f"ours:{json.dumps(plan, sort_keys=True)}") if plan is not None else None
        entry: dict[str, Any] = {"peer": name, **_figures(peer), "compile_seconds": peer.compile_seconds,
                                 "note": peers[name].note, "ours": None,
                                 **auto_sac_estimates(ev.workload, peers[name], peer, got["baseline"])}
        if mine is not None:
            verdict = compare_times((peer.step_seconds, peer.spread_seconds), (mine.step_seconds, mine.spread_seconds))
            entry["ours"] = {**_figures(mine), "plan": action_summary(plan["plan"].values())
                             + (", whole model compiled" if plan["compile_scope"] == "model" and scope == "both" else ""),
                             "compile_scope": plan["compile_scope"],
                             "fits": mine.peak_bytes <= peer.peak_bytes, "compile_seconds": mine.compile_seconds}
            entry["time_ratio_peer_over_ours"] = peer.step_seconds / mine.step_seconds
            entry["verdict"], entry["verdict_text"] = verdict.verdict, str(verdict)
            entry["beyond_spread"] = verdict.verdict != "within noise"
            searched = searched_verdicts.get(name)
            if searched in ("faster", "slower"):  # the search's verdict, checked: the quote says the opposite
                entry["search_verdict"] = searched
                entry["contradicted"] = verdict.verdict in ("faster", "slower") and verdict.verdict != searched
        rows.append(entry)
    return {"rounds": rounds, "samples_per_plan": samples, "wall_seconds": time.perf_counter() - t0,
            "baseline": _figures(got["baseline"]), "peers": sorted(rows, key=lambda e: e["peak_bytes"]),
            "load_average_1": os.getloadavg()[0]}


@contextlib.contextmanager
def deterministic_kernels(device: torch.device) -> Iterator[None]:
    """On CUDA, deterministic kernels (where one exists) and attention on the math kernel while the block runs:
    the fused attention's backward and other CUDA kernels sum in an order that varies from run to run, so two
    unplanned steps already differ in the last bits, and at bf16 that is above ``GRADIENT_TOLERANCE``."""
    if device.type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def auto_sac_estimates(workload: Any, peer: Peer, measured: MeasuredPlan, baseline: MeasuredPlan) -> dict[str, Any]:
    """An auto-SAC peer's own estimates (those its decisions carry from the search) beside what
    the quote measured, under ``auto_sac``: how far torch's estimates are from the truth. Its peak is compared as a
    saving against the unplanned step (its memory model leaves out the optimizer's state and the batch), its
    recompute time against the measured step time less the baseline's. Other peers: nothing."""
    if peer.kind is not PeerKind.TORCH_AUTO_SAC:
        return {}
    plan = auto_sac_plan(workload, peer)  # the decisions it carries from the search
    return {"auto_sac": {
        "estimated_peak_bytes": plan.estimated_peak_bytes, "estimated_unplanned_peak_bytes": plan.unplanned_peak_bytes,
        "estimated_saving": 1 - plan.estimated_peak_bytes / plan.unplanned_peak_bytes,
        "measured_saving": 1 - measured.peak_bytes / baseline.peak_bytes,
        "estimated_recompute_seconds": plan.estimated_recompute_seconds,
        "measured_recompute_seconds": measured.step_seconds - baseline.step_seconds,
        "memory_budget_bytes": plan.memory_budget_bytes, "modules": sorted(plan.saves),
        "estimated_on": plan.estimated_on}}


def check_gradients(row: dict[str, Any]) -> None:
    """Each quoted peer's ``gradient_error`` (``env.measure.peers.gradient_error``: a training step with the peer
    against one without, from the same RNG state, dropout on; a compile budget compiled), into its quote entry:
    a peer that is faster only by training something else does not win."""
    search = search_settings(row)
    seed = int(search["seed"])
    w = load_workload(row["workload"], seed=seed, device=resolve_device(search["device"]))
    entries = {e["peer"]: e for e in row["quote"]["peers"]}
    budgets = [b for b, _ in compile_budgets(row["quote"]["peers"])]
    with deterministic_kernels(w.device):
        reference = training_step(w, seed)  # the unplanned step, one for all the peers
        specs = {name: Peer.model_validate(spec) for name, spec in row.get("peer_specs", {}).items()}
        for peer in [specs.get(p.name, p) for p in peers_for(w, budgets=budgets)]:  # as the search measured them
            if peer.name in entries:
                error = gradient_error(w, peer, seed, reference)
                entries[peer.name].update(gradient_error=error, gradients_kept=error <= GRADIENT_TOLERANCE)
    row["quote"]["gradients_checked"] = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": code_commit()}
    missing = [name for name, e in entries.items() if "gradient_error" not in e]
    if missing:
        raise SystemExit(f"{row['workload']}: no gradient check for {', '.join(missing)}: this build of the workload "
                         "offers other peers than the search measured")


def searched(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """The rows to quote: the run folder given (``--run``), or one new search per workload, each as it ends."""
    if args.run:
        yield run_row(args.run, f"python -m search.run (the run in {args.run})", None)
        return
    for w in args.workloads:
        yield search(w, args.budgets, args.compile, args.search, args.default)


def measure(run: Run) -> None:
    args = run.args
    if args.quick:
        args.search = ["--agents", "1", "--timesteps", "128", "--chunk-timesteps", "128", "--max-measurements", "10",
                       "--repeats", "1"]
    if args.quote_only or args.gradients_only:  # the file's searches, quoted again (the result then names this
        run.result = read_result(run.path)      # run's machine and time), or their peers' gradients checked
        for w in run.result["workloads"]:
            if w["workload"] in args.workloads and w.get("quote") is not None:
                if args.quote_only:
                    w["quote"] = quote(w, args.rounds)
                check_gradients(w)
                if args.quote_only:
                    run.save()
                else:  # the file keeps the machine, date and load its times were measured at
                    write_json(run.path, run.result)
        return
    for row in searched(args):
        run.device = resolve_device(search_settings(row)["device"])  # the machine line names the device quoted on
        row["quote"] = quote(row, args.rounds)
        check_gradients(row)
        run.add_row(row)  # written after every workload: a long run keeps what it did


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    ap.add_argument("--budgets", type=float, nargs="+", default=[round(0.1 * i, 1) for i in range(11)],
                    help="activation_memory_budget values (a cold compile each)")
    ap.add_argument("--compile", action="store_true", help="search and measure compiled steps")
    ap.add_argument("--default", action="store_true",
                    help="the default search (python -m search.run, its default peers) on each workload, then the "
                         "quote: checks the verdicts the run's report gives (result: peers_default)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved quoting rounds over the quoted plans")
    ap.add_argument("--search", nargs=argparse.REMAINDER, default=[],
                    help="further search.run flags, e.g. --search --agents 2 --timesteps 1024")
    ap.add_argument("--run", type=Path, help="no search: quote this search run's folder (one of --peers all; one "
                                             "stopped at a budget quotes what it measured), on the device it ran on")
    ap.add_argument("--quote-only", action="store_true",
                    help="no search: quote the searches of the result file again (--workloads picks which)")
    ap.add_argument("--gradients-only", action="store_true",
                    help="no search, no quote: check the quoted peers' gradients in the result file (--workloads)")


BENCH = Bench("peers", __doc__, options, rows="workloads", row_id=lambda r: r["workload"],
              name_of=lambda args: "peers_default" if args.default else "peers_compiled" if args.compile else "peers",
              quick={"workloads": ["gpt/tiny"], "budgets": [0.0, 1.0], "rounds": 1})

if __name__ == "__main__":
    main(BENCH, measure)

"""The end-of-run report: the measured frontier beside the baseline rules and the exact frontier.

Written to ``report.md`` and ``report.json`` in the run folder; ``plans/`` gets one JSON plan
per agent budget (the fastest measured frontier plan under it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from env.data.plan import action_summary
from env.data.plan_check import PlanCheck
from env.data.ranks import split_rank_clock
from env.data.types import MIB, SourceKind
from search.engine.ledger import Ledger
from search.engine.shown import Shown
from search.engine.throughput.report import throughput_markdown
from search.records import meta
from search.records.config import SearchConfig
from search.records.frontier_file import COMPILE_HOW, FrontierFile, FrontierPoint, point_from, write_frontier
from search.records.markdown import table_lines
from search.records.pareto import fastest_within
from search.records.peer_verdicts import VERDICT_MEASUREMENTS, PeerEstimate, PeerVerdict, peer_verdicts
from search.records.throughput import ThroughputCurve


def write_outputs(cfg: SearchConfig, run_dir: Path, ledger: Ledger) -> dict[str, Any]:
    """frontier.json, report.md/json and plans/ for a finished (or interrupted) search."""
    prof, codec, store = ledger.setup.profile, ledger.codec, ledger.store
    shown = Shown.of(ledger)  # raises where the baseline is not measured yet
    base, strict, candidates, front = shown.baseline, shown.strict, shown.candidates, shown.front
    tolerance, noise = shown.tolerance, shown.noise
    on_front = {r.digest for r in front}
    left_out = [r.digest for r in strict + candidates if r.digest not in on_front]
    unconfirmed = len({r.digest for r in strict} - {r.digest for r in candidates})
    agents_front = ledger.frontier((SourceKind.AGENT,))
    exact_digests = set(store.read(meta.EXACT))
    exact_measured = [r for r in ledger.points() if r.digest in exact_digests]
    exact_front = ledger.frontier((SourceKind.EXACT,))
    rules = store.read(meta.RULES)
    units = list(codec.units)
    curve = store.read(meta.THROUGHPUT)  # a throughput search's answers per memory cap, once it finished

    checks = store.read(meta.GATE)
    points = [point_from(r, units, scope, checks.get(r.digest)) for r, scope in zip(front, shown.scopes)]
    refused = [c for c in checks.values() if not c.passed]
    fsdp = store.read(meta.FSDP)
    ledger.refresh_peer_plans()
    entries = store.read(meta.PEERS)
    estimates = {k: e for k, v in entries.items() if (e := PeerEstimate.from_params(v.get("spec", {}).get("params", {})))}
    verdicts = peer_verdicts(ledger.peers(), strict, ledger.peer_plans(), {k: v["note"] for k, v in entries.items()},
                             {k: v.get("label", "") for k, v in entries.items()}, estimates)
    frontier = FrontierFile(workload=cfg.workload, batch_shape=prof.batch_shape, device=base.device, clock=base.clock,
                            fingerprint=prof.fingerprint, units=units, fsdp_ranks=fsdp["ranks"] if fsdp else 0,
                            baseline={"peak_bytes": base.peak_bytes, "step_seconds": base.step_seconds},
                            points=points, readable={"memory_tolerance_bytes": int(tolerance), "timing_noise": noise,
                                                     "left_out": list(dict.fromkeys(left_out))},
                            throughput=curve, refused=refused, peers=verdicts)
    write_frontier(run_dir, frontier)
    plans_dir = run_dir / "plans"
    plans_dir.mkdir(exist_ok=True)
    for a in store.read(meta.AGENTS):  # as search.export writes them: a compiled plan says how it was compiled
        best = fastest_within([r.peak_bytes for r in front], [r.step_seconds for r in front], a["budget_bytes"])
        if best is not None:
            path = plans_dir / f"budget_{a['budget_bytes'] / MIB:.0f}MB.json"
            path.write_text(frontier.plan_json(points[best]))

    rule_rows = [{"rule": name, "peak_bytes": r.peak_bytes, "step_seconds": r.step_seconds,
                  "on_frontier": r.digest in on_front}
                 for name, digest in rules.items() if (r := ledger.archive.measured.get(digest)) and not r.oom]
    peer_rows = [v.model_dump(mode="json") | {"text": v.text} for v in verdicts]
    hv_all, hv_agents, hv_exact = ledger.hv(strict), ledger.hv(agents_front), ledger.hv(exact_front)
    choice = store.read(meta.UNIT_CHOICE)
    report = {
        "workload": cfg.workload, "batch_shape": prof.batch_shape, "device": base.device, "clock": base.clock,
        "units": len(units), "evaluations": store.count(), "measured": store.count(True),
        "baseline": {"peak_bytes": base.peak_bytes, "step_seconds": base.step_seconds},
        "baseline_live_before_bytes": base.live_before_bytes,
        "frontier": [{**p.model_dump(mode="json"), "found_by": r.sources} for p, r in zip(points, front)],
        "left_out": {"plans": len(candidates) - len(front), "unconfirmed": unconfirmed,
                     "memory_tolerance_bytes": int(tolerance), "timing_noise": noise},
        "hypervolume": {"frontier": hv_all, "agents_only": hv_agents, "exact_measured": hv_exact,
                        "agents_over_exact": (hv_agents / hv_exact) if exact_front else None},
        "exact_plans_measured": len(exact_measured), "rules": rule_rows, "peers": peer_rows, "events": ledger.events,
        "agents": store.progress(), "evaluators": store.read(meta.EVALUATORS),
        "measurement_mode": store.read(meta.MEASUREMENT_MODE),
        "baseline_by_evaluator": store.read(meta.BASELINE_BY_EVALUATOR),
        "unit_choice": choice.model_dump(mode="json") if choice else None,
        "headroom": store.read(meta.HEADROOM),
        "phase_seconds": store.read(meta.PHASE_SECONDS), "evaluator_seconds": store.read(meta.EVALUATOR_SECONDS),
        "fsdp": fsdp,
        "paired": base.has_references,
        "references": base.n_measurements,
        "throughput": curve.model_dump(mode="json") if curve else None,
        "gate": gate_summary(points, refused, ledger, curve, checks),
    }
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    (run_dir / "report.md").write_text(to_markdown(report))
    return report


def gate_summary(points: list[FrontierPoint], refused: list[PlanCheck], ledger: Ledger,
                 curve: ThroughputCurve | None = None, checks: dict[str, PlanCheck] | None = None) -> dict[str, Any]:
    """What the correctness gate found: how many shown plans it checked, their largest error, each refused plan;
    with a throughput search, how many of its answers (plans of ours, not peers) it checked and their largest
    error."""
    errors = [p.gradient_error for p in points if p.checked and p.gradient_error is not None]
    measured = ledger.archive.measured
    ours = {a.digest for a in curve.answers() if a.plan is not None} if curve is not None else set()
    answered = [checks[d] for d in ours if checks and d in checks and checks[d].passed]
    return {"shown": len(points), "checked": sum(p.checked for p in points),
            "answers": len(ours), "answers_checked": len(answered),
            "answers_largest_error": max((c.error for c in answered), default=None),
            "largest_error": max(errors, default=None), "tolerance": refused[0].tolerance if refused else None,
            "refused": [{**c.model_dump(mode="json"), "line": c.line(),
                         "plan": action_summary(measured[c.digest].actions) if c.digest in measured else c.digest}
                        for c in refused]}


def gate_markdown(gate: dict[str, Any]) -> list[str]:
    """The report's correctness-gate section: every plan shown checked, and each plan refused with its units."""
    if not gate["checked"]:
        return ["## Correctness gate", "", "The plans shown were not checked (an interrupted run)."]
    largest = gate["largest_error"]
    lines = ["## Correctness gate", "",
             f"{gate['checked']} of the {gate['shown']} plans shown were checked on the workload: one training step "
             "with the plan against one without, from the same weights, inputs and RNG state; largest error of the "
             f"loss or a gradient {largest:.2g} (relative to its magnitude)."]
    if gate.get("answers"):
        worst = gate["answers_largest_error"]
        lines += ["", f"{gate['answers_checked']} of the {gate['answers']} plans answering a memory cap were checked "
                  "the same way, at the workload's own batch" + (f"; largest error {worst:.2g}." if worst is not None
                                                                  else ".")]
    for r in gate["refused"]:
        lines += ["", f"- plan {r['plan']} ({r['digest']}) {r['line']}. Every plan proposed after keeps "
                  + (", ".join(r["culprits"]) or "its recomputed units") + "."]  # the line names the causes
    return lines


def peers_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The peers table (rows of ``search.records.peer_verdicts.PeerVerdict`` as JSON): each peer against our
    fastest measured plan at no more memory, both as ranked, with their spreads and the verdict."""
    cells = []
    for r in rows:
        v = PeerVerdict.model_validate(r)
        name = v.peer + (f" (a plan of ours: {v.plan_summary})" if v.plan else "")
        if v.measured is None:
            cells.append((name, "out of memory", "", "", "", v.note[:80]))
            continue
        m, ours = v.measured, v.ours
        theirs = f"{m.step_seconds * 1e3:.1f} (±{m.spread_seconds * 1e3:.1f})"
        answer = (f"{ours.peak_bytes / MIB:.1f} / {ours.step_seconds * 1e3:.1f} (±{ours.spread_seconds * 1e3:.1f}): "
                  f"{ours.plan}" if ours else "none")
        cells.append((name, f"{m.peak_bytes / MIB:.1f}", theirs, answer, v.text, v.note[:80]))
    return table_lines(("peer", "peak MiB", "step ms (spread)", "our fastest plan at no more memory: MiB / ms (spread)",
                        "verdict", "note"), cells, "lrrlll")


def estimates_markdown(rows: list[dict[str, Any]], baseline: dict[str, Any]) -> list[str]:
    """What the peers that plan on estimates (auto-SAC) predicted of themselves against what was measured: a saving
    of peak memory (theirs against their own unplanned estimate, ours against the measured baseline) and the
    recompute time (the measured step less the baseline's)."""
    estimated = [v for r in rows if (v := PeerVerdict.model_validate(r)).estimate and v.measured]
    if not estimated:
        return []
    cells = [(v.peer, f"{v.estimate.saving:.0%}", f"{1 - v.measured.peak_bytes / baseline['peak_bytes']:.0%}",
              f"{v.estimate.estimated_recompute_seconds * 1e3:.1f}",
              f"{(v.measured.step_seconds - baseline['step_seconds']) * 1e3:.1f}")
             for v in estimated if v.estimate and v.measured]
    how = estimated[0].estimate.estimated_on  # type: ignore[union-attr]
    return ["", f"What the peers that plan on estimates predicted of themselves, against what was measured ({how}):",
            ""] + table_lines(("peer", "estimated saving", "measured saving", "estimated recompute ms",
                               "measured step - baseline, ms"), cells, "lrrrr")


def to_markdown(rep: dict[str, Any]) -> str:
    b = rep["baseline"]
    lines = [f"# Search report: {rep['workload']}", "",
             f"{rep['units']} units, batch {rep['batch_shape']}, on {rep['device']}; {rep['measured']} plans measured "
             f"of {rep['evaluations']} evaluated. Baseline (no checkpointing): {b['peak_bytes'] / MIB:.1f} MiB, "
             f"{b['step_seconds'] * 1e3:.1f} ms a step. Step times: {_clock_words(rep['clock'])}"
             + (f"; each taken relative to the baseline measured beside it on the same Evaluator ({rep['references']} "
                "measurements of it), in the baseline's median seconds, so plans measured minutes apart compare as "
                "if side by side" if rep.get("paired") else "") + ".", ""]
    if rep.get("headroom"):
        lines += [f"**{rep['headroom']}**", ""]
    if rep.get("fsdp"):
        lines += fsdp_markdown(rep["fsdp"], rep["clock"], b["peak_bytes"] - rep["baseline_live_before_bytes"]) + [""]
    lines += ["## Measured frontier", ""]
    out = rep.get("left_out") or {}
    if out.get("plans"):
        lines += [f"{out['plans']} measured frontier plan(s) left out: each has a plan beside it at most "
                  f"{out['memory_tolerance_bytes'] / MIB:.2f} MiB higher that is faster by more than the run's timing "
                  f"noise ({out['timing_noise']:.1%}).", ""]
    if out.get("unconfirmed"):
        lines += [f"{out['unconfirmed']} plan(s) of the measured frontier not confirmed and left out: each is within "
                  f"the run's timing noise ({out['timing_noise']:.1%}) of a plan at less memory.", ""]
    scopes = sorted({p["compile_scope"] for p in rep["frontier"] if p.get("compile_scope")})
    if len(scopes) > 1:  # --compile-scope both: say how to compile each plan as it was measured
        lines += ["Compiled two ways; apply each plan as its row says: " + "; ".join(
            f"**{sc}**: {COMPILE_HOW[sc]}" for sc in scopes) + ".", ""]
    two = len(scopes) > 1
    lines += table_lines(("peak MiB", "saving", "step ms", "slowdown", "plan", "found by") + (("compiled",) if two else ()),
                         [(f"{p['peak_bytes'] / MIB:.1f}", f"{1 - p['peak_bytes'] / b['peak_bytes']:.0%}",
                           f"{p['step_seconds'] * 1e3:.1f}", f"{p['step_seconds'] / b['step_seconds'] - 1:+.0%}",
                           action_summary(p["plan"].values()), ", ".join(p["found_by"]))
                          + ((p["compile_scope"],) if two else ()) for p in rep["frontier"]], "rrrrll" + "l" * two)
    lines += ["", "## Baseline rules", ""] + table_lines(
        ("rule", "peak MiB", "step ms", "on the frontier?"),
        [(r["rule"], f"{r['peak_bytes'] / MIB:.1f}", f"{r['step_seconds'] * 1e3:.1f}",
          "yes" if r["on_frontier"] else "no: dominated") for r in rep["rules"]], "lrrl")
    if rep["peers"]:
        lines += ["", "## Peers: what users pick instead (same run, same Evaluators)", "",
                  "Each peer and our fastest measured plan at no more memory (the strict frontier: a plan left off "
                  "the table above as within noise still answers a peer at its memory), measured side by side in "
                  "the same deciding and confirming passes and ranked alike; faster or slower only beyond both "
                  f"spreads, and only after both were measured {VERDICT_MEASUREMENTS} times side by side. A peer "
                  "that is a plan of ours is measured once, as that plan.", ""] + peers_markdown(rep["peers"])
        lines += estimates_markdown(rep["peers"], rep["baseline"])
    if rep.get("throughput"):
        lines += [""] + throughput_markdown(ThroughputCurve.model_validate(rep["throughput"]))
    if rep.get("gate"):
        lines += [""] + gate_markdown(rep["gate"])
    hv = rep["hypervolume"]
    ratio = f"{hv['agents_over_exact']:.3f}" if hv["agents_over_exact"] is not None else "n/a (exact plans not measured)"
    lines += ["", "## Hypervolume (memory and time relative to the baseline)", "",
              f"- measured frontier: {hv['frontier']:.4f}", f"- agents' plans only: {hv['agents_only']:.4f}",
              f"- exact solver's plans, measured: {hv['exact_measured']:.4f}", f"- agents / exact: {ratio}"]
    if rep.get("unit_choice"):
        from env.data.unit_choice import UnitChoice

        lines += ["", "## Decision units", ""] + [f"- {line}" for line in UnitChoice.model_validate(rep["unit_choice"]).lines()]
    by_label = rep["baseline_by_evaluator"]
    lines += ["", "## Evaluators", "", f"Measurements: {rep['measurement_mode']}.", ""] + table_lines(
        ("evaluator", "node", "device", "restarts", "warm-up steps", "baseline ms"),
        [(e["name"], e["node"], e["device"], e["restarts"], e.get("warm_up_steps") or "-",
          f"{own['step_seconds'] * 1e3:.1f}" if (own := by_label.get(e["label"])) else "-") for e in rep["evaluators"]],
        "lllrrr")
    lines += time_lines(rep.get("phase_seconds") or {}, rep.get("evaluator_seconds") or {}, b["step_seconds"])
    if rep["events"]:
        lines += ["", "## Events", ""] + [f"- {e}" for e in rep["events"]]
    return "\n".join(lines) + "\n"


def fsdp_markdown(fsdp: dict[str, Any], clock: str, activation_bytes: int) -> list[str]:
    """The FSDP section: the run measured per rank, what a rank holds and gathers, how time was read."""
    own, _ = split_rank_clock(clock)
    units = [m for m in fsdp["sharded"] if m]
    lines = ["## FSDP", "",
             f"Measured under FSDP2 with {fsdp['ranks']} ranks per Evaluator ({fsdp['backend']}), each on the run's "
             "batch: every peak in this report is per rank (the largest rank's) and every step time is the slowest "
             "rank's, step by step. A rank holds its shard of the parameters, gradients and optimizer state before "
             "the step and gathers each unit's parameters for its forward and again for its backward, where a "
             f"recompute runs on them; the baseline's peak is {activation_bytes / MIB:.1f} MiB above what it holds. "
             "The profile the search priced plans with was taken on a rank under FSDP (the rank whose baseline peak "
             f"is the largest). Sharded with fully_shard: the root and {len(units)} module(s) "
             f"({', '.join(units[:6])}{', ...' if len(units) > 6 else ''}), after the plan: checkpointing inside, "
             f"sharding outside. Note: {fsdp['peers']}."]
    if own == "thread-cpu":
        lines[-1] += (" Step times are each rank's measuring-thread CPU time: a rank waiting for the others in a "
                      "collective is not counted, and the collectives move the same bytes under every plan.")
    return lines


def _clock_words(clock: str) -> str:
    """What a clock name means, for readers of the report (a group's clock names its ranks: ``rank_clock``)."""
    own, _ = split_rank_clock(clock)
    return {"thread-cpu": f"medians of the measuring thread's CPU time (clock {clock})",
            "wall": f"medians of the wall clock between synchronisations (clock {clock})"}.get(own, f"clock {clock}")


def time_lines(phases: dict[str, float], evaluators: dict[str, float], step_seconds: float | None = None) -> list[str]:
    """Where the wall time went, phase by phase (and in baseline steps, ``step_seconds`` a step: what a run costs
    whatever the machine's speed), and how much of the measuring was references."""
    if not phases:
        return []
    total = sum(phases.values())
    steps = bool(step_seconds)
    in_steps = f" = {total / step_seconds:.0f} baseline steps of {step_seconds * 1e3:.1f} ms" if steps else ""
    lines = ["", "## Where the time went", "", f"Wall clock of the driver, {total:.0f} s in all{in_steps}:", ""]
    lines += table_lines(("phase", "seconds") + (("baseline steps",) if steps else ()) + ("share",),
                         [(name, f"{s:.1f}") + ((f"{s / step_seconds:.0f}",) if steps else ()) + (f"{s / total:.0%}",)
                          for name, s in phases.items()])
    if evaluators.get("plan_measurements") or evaluators.get("reference_measurements"):
        lines += ["", f"The Evaluators measured {evaluators.get('plan_measurements', 0):.0f} times for "
                  f"{evaluators.get('plans', 0):.1f} s and took {evaluators.get('reference_measurements', 0):.0f} "
                  f"reference measurements (all keep, against drift) for {evaluators.get('references', 0):.1f} s."]
    return lines

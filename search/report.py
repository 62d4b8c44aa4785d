"""The end-of-run report: the measured frontier beside the baseline rules and the exact frontier.

Written to ``report.md`` and ``report.json`` in the run folder; ``plans/`` gets one JSON plan
per agent budget (the fastest measured frontier plan under it).
"""

from __future__ import annotations

import json
from typing import Any

from env.measure import median_seconds as _med
from env.measure import spread_seconds as _spread
from env.plan import Plan
from search.frontier_file import FrontierFile, FrontierPoint, write_frontier

from search.frontier_file import MIB as MB  # plans/budget_<N>MB.json: N in MiB, as --budget-mb


def write_outputs(search: Any) -> dict[str, Any]:
    """frontier.json, report.md/json and plans/ for a finished (or interrupted) search."""
    prof, run_dir = search.profile, search.run_dir
    base = search.baseline()
    front = search.frontier()
    agents_front = search.frontier(sources=("agent",))
    exact_digests = set(search.store.get_meta("exact", []))
    exact_measured = [r for r in search.measured_points() if r.digest in exact_digests]
    exact_front = search.frontier(sources=("exact",))
    rules = search.store.get_meta("rules", {})
    base_peak, base_s = base.peak_bytes, _med(base.step_samples)

    points = [FrontierPoint(plan=dict(zip(search.units, r.actions)), peak_bytes=r.peak_bytes,
                            step_seconds=_med(r.step_samples), spread_seconds=_spread(r.step_samples),
                            activation_bytes=r.peak_bytes - r.live_before_bytes, measured=True, source=r.source)
              for r in front]
    write_frontier(run_dir, FrontierFile(workload=search.cfg.workload, batch_shape=search.batch_shape,
                                         device=base.device, fingerprint=prof.fingerprint, units=search.units,
                                         baseline={"peak_bytes": base_peak, "step_seconds": base_s}, points=points))
    plans_dir = run_dir / "plans"
    plans_dir.mkdir(exist_ok=True)
    for a in search.store.get_meta("agents", []):
        fit = [r for r in front if r.peak_bytes <= a["budget_bytes"]]
        if fit:
            best = min(fit, key=lambda r: _med(r.step_samples))
            Plan.from_list(search.units, list(best.actions), prof.fingerprint).save(
                plans_dir / f"budget_{a['budget_bytes'] / MB:.0f}MB.json")

    rule_rows = []
    for name, digest in rules.items():
        r = search.state.archive.measured.get(digest)
        if r is None or r.oom:
            continue
        on_frontier = any(p.peak_bytes == r.peak_bytes and p.step_seconds == _med(r.step_samples) for p in points)
        rule_rows.append({"rule": name, "peak_bytes": r.peak_bytes, "step_seconds": _med(r.step_samples),
                          "on_frontier": on_frontier})
    hv_all, hv_agents, hv_exact = search.hv(front), search.hv(agents_front), search.hv(exact_front)
    report = {
        "workload": search.cfg.workload, "batch_shape": search.batch_shape, "device": base.device,
        "units": len(search.units), "evaluations": search.store.count(), "measured": search.store.count(True),
        "baseline": {"peak_bytes": base_peak, "step_seconds": base_s},
        "frontier": [{**p.model_dump(mode="json"), "found_by": sorted(search.state.archive.proposers.get(r.digest, {r.source}))}
                     for p, r in zip(points, front)],
        "hypervolume": {"frontier": hv_all, "agents_only": hv_agents, "exact_measured": hv_exact,
                        "agents_over_exact": (hv_agents / hv_exact) if exact_front else None},
        "exact_plans_measured": len(exact_measured), "rules": rule_rows, "events": search.state.events,
        "agents": search.store.progress(),
    }
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    (run_dir / "report.md").write_text(to_markdown(report))
    return report


def to_markdown(rep: dict[str, Any]) -> str:
    b = rep["baseline"]
    lines = [f"# Search report: {rep['workload']}", "",
             f"{rep['units']} units, batch {rep['batch_shape']}, on {rep['device']}; {rep['measured']} plans measured "
             f"of {rep['evaluations']} evaluated. Baseline (no checkpointing): {b['peak_bytes'] / MB:.1f} MB, "
             f"{b['step_seconds'] * 1e3:.1f} ms a step.", "", "## Measured frontier", "",
             "| peak MB | saving | step ms | slowdown | plan | found by |", "|---:|---:|---:|---:|---|---|"]
    for p in rep["frontier"]:
        counts: dict[str, int] = {}
        for a in p["plan"].values():
            counts[a] = counts.get(a, 0) + 1
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        lines.append(f"| {p['peak_bytes'] / MB:.1f} | {1 - p['peak_bytes'] / b['peak_bytes']:.0%} | "
                     f"{p['step_seconds'] * 1e3:.1f} | {p['step_seconds'] / b['step_seconds'] - 1:+.0%} | {summary} | {', '.join(p['found_by'])} |")
    lines += ["", "## Baseline rules", "", "| rule | peak MB | step ms | on the frontier? |", "|---|---:|---:|---|"]
    for r in rep["rules"]:
        lines.append(f"| {r['rule']} | {r['peak_bytes'] / MB:.1f} | {r['step_seconds'] * 1e3:.1f} | "
                     f"{'yes' if r['on_frontier'] else 'no: dominated'} |")
    hv = rep["hypervolume"]
    ratio = f"{hv['agents_over_exact']:.3f}" if hv["agents_over_exact"] is not None else "n/a (exact plans not measured)"
    lines += ["", "## Hypervolume (memory and time relative to the baseline)", "",
              f"- measured frontier: {hv['frontier']:.4f}", f"- agents' plans only: {hv['agents_only']:.4f}",
              f"- exact solver's plans, measured: {hv['exact_measured']:.4f}", f"- agents / exact: {ratio}"]
    if rep["events"]:
        lines += ["", "## Events", ""] + [f"- {e}" for e in rep["events"]]
    return "\n".join(lines) + "\n"

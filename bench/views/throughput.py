"""Views of what a search answers beyond one device's frontier: ``bench/throughput.py`` (per memory cap, the
(plan, micro-batch) the throughput search answers against the peers at the largest micro-batch each fits, and
against the measured grid) and ``bench/fsdp.py`` (one device against FSDP2 ranks)."""

from __future__ import annotations

from typing import Any

from bench.views.base import Headline, Result, View, measured, mib, table
from env.data.measured import within_spreads


def _timed(p: dict[str, Any]) -> str:
    return (f"{p['samples_per_second']:.1f} ({p['step_seconds'] * 1e3:.0f} ms a step, spread "
            f"{p['spread_seconds'] * 1e3:.0f})")


def _answer(a: dict[str, Any] | None) -> str:
    return f"{a['label']} at {a['micro_batch']}: {_timed(a)}" if a else "nothing fits"


def _best_peer(row: Result) -> dict[str, Any] | None:
    return max(row["peers"], key=lambda p: p["samples_per_second"], default=None)


def _peer(row: Result) -> str:
    peer = _best_peer(row)
    return f"{peer['label']} at {peer['micro_batch']}: {_timed(peer)}" if peer else "-"


def _within(row: Result) -> str:
    """Whether our answer and the best peer differ per sample by less than either's spread per sample."""
    a, peer = row["answer"], _best_peer(row)
    if not a or not peer:
        return "-"
    ours, theirs = ((p["step_seconds"], p["micro_batch"], p["spread_seconds"]) for p in (a, peer))
    if within_spreads(ours, theirs):
        return "yes"
    return "no, ours faster" if ours[0] / ours[1] < theirs[0] / theirs[1] else "no, ours slower"


def _grid_within(row: Result) -> str:
    """Whether ours and the grid's best differ per sample by no more than either's spread per sample, as quoted
    (results from before the grid's quote kept spreads show "-")."""
    if "within_spreads" not in row:
        return "-"
    return "yes" if row["within_spreads"] else ("no, ours faster" if row["ours_over_grid"] > 1 else "no, ours slower")


def _agent_over_exact(row: Result) -> str:
    """The agent's best measured (plan, micro-batch) over the exact solver's, both as quoted (rows written before
    the run quoted them: -)."""
    by = row.get("by_proposer") or {}
    agent, exact = by.get("agent"), by.get("exact")
    if not agent or not exact:
        return "-"
    same = agent["digest"] == exact["digest"] and agent["micro_batch"] == exact["micro_batch"]
    return f"{agent['samples_per_second'] / exact['samples_per_second']:.2f}x" + (" (the same)" if same else "")


def throughput_table(r: Result) -> str:
    out = []
    for w in r["workloads"]:
        s = w["search"]
        rows = [(f"{name} ({mib(row['cap_bytes']):.1f} MiB)", _answer(row["answer"]), _peer(row),
                 f"{row['ours_over_best_peer']:.2f}x" if row["ours_over_best_peer"] else "-", _within(row),
                 f"{row['model_optimal']['samples_per_second']:.1f}" if row["model_optimal"] else "-",
                 _agent_over_exact(row))
                for name, row in zip(w["caps"], s["caps"])]
        against = (f"; the same search without caps just before: {w['default_wall_seconds']:.0f} s, "
                   f"{s['wall_seconds'] / w['default_wall_seconds']:.2f}x" if w.get("default_wall_seconds") else "")
        out += [f"**`{w['workload']}`** ({s['clock']} clock, search {s['wall_seconds']:.0f} s by the wall clock"
                f"{against}, load {s['load_average_1']:.1f}; micro-batches {', '.join(map(str, s['micro_batches']))})",
                "",
                table(["cap", "ours: plan at micro-batch: samples/s", "best peer", "ours / best peer",
                       "within the spreads", "model-optimal (predicted samples/s)",
                       "agent's best / exact solver's, quoted"], rows, "lllrlrl"), ""]
        if s.get("phase_seconds"):
            out += ["Where the search's wall time went (the driver's phase clock, seconds): " + ", ".join(
                f"{name} {sec:.0f}" for name, sec in s["phase_seconds"].items() if sec >= 0.5) + ".", ""]
        g = w.get("grid")
        if g:
            grows = [(f"{mib(row['cap_bytes']):.1f} MiB", (f"{row['ours_over_grid']:.2f}x"
                      + (" (the same configuration)" if row.get("same_configuration") else ""))
                      if row.get("ours_over_grid") else "-", _grid_within(row)) for row in g["caps"]]
            out += [f"Against the measured grid ({g['wall_seconds']:.0f} s, load {g['load_average_1']:.1f}; the quote "
                    f"in {g['rounds']} interleaved rounds):", "",
                    table(["cap", "ours / grid's best", "within the spreads"], grows, "lrl"), ""]
    if r.get("skipped"):
        out.append("Not measured (time budget): " + ", ".join(f"`{s}`" for s in r["skipped"]) + ".")
    return "\n".join(out)


def throughput_headlines(r: Result) -> list[Headline]:
    """One row: our answer over the best peer's samples per second at every cap of every workload, and the
    search's wall time against the same search without caps where it was measured; the GPU where it ran on one."""
    on = f" on {r['device'].split(' (')[0]}" if str(r.get("device", "")).endswith("(cuda)") else ""
    rows = [(w, row) for w in r["workloads"] for row in w["search"]["caps"] if row.get("ours_over_best_peer")]
    if not rows:
        return []
    ratios = [row["ours_over_best_peer"] for _, row in rows]
    verdicts = [_within(row) for _, row in rows]
    within, faster = verdicts.count("yes"), verdicts.count("no, ours faster")
    names = list(dict.fromkeys(w["workload"] for w, _ in rows))
    walls = [f"{w['search']['wall_seconds'] / w['default_wall_seconds']:.2f}x on `{w['workload']}`"
             for w in r["workloads"] if w.get("default_wall_seconds")]
    figure = (f"{min(ratios):.2f}x to {max(ratios):.2f}x" if min(ratios) != max(ratios) else f"{ratios[0]:.2f}x") \
        + f", {within} of {len(rows)} within the spreads" \
        + (f", ours faster beyond them at {faster}, slower at {len(rows) - within - faster}" if within < len(rows)
           else "") \
        + (f"; the search's wall time against the same search without caps: {', '.join(walls)}" if walls else "")
    what = (f"Fastest (plan, micro-batch) per memory cap{on}, {', '.join(f'`{n}`' for n in names)}: ours over the best "
            f"peer's samples/s at {len(rows)} caps")
    return [Headline(what, figure, measured(r, rows[0][0]["search"]["clock"],
                                            max(w["search"]["load_average_1"] for w, _ in rows)))]


def fsdp_table(r: Result) -> str:
    out = []
    for w in r["workloads"]:
        one, ranks = w["one_device"], w[f"fsdp_{r['ranks']}_ranks"]
        rows = [(name, f"{mib(s['baseline_peak_bytes']):.1f}", f"{mib(s['held_before_step_bytes']):.1f}",
                 f"{mib(s['lowest_peak_bytes']):.1f}", f"{s['lowest_peak_saving']:.0%}", s["lowest_peak_plan"],
                 s["measured"], f"{s['wall_seconds']:.0f}", s["clock"])
                for name, s in (("one device", one), (f"{r['ranks']} ranks, per rank", ranks))]
        load = w.get("load_average_before") or [float("nan")]
        out += [f"**`{w['workload']}`** (load {load[0]:.1f} before; wall seconds of each search)", "",
                table(["setting", "baseline MiB", "held before the step MiB", "lowest MiB", "saving", "lowest plan",
                       "measured", "wall s", "clock"], rows, "lrrrrlrrl"), "",
                f"The fastest plan under a per-rank cap differs from the one-device pick for the same activation "
                f"budget at {w['caps_where_the_pick_differs']} of {len(w['caps'])} caps.", ""]
        crow = [(f"{mib(c['cap_bytes']):.1f}", c["fsdp_pick"], c["one_device_pick"] or "-",
                 "yes" if c["differs"] else "no",
                 "-" if c["one_device_pick_under_fsdp"] is None else
                 f"{mib(c['one_device_pick_under_fsdp']['peak_bytes']):.1f} MiB, "
                 f"{c['one_device_pick_under_fsdp']['step_seconds'] * 1e3:.0f} ms") for c in w["caps"]]
        out += [table(["per-rank cap MiB", "FSDP pick", "one-device pick", "differs", "one-device pick under FSDP"],
                      crow, "rllll"), ""]
    return "\n".join(out)

VIEWS = [
    View("throughput", "The fastest (plan, micro-batch) for a memory cap",
         "`python -m search.run --memory-cap` at three caps per workload against the peers at the largest "
         "micro-batch each fits, samples per second as the run quoted them (interleaved rounds after the choice), "
         "and on gpt/small against the best of a measured grid of (plan, micro-batch).",
         "python bench/throughput.py", throughput_table, headlines=throughput_headlines),
    View("gpu_throughput", "The throughput search on a GPU", "As on the CPU, with `--device cuda`.",
         "python bench/gpu.py", throughput_table, headlines=throughput_headlines),
    View("fsdp", "One device against FSDP2 ranks", "The same search on one device and under FSDP2 with 2 gloo "
         "ranks (`--fsdp 2`): per-rank baseline, what a rank holds before its step, the lowest measured peak, and "
         "whether the fastest plan under a per-rank cap is the plan one device picks for the same activation "
         "budget. Step times are each setting's own clock: compare them within a setting.",
         "python bench/fsdp.py", fsdp_table),
]

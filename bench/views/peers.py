"""Views of the peers: what users pick instead, quoted beside our plans (``peers``,
``peers_compiled``), and compiled training probed row by row (``peers_probe``)."""

from __future__ import annotations

from typing import Any

from bench.views.base import Headline, Result, View, measured, mib, table

COMPILE_BUDGET_PEER = "compile-budget-"  # env.measure.peers.compile_budget_peer names them compile-budget-0.5


def compile_budgets(peers: list[Result]) -> list[tuple[float, Result]]:
    """(budget, peer row) of the compile-budget peers that ran (not out of memory), by budget."""
    return sorted(((float(p["peer"].removeprefix(COMPILE_BUDGET_PEER)), p) for p in peers
                   if p["peer"].startswith(COMPILE_BUDGET_PEER) and not p.get("oom")), key=lambda bp: bp[0])


def budget_peaks(peers: list[Result]) -> list[tuple[float, float]]:
    """(budget, peak MiB) of the compile-budget peers that ran, by budget."""
    return [(b, mib(p["peak_bytes"])) for b, p in compile_budgets(peers)]


def non_monotone(peaks: list[tuple[float, float]], tolerance: float = 0.01) -> tuple[float, float, float, float] | None:
    """A lower budget whose peak lies above a higher budget's (by more than ``tolerance``), the widest such pair."""
    pairs = [(lo[1] - hi[1], lo, hi) for i, lo in enumerate(peaks) for hi in peaks[i + 1:]
             if lo[1] > hi[1] * (1 + tolerance)]
    if not pairs:
        return None
    _, lo, hi = max(pairs)
    return lo[0], lo[1], hi[0], hi[1]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def memory_only(p: Result, compiled: bool) -> bool:
    """Whether a quoted peer is judged on memory only: a compile budget beside our eager plans (it compiles, they
    do not; its time is shown, not tallied)."""
    return not compiled and p["peer"].startswith(COMPILE_BUDGET_PEER)


def changes_gradients(p: Result) -> bool:
    """Whether the peer's checked gradients differ from the unplanned model's (``bench/peers.py``
    ``check_gradients``; unchecked rows, written before the check: False)."""
    return p.get("gradients_kept") is False


def _caveat(p: Result) -> str:
    """The peer's gradient check where it was made (else its note, as written)."""
    if "gradient_error" not in p:
        return p["note"][:60]
    if changes_gradients(p):
        return f"its gradients differ from the unplanned model's (error {p['gradient_error']:.2g})"
    return ""


def _peer_row(p: Result, compiled: bool = True) -> list[Any]:
    o, head = p["ours"], [p["peer"], f"{mib(p['peak_bytes']):.1f}", f"{_ms(p['step_seconds'])} ({_ms(p['spread_seconds'])})"]
    if o is None:
        return [*head, "none: no plan of ours measured this low", "", "", "", _caveat(p)]
    ratio = p["time_ratio_peer_over_ours"]
    verdict = ("compiled against eager: judged on memory" if memory_only(p, compiled) else "within the spreads"
               if not p["beyond_spread"] else "peer faster" if ratio < 1 else "ours faster")
    return [*head, o["plan"], f"{mib(o['peak_bytes']):.1f}{'' if o['fits'] else ' (above!)'}",
            f"{_ms(o['step_seconds'])} ({_ms(o['spread_seconds'])})", f"{ratio:.2f}x",
            verdict + (f"; {_caveat(p)}" if _caveat(p) else "")]


def peers_table(result: Result) -> str:
    out = []
    for w in result["workloads"]:
        q = w.get("quote")
        if q is None:
            continue
        b = q["baseline"]
        out += [f"**`{w['workload']}`** ({'compiled' if w['compiled'] else 'eager'} steps, {w['clock']} clock, "
                f"{q['samples_per_plan']} samples a plan in {q['rounds']} interleaved rounds, load "
                f"{q['load_average_1']:.1f}; baseline {mib(b['peak_bytes']):.1f} MiB, {_ms(b['step_seconds'])} "
                f"± {_ms(b['spread_seconds'])} ms)", "",
                table(["peer", "peak MiB", "step ms (spread)", "our fastest plan at no more memory", "MiB",
                       "step ms (spread)", "peer / ours", ""], [_peer_row(p, w["compiled"]) for p in q["peers"]],
                      "lrrlrrrl"), ""]
        out += _auto_sac_table(q)
    return "\n".join(out)


def _auto_sac_table(q: Result) -> list[str]:
    """auto-SAC's own estimates beside the quote's measurements (``bench/peers.py`` ``auto_sac_estimates``): its
    peak as a saving on its unplanned estimate against the measured saving on the baseline, its recompute time
    against the measured step less the baseline's."""
    rows = [[p["peer"], f"{mib(a['memory_budget_bytes']):.2f}", f"{mib(a['estimated_peak_bytes']):.2f}",
             f"{a['estimated_saving']:.0%}", f"{mib(p['peak_bytes']):.1f}", f"{a['measured_saving']:.0%}",
             _ms(a["estimated_recompute_seconds"]), _ms(a["measured_recompute_seconds"]), len(a["modules"])]
            for p in q["peers"] if (a := p.get("auto_sac"))]
    if not rows:
        return []
    how = next(p["auto_sac"]["estimated_on"] for p in q["peers"] if p.get("auto_sac"))
    return [f"auto-SAC's estimates against the measurement ({how}; its memory model leaves out the optimizer's "
            "state):", "",
            table(["peer", "ILP budget MiB", "estimated peak MiB", "estimated saving", "measured peak MiB",
                   "measured saving", "estimated recompute ms", "measured step - baseline ms", "modules"], rows), ""]


def _tally(q: Result, compiled: bool = True) -> tuple[list[Result], list[Result], list[Result]]:
    """The quoted peers ours is faster than beyond both spreads, within them of, slower than (not those judged on
    memory only: ``memory_only``)."""
    rows = [p for p in q["peers"] if p["ours"] is not None and not memory_only(p, compiled)]
    faster = [p for p in rows if p["beyond_spread"] and p["time_ratio_peer_over_ours"] > 1]
    slower = [p for p in rows if p["beyond_spread"] and p["time_ratio_peer_over_ours"] < 1]
    within = [p for p in rows if p not in faster and p not in slower]
    return faster, within, slower


def peers_summary(r: Result) -> list[str]:
    out = []
    for w in r["workloads"]:
        q = w.get("quote")
        if q is None:
            continue
        faster, within, slower = _tally(q, w["compiled"])
        ratios = [p["time_ratio_peer_over_ours"] for p in q["peers"] if p["ours"] is not None]
        lower = [p["peer"] for p in q["peers"] if p["ours"] is None]
        on_memory = [p for p in q["peers"] if memory_only(p, w["compiled"])]
        wins = ", ".join(f"{p['peer']} {p['time_ratio_peer_over_ours']:.2f}x" for p in slower
                         if not changes_gradients(p)) or "none"
        wrong = [f"{p['peer']} {p['time_ratio_peer_over_ours']:.2f}x" for p in slower if changes_gradients(p)]
        if wrong:
            wins += f"; faster but with gradients that differ from the unplanned model's: {', '.join(wrong)}"
        steps = "compiled steps" if w["compiled"] else "our plans in eager steps (the compile budgets compiled)"
        text = (f"`{w['workload']}`, {steps}: against {len(q['peers'])} peers, our fastest plan at no more memory is "
                f"faster beyond both spreads than {len(faster)}, within them of {len(within)}, slower than {len(slower)} "
                f"(peers that win: {wins})")
        if on_memory:
            budget_wins = [p for p in on_memory
                           if p["ours"] and p["beyond_spread"] and p["time_ratio_peer_over_ours"] < 1]
            text += (f"; the {len(on_memory)} compile budgets, compiled, are judged on memory only (their times "
                     f"beside our eager ones: faster beyond both spreads in {len(budget_wins)})")
        if ratios:
            text += f"; peer / ours from {min(ratios):.2f}x to {max(ratios):.2f}x"
        if lower:
            text += f"; no plan of ours as low as {', '.join(lower)}"
        bad = non_monotone(budget_peaks(q["peers"]))
        if bad:
            text += (f"; the compile budget's peak is not monotone: budget {bad[0]:.1f} peaks at {bad[1]:.1f} MiB, "
                     f"above budget {bad[2]:.1f}'s {bad[3]:.1f} MiB")
        out.append(text + f"; {q['samples_per_plan']} samples a plan, interleaved, apart from the search "
                          f"({w['clock']} clock, load {q['load_average_1']:.1f}).")
    return out


def peers_headlines(r: Result) -> list[Headline]:
    quotes = [(w, w["quote"]) for w in r["workloads"] if w.get("quote")]
    if not quotes:
        return []
    tally = [_tally(q, w["compiled"]) for w, q in quotes]
    n = sum(len(q["peers"]) for _, q in quotes)
    faster, within, slower = (sum(len(t[k]) for t in tally) for k in range(3))
    wrong = sum(changes_gradients(p) for t in tally for p in t[2])
    lower = sum(p["ours"] is None for _, q in quotes for p in q["peers"])
    on_memory = sum(memory_only(p, w["compiled"]) for w, q in quotes for p in q["peers"])
    steps = "compiled" if quotes[0][0]["compiled"] else "eager"
    loads = [q["load_average_1"] for _, q in quotes]
    return [Headline(f"Our fastest plan at no more memory than each peer, {steps} ({n} peers on {len(quotes)} workloads)",
                     f"faster beyond both spreads than {faster}, within them of {within}, slower than {slower}"
                     + (f" ({wrong} of them with gradients that differ from the unplanned model's)" if wrong else "")
                     + (f" (the {on_memory} compile budgets, compiled, judged on memory only)" if on_memory else "")
                     + (f"; {lower} peers lower than any plan of ours" if lower
                        else "; none lower than our lowest plan"),
                     measured(r, quotes[0][0]["clock"], max(loads)))]


def _verdict_in_words(verdict: str | None, ratio: float | None) -> str:
    if verdict is None:
        return ""
    return verdict if ratio is None or verdict in ("the same plan", "out of memory") else f"{verdict}, {ratio:.2f}x"


def default_checked_table(r: Result) -> str:
    """Per default search: its cost in baseline steps, and each peer's verdict in its report beside the quote's."""
    out = []
    for k, w in enumerate(r["workloads"], 1):
        q = w["quote"]
        said = {p["peer"]: p for p in w["peers"]}
        rows = []
        for p in q["peers"]:
            s = said.get(p["peer"], {})
            ours = p["ours"]
            quoted = (_verdict_in_words(p.get("verdict"), p.get("time_ratio_peer_over_ours")) if ours
                      else "the same plan" if s.get("verdict") == "the same plan" else "no plan of ours as low")
            rows.append((p["peer"], _verdict_in_words(s.get("verdict"), s.get("ratio")), quoted,
                         ("yes" if p.get("contradicted") else "no") if "contradicted" in p else "-"))
        steps = f"{w['baseline_steps']:.0f}" if w.get("baseline_steps") else "?"
        out += [f"Run {k}: {w['wall_seconds']:.0f} s = {steps} baseline steps of "
                f"{w['baseline']['step_seconds'] * 1e3:.1f} ms (load {w['load_average_1']:.1f} before it); quote: "
                f"{q['samples_per_plan']} samples a plan ({w['clock']} clock, load {q['load_average_1']:.1f}).", "",
                table(["peer", "the run's report (peer / ours)", "the quote apart (peer / ours)", "contradicted"],
                      rows), ""]
    return "\n".join(out)


def default_checked_summary(r: Result) -> list[str]:
    runs = [w for w in r["workloads"] if w.get("quote")]
    checked = [p for w in runs for p in w["quote"]["peers"] if "contradicted" in p]
    against = [p for p in checked if p["contradicted"]]
    steps = [w["baseline_steps"] for w in runs if w.get("baseline_steps")]
    confirmed = [p for p in checked if p["verdict"] == p["search_verdict"]]
    return [f"{len(runs)} default searches: {len(checked)} verdict{'s' * (len(checked) != 1)} of \"peer faster\" or "
            f"\"peer slower\" in their reports, each checked by a quote apart; {len(confirmed)} confirmed by it beyond "
            f"both spreads, {len(against)} contradicted"
            + (f"; each search took {min(steps):.0f}-{max(steps):.0f} baseline steps" if steps else "") + "."]


def peers_probe_table(r: Result) -> str:
    rows = [(x["name"], f"{x['peak_mb']:.2f}", f"{x['activation_mb']:.2f}", f"{x['step_ms']:.1f}", f"{x['spread_ms']:.1f}",
             "" if x["compile_s"] is None else f"{x['compile_s']:.1f}", x.get("note", "")[:60]) for x in r["rows"]]
    return (f"`{r['workload']}`, {r['repeats']} timed steps a row, {r['rows'][0]['clock']} clock.\n\n"
            + table(["row", "peak MiB", "activation MiB", "step ms", "spread ms", "cold compile s", "note"], rows,
                    "lrrrrrl"))


VIEWS = [
    View("peers", "Side by side with what users pick instead", "Peers measured by the search's own Evaluator in the "
         "same run as the searched plans (eager steps); against each, our fastest frontier plan at no more memory, "
         "chosen on the search's measurements. The table quotes fresh measurements: one Evaluator apart from the "
         "search times the baseline, every peer and every chosen plan of ours alike, in interleaved rounds (spread: "
         "max - min of a plan's samples; a ratio whose difference is within the two spreads says so). The figure "
         "shows the search's own measurements. Each peer's gradients are checked against the unplanned model's "
         "(one step from the same RNG state, dropout on); a peer that changes them (torch 2.13's compile budgets "
         "below 1.0 on models with dropout, pytorch/pytorch#190758) is shown, and not counted among those that win.",
         "python bench/peers.py", peers_table, peers_summary, peers_headlines),
    View("peers_compiled", "Peers, compiled training", "As above with `--compile`: every plan applied, then the model "
         "compiled; compile time is reported apart. The `?dropout=0` rows are models of the rows above without "
         "dropout, where the compile budgets keep the gradients, so that every budget there counts against our plans.",
         "python bench/peers.py --compile", peers_table, peers_summary,
         peers_headlines),
    View("peers_default", "The default search's verdicts, checked", "The README's first command as it is "
         "(`python -m search.run`, its default peers), run several times; the verdict its report gives each peer "
         "(faster or slower only beyond both spreads, else within noise) beside a quote apart: one fresh Evaluator "
         "measures the peer and the plan the report answered it with in interleaved rounds. A verdict is "
         "contradicted where the quote says the opposite beyond both spreads.",
         "python bench/peers.py --default --workloads gpt/small gpt/small gpt/small gpt/small gpt/small --rounds 5",
         default_checked_table, default_checked_summary),
    View("peers_probe", "Compiled training, probed", "Peak and step time of one workload eager (no checkpointing, "
         "our recompute-all plan) and compiled (`activation_memory_budget` per row, our recompute-all plan applied "
         "then compiled), each compiled row from an empty inductor cache, rows measured one after the other.",
         "python bench/peers_probe.py", peers_probe_table),
]

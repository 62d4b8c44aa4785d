"""The report's throughput section: per memory cap, our answer against what users do, as quoted."""

from __future__ import annotations

from env.data.types import MIB
from search.records.markdown import table_lines
from search.records.throughput import CapRow, ThroughputCurve, ThroughputPoint


def _rate(p: ThroughputPoint) -> str:
    tokens = f" ({p.tokens_per_second:,.0f} tokens/s)" if p.tokens_per_second else ""
    return f"{p.samples_per_second:.1f}{tokens}"


def _row(p: ThroughputPoint, ours: ThroughputPoint | None) -> tuple[object, ...]:
    name = f"**ours**: {p.label}" if p.name == "ours" else p.label
    against = f"{p.samples_per_second / ours.samples_per_second:.2f}x" if ours and ours.samples_per_second else "-"
    return (name, p.micro_batch, p.accumulation, f"{p.peak_bytes / MIB:.1f}",
            f"{p.step_seconds * 1e3:.1f} ± {p.spread_seconds * 1e3:.1f}", _rate(p), against)


def cap_markdown(row: CapRow, rounds: int) -> list[str]:
    """One cap's table: ours first, then each peer at the largest micro-batch it fits, as quoted."""
    lines = [f"### Cap {row.cap_bytes / MIB:.1f} MiB", ""]
    if row.answer is None:
        return lines + [row.why, ""]
    lines += table_lines(("configuration", "micro-batch", "accumulation", "peak MiB", "step ms (± spread)", "samples/s",
                          "against ours"), [_row(p, row.answer) for p in row.quote])
    lines.append("")
    if row.unfit:
        lines += ["Fit nowhere under this cap: " + "; ".join(f"{k}: {v}" for k, v in row.unfit.items()) + ".", ""]
    sel, best = row.selected, row.model_optimal
    if sel is not None:
        lines.append(f"Chosen on {sel.n_samples} timed steps at {_rate(sel)} samples/s, side by side with the "
                     "other finalists and then in a run-off with the runner-up; the table's numbers are "
                     f"{rounds} later measurements of each configuration, in interleaved rounds.")
    if best is not None:
        lines.append(f"Model-optimal (exact solver on the fitted cost model, predicted): {best.label} at micro-batch "
                     f"{best.micro_batch}, {best.samples_per_second:.1f} samples/s, peak "
                     f"{best.peak_bytes / MIB:.1f} MiB.")
    if row.by_proposer:
        names = {"exact": "the exact solver's", "agent": "the agent's"}
        said = [f"{names.get(who, who)} {p.label} at micro-batch {p.micro_batch}, {_rate(p)} samples/s"
                for who, p in sorted(row.by_proposer.items())]
        agent, exact = row.by_proposer.get("agent"), row.by_proposer.get("exact")
        ratio = (f" (agent / exact: {agent.samples_per_second / exact.samples_per_second:.2f}x)"
                 if agent and exact and exact.samples_per_second else "")
        lines.append("Best measured by who proposed it, quoted with the table: " + "; ".join(said) + ratio + ".")
    return lines + [""]


def predicted_markdown(curve: ThroughputCurve) -> list[str]:
    """Each cap's answer as the model priced it when the search chose it, beside the quote's samples per second."""
    rows = []
    for r in sorted(curve.caps, key=lambda r: r.cap_bytes):
        a = r.answer
        if a is None or not r.fit_seconds or not r.predicted_seconds or not a.samples_per_second:
            continue  # no answer, or a run recorded before the predictions were
        predicted = a.micro_batch / r.predicted_seconds
        rows.append((f"{r.cap_bytes / MIB:.1f}", a.label, a.micro_batch, f"{a.micro_batch / r.fit_seconds:.1f}",
                     f"{predicted:.1f}", f"{a.samples_per_second:.1f}", f"{predicted / a.samples_per_second:.2f}x"))
    if not rows:
        return []
    return ["### Predicted against measured", "",
            "Each cap's answer in samples per second as the model priced it when the search chose it: the per-unit "
            "fit alone, and scaled by the steps timed at the nearest micro-batch measured (what the search ranks by), "
            "beside the quote's measurements of it.", "",
            *table_lines(("cap MiB", "answer", "micro-batch", "fit alone", "predicted", "measured",
                          "predicted / measured"), rows, "rlrrrrr"), ""]


def throughput_markdown(curve: ThroughputCurve) -> list[str]:
    """The section: how the search was set up, a table per cap, and the fit's checks."""
    accumulation = (f" Global batch {curve.global_batch}: a micro-batch takes ceil({curve.global_batch} / micro-batch) "
                    f"accumulation steps, and its peak counts the gradients ({curve.gradient_bytes / MIB:.1f} MiB) "
                    "kept between them." if curve.global_batch else "")
    lines = ["## Throughput under memory caps", "",
             f"The fastest (plan, micro-batch) per cap by measured samples per second, beside what users do, each at "
             f"the largest micro-batch it fits. Micro-batches searched: {', '.join(map(str, curve.micro_batches))} "
             f"(the workload's own: {curve.default_micro_batch}; changed through {curve.batching}).{accumulation}"
             + (f" Measured by {curve.evaluators} Evaluators side by side, each one measurement at a time."
                if curve.evaluators > 1 else ""), ""]
    lines += predicted_markdown(curve)
    for row in sorted(curve.caps, key=lambda r: r.cap_bytes):
        lines += cap_markdown(row, curve.quote_rounds)
    if curve.not_fitting:
        lines += ["Measured as not fitting this device (an allocation of the step failed, or the kernel killed the "
                  "Evaluator measuring it, twice): " + "; ".join(curve.not_fitting) + ".", ""]
    if curve.fit_checks:
        lines += ["### The cost model in the micro-batch", "",
                  "Per-unit lines through the profiles at micro-batches "
                  f"{', '.join(map(str, curve.profiled_batches))}; each row a plan measured at a micro-batch against "
                  "the fit's prediction there. Steps are timed up to the largest micro-batch profiled, and above it "
                  "where the quote measured the plan; elsewhere the peak alone was measured.", ""]
        lines += table_lines(
            ("micro-batch", "plan", "fitted there", "predicted MiB", "measured MiB", "peak error", "predicted ms",
             "measured ms", "time error"),
            [(c.micro_batch, c.plan, "yes" if c.fitted else "no", f"{c.predicted_peak_bytes / MIB:.2f}",
              f"{c.measured_peak_bytes / MIB:.2f}", f"{c.predicted_peak_bytes / c.measured_peak_bytes - 1:+.1%}",
              f"{c.predicted_seconds * 1e3:.1f}")
             + ((f"{c.measured_seconds * 1e3:.1f}", f"{c.predicted_seconds / c.measured_seconds - 1:+.1%}")
                if c.measured_seconds is not None else ("peak alone", "")) for c in curve.fit_checks], "rllrrrrrr")
    return lines

"""Views of ``bench/gpu.py``'s results (``gpu_*.json``), the "On a GPU" part of BENCHMARKS.md."""

from __future__ import annotations

from bench.views.base import Result, View, mib, table
from bench.views.peers import peers_table
from bench.views.plans import fidelity_table, premium_table

GPU_COMMAND = "python bench/gpu.py"


def gpu_tests_table(r: Result) -> str:
    failed = [t["test"] for t in r["tests"] if t["outcome"] in ("failure", "error")]
    out = [table(["passed", "failed", "skipped"], [(r["passed"], r["failed"], r["skipped"])], "rrr")]
    return "\n".join(out + ([""] + [f"- failed: `{t}`" for t in failed] if failed else []))


def gpu_offload_table(r: Result) -> str:
    out = []
    for w in r["workloads"]:
        rows = [(x["plan"], f"{100 * x['peak_saving']:.0f}%", f"{100 * x['activation_saving']:.0f}%",
                 f"{100 * x['slowdown']:+.1f}%", f"{1e3 * x['step_seconds']:.1f}", f"{1e3 * x['spread_seconds']:.1f}")
                for x in w["rows"]]
        out += [f"`{w['workload']}` ({w['n_units']} units, batch {w['batch_shape']}; "
                f"{mib(w['offloaded_bytes_per_step']):.0f} MiB offloaded a step)", "",
                table(["plan", "peak saved", "activation memory saved", "step time", "step ms", "spread ms"], rows), ""]
    return "\n".join(out)


def gpu_search_table(r: Result) -> str:
    stopped = "stopped at the budget (resumable)" if r["stopped_at_budget"] else f"exit code {r['exit_code']}"
    out = [f"`python {r['command']}`: {stopped} after {r['wall_seconds']:.0f} s; the run wrote "
           + ", ".join(f"`{f}`" for f in r["run_files"]) + "."]
    if r.get("report_md"):  # the run's own report, its headings under this section's
        out += ["", *[("###" + line if line.startswith("#") else line) for line in r["report_md"].splitlines()]]
    return "\n".join(out)


# selective's fix for calls that draw random numbers (commit 01d5c28): GPU figures with selective written before
# it were measured with selective changing the gradients (the fused attention drew its own dropout mask)
SELECTIVE_FIXED_AT = "2026-12-04 18:09:06"


def gpu_summary_line(r: Result) -> str:
    """What ``bench/gpu.py`` did, step by step, on which device and when; results written before selective's
    fix say their selective figures were measured with the bug."""
    steps = "; ".join(f"{k} {v['status']}" + (f" ({v['why']})" if v.get("why") else "")
                      + (f" at {v['run'][11:16]}" if v.get("run") else "") for k, v in r["steps"].items())
    calls = f" in {len(r['calls'])} calls" if len(r.get("calls", [])) > 1 else ""
    line = f"`{GPU_COMMAND}` on {r['device']}{calls}, {r.get('written_at', '')}: {steps}."
    if r.get("written_at", "") < SELECTIVE_FIXED_AT:
        line += (" Every figure below with `selective` was measured before its fix for calls that draw random numbers "
                 "(01d5c28: on CUDA the fused attention drew its own dropout mask, and selective changed the "
                 "gradients); they stand until a GPU measures them again.")
    return line


VIEWS = [
    View("gpu_tests", "GPU tests", "`pytest -m gpu`: measurement, profile and OOM on CUDA, offload, gradients.",
         GPU_COMMAND, gpu_tests_table),
    View("gpu_fidelity", "Cost-model fidelity on a GPU", "Predicted against measured peak and step time on random "
         "plans, at the built-in default sizes.", GPU_COMMAND, fidelity_table),
    View("gpu_premium", "The checkpointing premium on a GPU", "As on the CPU, on the workload each row names.",
         GPU_COMMAND, premium_table),
    View("gpu_peers", "Side by side with the peers on a GPU", "`python -m search.run --peers all` at the workload's "
         "size, then the peers and our fastest plan at no more memory than each quoted apart from the search on the "
         "same GPU, in interleaved rounds, each peer's gradients checked.", GPU_COMMAND, peers_table),
    View("gpu_offload", "Offload on a GPU", "Every unit offloaded with copies on a side stream (`env.runtime.offload`) "
         "against the blocking `save_on_cpu`, recompute and keep, measured in interleaved rounds.", GPU_COMMAND,
         gpu_offload_table),
    View("gpu_search", "A default search on a GPU", "`python -m search.run --device cuda`, time-boxed.", GPU_COMMAND,
         gpu_search_table),
]

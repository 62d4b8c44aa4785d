"""One view per result file: how BENCHMARKS.md, the README's headline table and the scripts show it.

``SECTIONS`` lists the views in BENCHMARKS.md's order, ``GPU_SECTIONS`` those of ``bench/gpu.py``'s
results; ``markdown(name, result)`` is a result's section body, as its script prints it.
"""

from __future__ import annotations

from bench.views import agents, gpu, peers, plans, search, throughput
from bench.views.base import Headline, Result, View

_ALL = {v.name: v for module in (search, peers, agents, plans, gpu, throughput)
        for v in module.VIEWS}
ORDER = ("default_run", "compiled_search", "reported_vs_quote", "throughput", "fsdp", "peers", "peers_default", "peers_compiled", "peers_probe", "agents_search", "agents_scale",
         "dynamic", "evaluator_pool", "search_quality", "search_quality_seed1", "premium", "search_cost", "frontier_table",
         "measured_table", "chains", "fidelity", "units_table", "warmup", "env_speed")
SECTIONS: list[View] = [_ALL[name] for name in ORDER]
GPU_SECTIONS: list[View] = [*gpu.VIEWS, _ALL["gpu_throughput"]]
VIEWS: dict[str, View] = {v.name: v for v in SECTIONS + GPU_SECTIONS}


def markdown(name: str, result: Result) -> str:
    """The result's section body (summary and tables), as BENCHMARKS.md shows it."""
    if name not in VIEWS:
        return f"(no view renders {name}.json; add one to bench/views)"
    return VIEWS[name].body(result)


__all__ = ["GPU_SECTIONS", "Headline", "SECTIONS", "VIEWS", "View", "markdown"]

"""Search orchestration, run store, frontier file and plan export.

``from search import auto_checkpoint`` (one call: a plan measured and applied) and ``from search import
apply_plan`` (a searched plan) are the entry points for training code. Attributes are
imported lazily, so ``import search`` stays light (no torch, Ray or Streamlit until used).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "apply_plan": "search.training.apply",
    "auto_checkpoint": "search.training.auto",
    "AutoCheckpoint": "search.training.auto",
    "read_plan": "search.training.apply",
    "DynamicPlan": "search.training.dynamic",
    "load_frontier": "search.records.frontier_file",
    "write_frontier": "search.records.frontier_file",
    "FrontierFile": "search.records.frontier_file",
    "FrontierPoint": "search.records.frontier_file",
    "plan_snippet": "search.training.snippet",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'search' has no attribute '{name}'")

"""Search orchestration, run store, frontier file and plan export.

``from search import apply_plan`` is the entry point for training code. Attributes are
imported lazily, so ``import search`` stays light (no torch, Ray or Streamlit until used).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "apply_plan": "search.apply",
    "read_plan": "search.apply",
    "DynamicPlan": "search.dynamic",
    "load_frontier": "search.frontier_file",
    "write_frontier": "search.frontier_file",
    "FrontierFile": "search.frontier_file",
    "FrontierPoint": "search.frontier_file",
    "plan_snippet": "search.snippet",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'search' has no attribute '{name}'")

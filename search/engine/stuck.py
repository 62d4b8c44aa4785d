"""Where a busy Evaluator's process is now: the module whose forward it is in, or the user's function.

The driver asks this (``Evaluator.where``, run in a concurrency group of its own, so that it answers while a
measurement runs) when a remote call passes its deadline (``search.engine.deadlines``), so that the line the
user sees names the stage: ``in the forward of unit blocks.1 (Block.forward, my_model.py:21)``, or ``in make
(my_model.py:30)`` for a factory that never returns.
"""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType

import torch.nn as nn

__all__ = ["where_stuck"]

_LIBRARIES = (os.path.dirname(os.path.dirname(nn.__file__)), os.path.dirname(os.__file__))  # torch's, Python's
_PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def where_stuck(model: nn.Module | None, units: list[str], busy_in: str) -> str:
    """Where the thread running one of this process's calls (a frame of a file named ``busy_in``) is now: the
    innermost module forward of ``model`` on its stack, named as a unit where it is one or in one, and the
    innermost frame of the user's code; an empty string where no thread is busy."""
    names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
    me = threading.get_ident()
    for ident, top in sys._current_frames().items():
        stack = _frames(top)
        if ident == me or not any(f.f_code.co_filename.endswith(busy_in) for f in stack):
            continue
        module = next((names[id(s)] for f in reversed(stack) if f.f_code.co_name == "forward"
                       and id(s := f.f_locals.get("self")) in names), None)
        user = next((f for f in reversed(stack) if _is_user(f.f_code.co_filename)), None)
        at = f"{user.f_code.co_name} ({os.path.basename(user.f_code.co_filename)}:{user.f_lineno})" if user else ""
        if module is None:
            return f"in {at}" if at else ""
        unit = next((u for u in units if module == u or module.startswith(u + ".")), None)
        what = f"unit {unit}" if unit == module else (f"module {module or '(the model)'}"
                                                      + (f" of unit {unit}" if unit else ""))
        return f"in the forward of {what}" + (f", at {at}" if at else "")
    return ""


def _frames(top: FrameType | None) -> list[FrameType]:
    """A thread's frames, outermost first."""
    out = []
    while top is not None:
        out.append(top)
        top = top.f_back
    return out[::-1]


def _is_user(path: str) -> bool:
    """A file of the user's code: not Python's, not a library's, not this project's."""
    path = os.path.abspath(path)
    return not (path.startswith(_LIBRARIES) or "site-packages" in path or path.startswith(_PROJECT + os.sep + "env")
                or path.startswith(_PROJECT + os.sep + "search") or path.startswith("<"))

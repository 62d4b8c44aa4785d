"""The plans ``auto_checkpoint`` chose, kept on disk so that the next start applies them without measuring.

One small JSON file per (model fingerprint, batch shape, device, precision), under ``cache_dir`` (default
``~/.cache/ckpt-search``, or ``$CKPT_SEARCH_CACHE``): the unplanned step's measured peak and time (a
fractional budget resolves against it) and, per budget in bytes, the plan chosen with its measured peak, step
time and gate verdict. Another batch shape, device or precision is another file, and is measured afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pydantic import BaseModel, ValidationError

from env.data.plan import Plan
from env.data.plan_check import PlanCheck

CACHE_VERSION = 1


def default_cache_dir() -> Path:
    return Path(os.environ.get("CKPT_SEARCH_CACHE", Path.home() / ".cache" / "ckpt-search"))


class CacheKey(BaseModel):
    """What a cached choice is valid for."""

    model: str  # the model's class and env.data.plan.fingerprint over its parameters
    batch_shape: str
    device: str  # the device model (a GPU's name; 'cpu')
    precision: str
    setup: str = ""  # the loss and optimizer the steps were measured with

    def digest(self) -> str:
        body = json.dumps({"v": CACHE_VERSION, **self.model_dump()}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


class Choice(BaseModel):
    """One budget's answer: the plan applied, as measured, and its gate verdict."""

    plan: Plan
    units: list[str]
    peak_bytes: int
    step_seconds: float
    check: PlanCheck


class CacheEntry(BaseModel):
    key: CacheKey
    unplanned_peak_bytes: int
    unplanned_step_seconds: float
    choices: dict[str, Choice] = {}  # by budget bytes (as a string: JSON keys)


class PlanCache:
    """The cache folder: ``load(key)`` an entry (None: none, or unreadable), ``save(entry)``."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = Path(folder).expanduser() if folder is not None else default_cache_dir()

    def path(self, key: CacheKey) -> Path:
        return self.folder / f"auto-{key.digest()}.json"

    def load(self, key: CacheKey) -> CacheEntry | None:
        path = self.path(key)
        try:
            entry = CacheEntry.model_validate_json(path.read_text())
        except (OSError, ValidationError, ValueError):
            return None  # no file, or one an older version wrote: measured again and rewritten
        return entry if entry.key == key else None

    def save(self, entry: CacheEntry) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(entry.key)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(entry.model_dump_json(indent=1))
        tmp.replace(path)  # whole or not at all
        return path

"""Where a search's wall time goes: seconds per phase, kept in the store as they are spent."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

from search.records import meta
from search.records.store import RunStore


class PhaseClock:
    """Wall seconds per phase (Ray start, profile, rules, training, measuring, deciding passes, ...),
    written to the store's ``phase_seconds`` as each phase ends; a resumed run adds to its own."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.seconds: dict[str, float] = dict(store.read(meta.PHASE_SECONDS))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.store.write(meta.PHASE_SECONDS, self.seconds)

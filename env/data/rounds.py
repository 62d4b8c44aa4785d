"""Orders of measurement in rounds: a change of machine load over a run falls on every plan compared alike.

- ``rotated``: each round starts one further on, so none always goes first (the profiler's actions).
- ``serpentine``: forward in even rounds, backward in odd ones, so over a pair of rounds every item sits as
  far from the start on average.
- ``interleaved``: every job run once a round for some rounds, in one of those orders, each job's
  measurements merged into one ``MeasuredPlan`` (``MeasuredPlan.merged``). Torch-free.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from env.data.measured import MeasuredPlan

T = TypeVar("T")


def rotated(items: Sequence[T], round_: int) -> list[T]:
    """``items`` in round ``round_``'s order: each round starts one further on, so none always goes first."""
    k = round_ % len(items) if items else 0
    return [*items[k:], *items[:k]]


def serpentine(items: Sequence[T], round_: int) -> list[T]:
    """``items`` forward in even rounds and backward in odd ones: over a pair of rounds every item
    sits as far from the start on average, so a drift over a round's minutes reaches all alike."""
    return list(items) if round_ % 2 == 0 else list(reversed(items))


def interleaved(jobs: dict[str, Callable[[], MeasuredPlan]], rounds: int,
                order: Callable[[Sequence[str], int], list[str]] = rotated) -> dict[str, MeasuredPlan]:
    """Every job run once a round for ``rounds`` rounds, in ``order``; each name's measurements merged, in the
    jobs' order."""
    got: dict[str, MeasuredPlan] = {}
    for r in range(rounds):
        for name in order(list(jobs), r):
            m = jobs[name]()
            got[name] = got[name].merged(m) if name in got else m
    return {name: got[name] for name in jobs}

"""One measurement from the ranks of a process group (FSDP): the largest rank's peak, the slowest rank's time.

A plan measured under FSDP runs on every rank of the group at once, each rank on its shard of the
parameters, gradients and optimizer state and on its own batch. What has to fit is the largest
rank's peak; a step lasts as long as its slowest rank (the ranks meet in every collective), so each
timed step is the slowest rank's time of that step. ``merge_ranks`` makes one ``MeasuredPlan`` of
the ranks' records, whose device and clock say that they are per rank of ``n`` ranks, and
``binding_profile`` picks the profile a search of per-rank bytes uses. Torch-free.
"""

from __future__ import annotations

from typing import Sequence

from env.data.errors import MeasurementError
from env.data.measured import MeasuredPlan
from env.data.model_profile import ModelProfile


def rank_device(device: str, ranks: int) -> str:
    """The device a group's measurement names: the ranks' own, and how many of them."""
    return f"{device}, FSDP2 x{ranks} ranks"


def rank_clock(clock: str, ranks: int) -> str:
    """The clock a group's measurement names: the ranks' own clock, of the slowest rank."""
    return f"{clock}, slowest of {ranks} ranks"


def split_rank_clock(clock: str) -> tuple[str, int | None]:
    """(the ranks' own clock, how many ranks) of a clock ``rank_clock`` named; (clock, None) for any other."""
    base, found, rest = clock.partition(", slowest of ")
    if found and rest.endswith(" ranks") and rest[:-len(" ranks")].isdigit():
        return base, int(rest[:-len(" ranks")])
    return clock, None


def merge_ranks(records: Sequence[MeasuredPlan]) -> MeasuredPlan:
    """One record of a plan measured on every rank of a group: the largest rank's peak (and what was live
    before its step), per timed step the slowest rank's seconds, out of memory if any rank was (asking for the
    most bytes that a rank's failed allocation asked for)."""
    if not records:
        raise MeasurementError("no rank measured the plan; a group measures with one rank at least")
    first = records[0]
    timed = sorted({len(r.step_seconds_samples) for r in records if not r.oom})
    if len(timed) > 1:
        raise MeasurementError(f"the ranks timed plan {first.digest} in different numbers of steps ({timed}); every "
                               "rank must time the same steps, which the ranks take together")
    odd = [r for r in records if (r.digest, r.clock, r.device) != (first.digest, first.clock, first.device)]
    if odd:
        raise MeasurementError(f"the ranks measured different things (plan {first.digest} by the {first.clock} clock "
                               f"on {first.device}, and plan {odd[0].digest} by the {odd[0].clock} clock on "
                               f"{odd[0].device}); every rank must measure the same plan the same way")
    n = len(records)
    largest = max(records, key=lambda r: r.peak_bytes)
    reserved = [r.peak_reserved_bytes for r in records if r.peak_reserved_bytes is not None]
    oom = any(r.oom for r in records)
    samples = [] if oom else [max(step) for step in zip(*(r.step_seconds_samples for r in records))]
    asked = [r.requested_bytes for r in records if r.oom and r.requested_bytes is not None]
    return first.model_copy(update={
        "peak_bytes": largest.peak_bytes, "live_before_bytes": largest.live_before_bytes,
        "requested_bytes": max(asked) if asked else None,
        "peak_reserved_bytes": max(reserved) if reserved else None, "step_seconds_samples": samples, "oom": oom,
        "clock": rank_clock(first.clock, n), "device": rank_device(first.device, n)})


def binding_profile(profiles: Sequence[ModelProfile]) -> tuple[int, ModelProfile]:
    """(rank, profile) of the rank whose measured baseline peak is the largest (the first on a tie): the
    rank whose bytes decide whether a plan fits, which the cost model, the solver and the agents then price.
    Its baseline becomes the ranks' baselines merged (``merge_ranks``), as every later measurement is."""
    if not profiles:
        raise MeasurementError("no rank profiled the workload; a group profiles with one rank at least")

    def peak(p: ModelProfile) -> int:
        return p.baseline.peak_bytes if p.baseline is not None else p.base_bytes

    rank = max(range(len(profiles)), key=lambda r: (peak(profiles[r]), -r))
    baselines = [p.baseline for p in profiles if p.baseline is not None]
    if len(baselines) < len(profiles):
        return rank, profiles[rank]
    return rank, profiles[rank].model_copy(update={"baseline": merge_ranks(baselines)})

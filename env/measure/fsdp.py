"""FSDP2 for measurement: a process joins its group, and a workload is sharded with ``fully_shard``.

Each rank builds the same workload from the same seed (the same weights before sharding) and steps
on the workload's own batch: under FSDP the batch is per rank. ``shard_workload`` puts
``fully_shard`` on every decision unit and then on the root (the parameters outside the units:
embeddings, head), as torchtitan shards its blocks, and gives the workload a fresh optimizer over the
shards. What each rank then holds before a step is its shard of the parameters, gradients and
optimizer state; what it gathers during the step (a unit's parameters, before its forward and again
before its backward) shows in its allocations, so ``env.measure.measurement.measure`` and
``env.measure.profiler.profile`` read per-rank bytes from a rank as they read a single device.

The order is checkpointing inside, sharding outside. A plan's wrapper (``env.runtime.apply``) is a
unit's instance ``forward``, which FSDP2's hooks in ``__call__`` surround: the unit's parameters are
gathered before its checkpointed forward and before its backward, where the recompute runs on them.
So a plan installed before ``fully_shard`` or after it composes the same way (``tests/test_fsdp.py``
checks the gradients of both).

Backends: gloo on CPU, NCCL on GPU (one GPU per rank). The ranks of a group run on one node and meet
on loopback. On gloo, FSDP2's all-gathers and reduce-scatters go through ``ReleasedCollective``s, so
that every buffer of a collective is freed by the measuring thread, where the profiler sees the free
(see ``ReleasedCollective`` and docs/measurement.md#fsdp): a rank's peak is then the same every step.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from env.data.errors import MeasurementError, PlanError, WorkloadError
from env.measure.timeline import train_step
from env.workloads.precision import fsdp_mixed_precision
from env.workloads.workload import Workload

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
LOOPBACK = "127.0.0.1"
GROUP_TIMEOUT_S = 600.0  # a collective that waits longer than this for a rank fails instead of hanging


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on now, for a group's rendezvous (rank 0 takes it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def join_group(rank: int, ranks: int, port: int, device: str, host: str = LOOPBACK,
               timeout_s: float = GROUP_TIMEOUT_S) -> torch.device:
    """Join the process group of ``ranks`` ranks that meets at ``host:port`` as ``rank``; the device this rank
    measures on (a GPU rank sees one GPU, its own)."""
    kind = torch.device(device).type
    if kind not in BACKENDS:
        raise MeasurementError(f"FSDP measures on cpu or cuda, not on '{device}'; use --device cpu or cuda")
    if not dist.is_available():
        raise MeasurementError("this torch build has no torch.distributed; install a build with it to use --fsdp")
    target = torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device("cpu")
    if dist.is_initialized():
        return target
    dist.init_process_group(BACKENDS[kind], init_method=f"tcp://{host}:{port}", rank=rank, world_size=ranks,
                            timeout=timedelta(seconds=timeout_s), device_id=target if kind == "cuda" else None)
    return target


def leave_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shard_workload(workload: Workload, units: list[str]) -> Workload:
    """The workload with ``fully_shard`` on each unit (but one whose parameters are tied to the root's alone,
    left to the root's group) and on the root, with ``-mixed`` precision's ``MixedPrecisionPolicy``, over every rank of the group, and a
    fresh optimizer over the shards, after one training step. A model that ``fully_shard`` refuses, or that
    fails its first sharded step (FSDP2 checks some things, tied parameters across units among them, when
    the step first runs), is one ``WorkloadError`` line."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = workload.model
    if next(model.parameters(), None) is None:
        raise WorkloadError(f"workload '{workload.spec}' has no parameters to shard; run it without --fsdp")
    mesh = init_device_mesh(workload.device.type, (dist.get_world_size(),))
    policy = fsdp_mixed_precision(workload.precision)  # bf16-mixed: parameters gathered in bf16, as users train
    model.zero_grad(set_to_none=True)
    for fqn in [u for u in dict.fromkeys(units) if u and not _tied_to_the_root(model, u, units)] + [""]:
        try:
            fully_shard(model.get_submodule(fqn), mesh=mesh, **({"mp_policy": policy} if policy else {}))
        except Exception as e:  # the model's structure, not a bug here: say which module and why
            raise _unshardable(workload, f"fully_shard on '{fqn or 'the root'}'", e) from e
    release_collectives(model)
    sharded = dataclasses.replace(workload)  # a new Workload: its optimizer is made on first use, over the shards
    try:
        train_step(sharded, sharded.optimizer)  # the same model stepped unsharded (the unit choice): sharding failed
    except PlanError:  # the plan, not the model: its own line
        raise
    except Exception as e:
        raise _unshardable(workload, "its first sharded training step", e) from e
    return sharded


def _tied_to_the_root(model: nn.Module, unit: str, units: list[str]) -> bool:
    """Whether a parameter of ``unit`` is also registered outside it, and only outside every unit (a tied head:
    gpt's ``lm_loss.head`` and ``wte``): FSDP2 needs tied parameters in one group, so such a unit is left to the
    root's. Parameters tied between two units are left to ``fully_shard``, which refuses them."""
    inside = {id(p) for p in model.get_submodule(unit).parameters()}
    elsewhere = [name for name, p in model.named_parameters(remove_duplicate=False)
                 if id(p) in inside and not name.startswith(unit + ".")]
    return bool(elsewhere) and not any(name.startswith(u + ".") for name in elsewhere for u in units if u)


def _unshardable(workload: Workload, where: str, error: Exception) -> WorkloadError:
    return WorkloadError(f"workload '{workload.spec}' cannot be trained sharded with FSDP2: {where} raised "
                         f"{type(error).__name__}: {error}; run it without --fsdp, or choose units that own their "
                         "parameters (--units)")


class ReleasedCollective:
    """FSDP2's all-gather or reduce-scatter (``kind``) on gloo, returning only once its buffers are held by no
    one else than before it (their use counts are back; at most ``RELEASE_WAIT_S``).

    gloo's worker thread holds a collective's tensors until it has moved on; when it lets go last, the free
    happens on that thread, outside the profiler's view (which records the threads that carry the step's
    profiler state), and the buffer looks alive to the end of the step: on gpt/tiny a rank's peak was one
    block's parameters higher in about one step of three. Waiting here leaves the free to the measuring
    thread. gloo's own reduce-scatter also clones its input into the work and frees the clone there, so
    the reduce-scatter runs as an in-place all-reduce of the input and a copy of this rank's part (more
    bytes moved, which the measuring thread's clock does not count; no clone, as NCCL needs none).
    Installed by ``release_collectives`` through ``FSDPModule.set_custom_all_gather`` /
    ``set_custom_reduce_scatter``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)  # as FSDP2's default

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any = None, async_op: bool = False) -> dist.Work | None:
        held = [output_tensor, input_tensor, output_tensor.untyped_storage(), input_tensor.untyped_storage()]
        before = [_use_count(h) for h in held]
        if self.kind == "all_gather":
            work = dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
            if async_op:
                return work
        else:  # gloo's own reduce-scatter clones the input, and its worker frees the clone out of the profiler's view
            dist.all_reduce(input_tensor, op=op, group=group)
            output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()])
        deadline = time.monotonic() + RELEASE_WAIT_S
        while any(_use_count(h) > n for h, n in zip(held, before)) and time.monotonic() < deadline:
            os.sched_yield()
        return None


RELEASE_WAIT_S = 5.0


def _use_count(held: torch.Tensor | torch.UntypedStorage) -> int:
    """References to a tensor (gloo's worker holds the tensors it was given) or to a storage (and its views)."""
    if isinstance(held, torch.Tensor):
        return held._use_count()
    return torch._C._storage_Use_Count(held._cdata)


def release_collectives(model: nn.Module) -> bool:
    """On gloo, every FSDP module of ``model`` runs its collectives as ``ReleasedCollective``s; whether it could
    (an FSDP2 without custom collectives cannot)."""
    from torch.distributed.fsdp import FSDPModule

    if dist.get_backend() != "gloo" or not hasattr(FSDPModule, "set_custom_reduce_scatter"):
        return False
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_custom_all_gather(ReleasedCollective("all_gather"))  # type: ignore[arg-type]
            m.set_custom_reduce_scatter(ReleasedCollective("reduce_scatter"))  # type: ignore[arg-type]
    return True


def sharded_modules(model: nn.Module) -> list[str]:
    """FQNs of the modules ``fully_shard`` has wrapped ('' for the root), in module order."""
    from torch.distributed.fsdp import FSDPModule

    return [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]

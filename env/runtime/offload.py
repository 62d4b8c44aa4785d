"""The ``offload`` action: a unit's saved activations wait in pinned host memory, copied beside compute.

``torch.autograd.graph.save_on_cpu`` copies each saved tensor on the compute stream, so every
copy stalls the step. Here (after torchtune's ``OffloadActivations`` and Megatron's fine-grained
offload) the copies run on a side CUDA stream, ordered against compute with events:

forward, per tensor the unit saves for backward (larger than ``MIN_OFFLOAD_BYTES``; parameters,
views of parameters and the unit's buffers are saved as they are):
    the side stream waits for the compute stream (the tensor is written), copies it into a pinned
    host buffer (``non_blocking``) and records an event; the copy runs while the rest of the
    unit computes. When the unit's forward returns, the compute stream waits for its last copy
    and the device tensors are let go, so the caching allocator reuses their memory in stream
    order, never while a copy still reads it. (``record_stream`` would free them sooner, but its
    frees land when the host next notices, which makes the peak depend on timing; releasing at
    the unit's end makes each unit's bytes its own, whatever its neighbours do, as the cost
    model assumes.)
backward, when a unit's first saved tensor is unpacked:
    its tensors and those of the offloaded unit before it are copied back on the side stream
    into memory allocated on the compute stream, after the side stream waits for the compute
    stream (that memory's last readers are done); an event marks the copies done and the compute
    stream waits for it before a saved tensor is used. So unit k-1's copies run while unit k's
    backward computes.
pinned buffers:
    a pool keyed by byte size (a buffer is viewed as the tensor's dtype, shape and dense
    strides, so the tensor comes back in the layout it had), reused across
    steps: a buffer goes back when its saved tensor is released, and since every copy to or from
    the pool runs on the one side stream, in order, a reused buffer is never written while a
    copy still reads it.

On a CPU device the same bookkeeping runs with plain synchronous copies (for tests; the plan
refuses ``offload`` off CUDA, see ``env.runtime.apply``). The snippet export (``search.training.snippet``) carries
this file's code.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

MIN_OFFLOAD_BYTES = 1 << 20  # smaller saved tensors stay on the device: a copy's fixed cost exceeds their bytes


def state_storages(module: nn.Module) -> frozenset[int]:
    """Storage addresses of a module's parameters and buffers: saved as they are, never offloaded."""
    return frozenset(t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers()))


def is_model_state(t: torch.Tensor, state: frozenset[int]) -> bool:
    """A parameter, a view of one (``weight.t()`` saved by a matmul), or a tensor on ``state``'s storages."""
    base = t._base if t._base is not None else t
    return isinstance(t, nn.Parameter) or isinstance(base, nn.Parameter) or t.untyped_storage().data_ptr() in state


def dense_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The strides ``empty_like`` gives ``t``: its own when dense (a transposed attention output, a
    channels-last activation), else contiguous ones. The copy back keeps them, so backward kernels
    see the layout they saw in forward."""
    return torch.empty_like(t, device="meta").stride()


class HostPool:
    """Host buffers (uint8) by byte size, pinned on CUDA machines, reused across steps."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._free: dict[int, list[torch.Tensor]] = {}
        self.allocated_bytes = 0  # everything this pool ever allocated (it frees nothing)

    def take(self, nbytes: int) -> torch.Tensor:
        free = self._free.get(nbytes)
        if free:
            return free.pop()
        self.allocated_bytes += nbytes
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)

    def give(self, buffer: torch.Tensor) -> None:
        self._free.setdefault(buffer.numel(), []).append(buffer)

    def clear(self) -> None:
        """Drop the free buffers (call when no offloaded step is running)."""
        self._free.clear()


@dataclass
class OffloadStats:
    """Counters since the offloader was made; the tests read them."""

    tensors_offloaded: int = 0
    bytes_offloaded: int = 0  # copied to host
    bytes_fetched: int = 0  # copied back to the device
    prefetches: int = 0  # units copied back ahead of their backward


class _Group:
    """The tensors one call of one offloaded unit saved, in saving order."""

    __slots__ = ("generation", "items", "closed", "started", "loaded", "copied")

    def __init__(self, generation: int) -> None:
        self.generation = generation  # forward pass it belongs to
        self.items: list[weakref.ref[_Saved]] = []
        self.closed = False  # the unit's forward has returned
        self.started = False  # its backward has begun
        self.loaded = False  # its tensors are (being) copied back for backward
        self.copied: Any = None  # side-stream event after its last copy to host

    def alive(self) -> list["_Saved"]:
        return [s for s in (r() for r in self.items) if s is not None]


class _Saved:
    """One offloaded tensor: its host copy, and, while on the device, the device tensor and the
    event the compute stream waits for before using or dropping it."""

    __slots__ = ("offloader", "group", "buffer", "host", "on_device", "ready", "__weakref__")

    def __init__(self, offloader: "ActivationOffloader", group: _Group, buffer: torch.Tensor,
                 host: torch.Tensor, on_device: torch.Tensor, ready: Any) -> None:
        self.offloader, self.group, self.buffer, self.host = offloader, group, buffer, host
        self.on_device, self.ready = on_device, ready

    def __del__(self) -> None:
        if self.on_device is not None:  # copied back but never used (a backward that failed)
            self.offloader._wait(self.ready)
        self.offloader.pool.give(self.buffer)


class ActivationOffloader:
    """Saved-tensor hooks that offload to host memory on a side stream; one per device."""

    def __init__(self, device: torch.device, min_bytes: int = MIN_OFFLOAD_BYTES) -> None:
        self.device = device
        self.min_bytes = min_bytes
        cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if cuda else None  # every copy, both ways
        self.pool = HostPool(pin=cuda)
        self.stats = OffloadStats()
        self._groups: list[_Group] = []  # in forward order
        self._generation = 0
        self._in_backward = False

    @contextlib.contextmanager
    def saved_tensors(self, module: nn.Module) -> Iterator[None]:
        """Offload what ``module``'s forward saves for backward, inside this context."""
        if self._in_backward:  # a forward after a backward: a new step
            self._generation, self._in_backward = self._generation + 1, False
        self._groups = [g for g in self._groups if not g.closed or g.alive()]
        group = _Group(self._generation)
        self._groups.append(group)
        pack = functools.partial(self._pack, group, state_storages(module))
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, self._unpack):
                yield
        finally:
            group.closed = True
            self._release(group)

    def _compute(self) -> Any:
        return torch.cuda.current_stream(self.device) if self.stream is not None else None

    def _wait(self, event: Any) -> None:
        """The compute stream waits for ``event`` (work on the side stream) before what follows."""
        if event is not None:
            self._compute().wait_event(event)

    def _pack(self, group: _Group, state: frozenset[int], t: torch.Tensor) -> Any:
        nbytes = t.numel() * t.element_size()
        if (type(t) is not torch.Tensor or t.device != self.device or t.layout != torch.strided
                or nbytes < self.min_bytes or is_model_state(t, state)):
            return t.detach()  # detached: a saved output must not hold its own grad_fn (a reference cycle)
        buffer = self.pool.take(nbytes)
        host = buffer.view(t.dtype).as_strided(t.shape, dense_strides(t))
        if self.stream is None:
            host.copy_(t)
        else:
            self.stream.wait_stream(self._compute())  # t is written
            with torch.cuda.stream(self.stream):
                host.copy_(t, non_blocking=True)
            group.copied = self.stream.record_event()
        saved = _Saved(self, group, buffer, host, t.detach(), group.copied)
        group.items.append(weakref.ref(saved))
        self.stats.tensors_offloaded += 1
        self.stats.bytes_offloaded += nbytes
        return saved

    def _release(self, group: _Group) -> None:
        """Let a unit's device tensors go once the compute stream has waited for their copies."""
        self._wait(group.copied)
        for saved in group.alive():
            saved.on_device = saved.ready = None

    def _unpack(self, saved: Any) -> torch.Tensor:
        if isinstance(saved, torch.Tensor):
            return saved
        self._in_backward = True
        group = saved.group
        if not group.started:
            group.started = True
            if not group.loaded:
                self._load(group)
            previous = self._previous(group)
            if previous is not None and not previous.loaded:
                self._load(previous)  # its copies run while this unit's backward computes
                self.stats.prefetches += 1
        if saved.on_device is None:  # unpacked again: a second backward through a retained graph
            self._copy_in([saved])
        t, ready = saved.on_device, saved.ready
        self._wait(ready)
        saved.on_device = saved.ready = None
        return t

    def _previous(self, group: _Group) -> _Group | None:
        """The offloaded unit that ran before ``group``'s in the same forward pass (the next backward)."""
        index = next(i for i, g in enumerate(self._groups) if g is group)
        for g in reversed(self._groups[:index]):
            if g.generation != group.generation:
                return None
            if g.alive():
                return g
        return None

    def _load(self, group: _Group) -> None:
        """Copy a unit's saved tensors back to the device for its backward."""
        group.loaded = True
        away = [s for s in group.alive() if s.on_device is None]
        if away:
            self._copy_in(away)

    def _copy_in(self, items: list[_Saved]) -> None:
        targets = [torch.empty_strided(s.host.shape, s.host.stride(), dtype=s.host.dtype, device=self.device)
                   for s in items]  # allocated on the compute stream
        if self.stream is None:
            for s, dst in zip(items, targets):
                dst.copy_(s.host)
                s.on_device, s.ready = dst, None
        else:
            self.stream.wait_stream(self._compute())  # the targets' memory is no longer read by compute
            with torch.cuda.stream(self.stream):
                for s, dst in zip(items, targets):
                    dst.copy_(s.host, non_blocking=True)
            ready = self.stream.record_event()
            for s, dst in zip(items, targets):
                s.on_device, s.ready = dst, ready
        self.stats.bytes_fetched += sum(dst.numel() * dst.element_size() for dst in targets)


_OFFLOADERS: dict[torch.device, ActivationOffloader] = {}


def offloader_for(device: torch.device) -> ActivationOffloader:
    """The offloader (side stream, buffer pool) of one device, made on first use."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _OFFLOADERS:
        _OFFLOADERS[device] = ActivationOffloader(device)
    return _OFFLOADERS[device]


def _device_of(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """Where a unit computes: its first parameter or buffer, else its first tensor argument."""
    for t in (*module.parameters(), *module.buffers(), *args, *kwargs.values()):
        if isinstance(t, torch.Tensor):
            return t.device
    return None


def offloaded_forward(module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` with the tensors it saves for backward offloaded to host memory (CUDA modules)."""
    @functools.wraps(forward)
    def offloaded(*args: Any, **kwargs: Any) -> Any:
        device = _device_of(module, args, kwargs)
        if device is None or device.type != "cuda":
            raise RuntimeError(f"action 'offload' needs a unit on a CUDA device; this {type(module).__name__} is on "
                               f"{device or 'no device'}; move the model to CUDA or use recompute/selective")
        with offloader_for(device).saved_tensors(module):
            return forward(*args, **kwargs)
    return offloaded

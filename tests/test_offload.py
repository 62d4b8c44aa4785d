"""The offloader's bookkeeping, run on CPU with synchronous copies (the CUDA runs are in test_gpu.py).

What a saved tensor is offloaded (activations, not parameters or their views), gradients equal to
keeping everything, each unit's backward prefetching the unit before it, host buffers reused
across steps, a retained graph unpacked twice, the snippet carrying the same code, and the CUDA
branch's stream protocol (run with logging fake streams): every copy after its stream waited for
compute, compute waiting for every copy before using or releasing its memory.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.nn as nn

from env.runtime.apply import plan_for
from env.runtime.offload import ActivationOffloader, HostPool, is_model_state, offloaded_forward, state_storages
from env.units.find import find_units
from env.workloads.workload import Workload, load_workload
from search.training.snippet import plan_snippet

SEED = 99
CPU = torch.device("cpu")


@contextlib.contextmanager
def wrapped_units(w: Workload, units: list[str], context: Callable[[nn.Module], Any]) -> Iterator[None]:
    """Each unit's forward run inside ``context(unit)``; restored afterwards."""
    for fqn in units:
        module = w.model.get_submodule(fqn)

        def forward(*args: Any, _module: nn.Module = module, _forward: Any = module.forward, **kwargs: Any) -> Any:
            with context(_module):
                return _forward(*args, **kwargs)
        module.forward = forward
    try:
        yield
    finally:
        for fqn in units:
            w.model.get_submodule(fqn).__dict__.pop("forward")


def grads(w: Workload, backward_twice: bool = False) -> dict[str, torch.Tensor]:
    w.model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)  # same dropout masks in every run
    loss = w.loss()
    loss.backward(retain_graph=backward_twice)
    if backward_twice:
        loss.backward()
    return {n: p.grad.clone() for n, p in w.model.named_parameters()}


@pytest.fixture(scope="module")
def gpt() -> tuple[Workload, list[str], dict[str, torch.Tensor]]:
    w = load_workload("gpt/tiny")
    return w, find_units(w.model), grads(w)


def test_parameters_their_views_and_buffers_are_model_state() -> None:
    lin, bn = nn.Linear(4, 4), nn.BatchNorm1d(4)
    state = state_storages(lin) | state_storages(bn)
    assert is_model_state(lin.weight, state) and is_model_state(lin.weight.t(), state)
    assert is_model_state(lin.weight.detach(), state)  # same storage
    assert is_model_state(bn.running_mean, state)
    activation = lin(torch.randn(2, 4))
    assert not is_model_state(activation, state) and not is_model_state(activation.detach(), state)
    assert not is_model_state(nn.Linear(4, 4).weight.detach(), state)  # another module's storage, not a Parameter


def test_the_host_pool_reuses_a_buffer_of_the_same_size() -> None:
    pool = HostPool(pin=False)
    a = pool.take(1024)
    pool.give(a)
    assert pool.take(1024) is a and pool.take(1024) is not a
    assert pool.take(512).numel() == 512 and pool.allocated_bytes == 2 * 1024 + 512


def count_saved(w: Workload, units: list[str], min_bytes: int) -> tuple[int, int]:
    """(activations, model-state tensors) the units save for backward in one step, counted by hooks."""
    counts = [0, 0]

    def context(module: nn.Module) -> Any:
        state = state_storages(module)

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.numel() * t.element_size() >= min_bytes:
                counts[is_model_state(t, state)] += 1
            return t.detach()
        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    with wrapped_units(w, units, context):
        grads(w)
    return counts[0], counts[1]


def test_offloaded_units_give_the_same_gradients_and_offload_only_activations(gpt) -> None:
    w, units, reference = gpt
    activations, state = count_saved(w, units, min_bytes=1)
    assert activations > 0 and state > 0  # the weights are saved too (as views): they must stay
    off = ActivationOffloader(CPU, min_bytes=1)
    with wrapped_units(w, units, off.saved_tensors):
        got = grads(w)
    for name, g in reference.items():
        assert torch.equal(got[name], g), name
    assert off.stats.tensors_offloaded == activations
    assert off.stats.bytes_fetched == off.stats.bytes_offloaded > 0
    # backward runs the units last to first: each unit's first unpack prefetches the one before it
    assert off.stats.prefetches == len(units) - 1


def test_a_unit_lets_its_device_tensors_go_when_its_forward_returns(gpt) -> None:
    w, units, _ = gpt
    off = ActivationOffloader(CPU, min_bytes=1)
    with wrapped_units(w, units, off.saved_tensors):
        torch.manual_seed(SEED)
        loss = w.loss()
        saved = [s for g in off._groups for s in g.alive()]
        assert saved and all(s.on_device is None for s in saved)  # only the host copy is held
        loss.backward()
    w.model.zero_grad(set_to_none=True)


def test_small_tensors_stay_and_buffers_are_reused_across_steps(gpt) -> None:
    w, units, reference = gpt
    big = ActivationOffloader(CPU, min_bytes=1 << 30)
    with wrapped_units(w, units, big.saved_tensors):
        grads(w)
    assert big.stats.tensors_offloaded == 0 and big.pool.allocated_bytes == 0
    off = ActivationOffloader(CPU, min_bytes=1)
    with wrapped_units(w, units, off.saved_tensors):
        grads(w)
        first = off.pool.allocated_bytes
        for _ in range(3):
            got = grads(w)
    assert first > 0 and off.pool.allocated_bytes == first  # steps 2-4 took every buffer from the pool
    assert off.stats.tensors_offloaded == 4 * count_saved(w, units, 1)[0]
    assert all(torch.equal(got[n], g) for n, g in reference.items())


def test_a_retained_graph_can_be_unpacked_twice(gpt) -> None:
    w, units, _ = gpt
    twice = grads(w, backward_twice=True)
    off = ActivationOffloader(CPU, min_bytes=1)
    with wrapped_units(w, units, off.saved_tensors):
        got = grads(w, backward_twice=True)
    for name, g in twice.items():
        assert torch.equal(got[name], g), name
    assert off.stats.bytes_fetched == 2 * off.stats.bytes_offloaded


class _SavesAndChecks(torch.autograd.Function):
    """Saves its input; in backward, asserts the saved tensor's strides are ``ctx.expected``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, expected: tuple[int, ...]) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.expected = expected
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        assert x.stride() == ctx.expected, (x.stride(), ctx.expected)
        return grad * 2, None


def test_a_saved_tensor_comes_back_in_its_dense_layout() -> None:
    leaf = torch.randn(4, 8, 16, requires_grad=True)
    off = ActivationOffloader(CPU, min_bytes=1)
    unit = nn.Identity()
    with off.saved_tensors(unit):
        transposed = (leaf * 1).transpose(1, 2)  # dense, not contiguous: its strides are kept
        sliced = (leaf * 1)[..., :4].transpose(1, 2)  # not dense: comes back contiguous
        out = _SavesAndChecks.apply(transposed, (128, 1, 16)).sum()
        out = out + _SavesAndChecks.apply(sliced, (32, 1, 4)).sum()
    assert off.stats.tensors_offloaded == 2
    out.backward()
    assert torch.equal(leaf.grad, torch.full_like(leaf, 2).index_fill_(2, torch.arange(4), 4))


def test_offloaded_forward_refuses_a_cpu_unit_on_one_line() -> None:
    lin = nn.Linear(4, 4)
    with pytest.raises(RuntimeError) as e:
        offloaded_forward(lin, lin.forward)(torch.randn(2, 4))
    msg = str(e.value)
    assert "needs a unit on a CUDA device" in msg and "recompute" in msg and "\n" not in msg


def test_the_snippet_carries_the_offloader(gpt) -> None:
    w, units, reference = gpt
    text = plan_snippet(plan_for(w.model, units, ["offload", "keep", "recompute", "selective"]))
    assert "class ActivationOffloader" in text and "save_on_cpu" not in text
    ns: dict = {}
    exec(compile(text, "<snippet>", "exec"), ns)
    assert ns["POLICIES"][ns["Action"].OFFLOAD].wrap.__globals__ is ns  # the snippet's own offload code
    off = ns["ActivationOffloader"](CPU, min_bytes=1)
    with wrapped_units(w, units, off.saved_tensors):
        got = grads(w)
    assert off.stats.tensors_offloaded > 0 and off.stats.prefetches == len(units) - 1
    assert all(torch.equal(got[n], g) for n, g in reference.items())


class FakeStream:
    """Stands in for a torch.cuda.Stream: logs waits and recorded events instead of running them."""

    def __init__(self, name: str, log: list[tuple[str, ...]]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: "FakeStream") -> None:
        self.log.append((self.name, "wait_stream", other.name))

    def record_event(self) -> str:
        event = f"event{sum(entry[1] == 'record_event' for entry in self.log)}"
        self.log.append((self.name, "record_event", event))
        return event

    def wait_event(self, event: str) -> None:
        self.log.append((self.name, "wait_event", event))


def test_the_stream_protocol_orders_every_copy_with_events(gpt, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch run with logging fake streams (the copies themselves run on CPU tensors)."""
    w, units, reference = gpt
    log: list[tuple[str, ...]] = []
    compute = FakeStream("compute", log)
    off = ActivationOffloader(CPU, min_bytes=1)
    off.stream = FakeStream("side", log)

    @contextlib.contextmanager
    def on_stream(stream: FakeStream) -> Iterator[None]:
        log.append((stream.name, "enter"))
        yield
        log.append((stream.name, "exit"))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    with wrapped_units(w, units, off.saved_tensors):
        got = grads(w)
    assert all(torch.equal(got[n], g) for n, g in reference.items())
    recorded: set[str] = set()
    for i, (who, what, *rest) in enumerate(log):
        if what == "enter":  # side-stream work starts only after the side stream waited for compute
            assert log[i - 1] == ("side", "wait_stream", "compute"), log[i - 1:i + 1]
            assert log[i + 1] == ("side", "exit") and log[i + 2][:2] == ("side", "record_event")
        if what == "record_event":
            recorded.add(rest[0])
        if what == "wait_event":
            assert who == "compute" and rest[0] in recorded  # compute waits only for recorded copies
    d2h = sum(1 for who, what, *_ in log if what == "enter")
    assert d2h == off.stats.tensors_offloaded + len(units)  # one copy-out per tensor, one copy-in per unit
    # forward: each unit's exit waits for its last copy out (which follows its others on the one side stream)
    waits = [i for i, entry in enumerate(log) if entry[1] == "wait_event"]
    exits = waits[:len(units)]
    for i in exits:
        latest = [entry[2] for entry in log[:i] if entry[1] == "record_event"][-1]
        assert log[i][2] == latest
    # backward: every copy in is waited for before its tensor is used
    copies_in = {entry[2] for entry in log[exits[-1]:] if entry[1] == "record_event"}
    assert len(copies_in) == len(units) and copies_in <= {log[i][2] for i in waits[len(units):]}

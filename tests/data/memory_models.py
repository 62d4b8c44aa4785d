"""User models that do not fit above a batch size, or with a unit recomputed, or never return: for the checks that
out of memory is a measurement and a hang is said out loud (tests/test_out_of_memory.py, tests/test_deadlines.py,
tests/test_faults.py)."""
import os
import signal
import time

import torch
import torch.nn as nn


class Block(nn.Module):
    """``recomputed``: what its forward does when it runs again in backward (a plan recomputes it): "raise" fails
    an allocation (the CPU allocator's error), "kill" kills its process, as a recompute's transient past the
    device's memory does; "raise on rank 1" fails it on rank 1 of a process group alone."""

    def __init__(self, width: int, sleeps: bool = False, recomputed: str = "") -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.sleeps, self.recomputed = sleeps, recomputed

    def forward(self, x):
        while self.sleeps:  # a forward that never returns (a wait on something that never comes)
            time.sleep(1)
        if self.recomputed and torch._C._current_graph_task_id() != -1:  # running inside backward: a recompute
            how, _, rank = self.recomputed.partition(" on rank ")
            if not rank or (torch.distributed.is_initialized() and torch.distributed.get_rank() == int(rank)):
                _fail(how)
        return x + self.net(x)


def _fail(how: str) -> None:
    """An allocation that no machine can give (``how="raise"``), or this process killed as the kernel's
    out-of-memory killer kills it (``how="kill"``)."""
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    torch.empty(1 << 52, dtype=torch.uint8)  # more than any machine has: DefaultCPUAllocator's RuntimeError


class Net(nn.Module):
    """Four residual MLP blocks; above ``fits`` samples a step does not fit: the CPU allocator's own error
    (``how="raise"``), or the process killed as the kernel's out-of-memory killer kills it (``how="kill"``)."""

    def __init__(self, width: int = 32, fits: int = 0, how: str = "raise", sleeping_block: int = -1,
                 recomputed: dict[int, str] | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, i == sleeping_block, (recomputed or {}).get(i, ""))
                                    for i in range(4))
        self.fits, self.how = fits, how

    def forward(self, x, y):
        if self.fits and x.shape[0] > self.fits:
            _fail(self.how)
        for block in self.blocks:
            x = block(x)
        return nn.functional.mse_loss(x, y)


def _inputs(batch_size: int, width: int = 32, seq: int = 1):
    """(inputs, targets) of ``batch_size`` samples, each ``seq`` tokens of ``width`` (the activations grow with
    ``seq``, so that a memory cap bounds the micro-batch)."""
    return torch.randn(batch_size, seq, width), torch.randn(batch_size, seq, width)


def too_big_above(batch_size: int = 4, fits: int = 12, width: int = 32, seq: int = 1):
    return Net(width, fits=fits, how="raise"), _inputs(batch_size, width, seq)


def killed_above(batch_size: int = 4, fits: int = 12, width: int = 32, seq: int = 1):
    return Net(width, fits=fits, how="kill"), _inputs(batch_size, width, seq)


def recompute_fails(batch_size: int = 4, raises: int = 1, kills: int = 2):
    """Blocks that do not fit recomputed: block ``raises``'s recompute fails its allocation, block ``kills``'s
    kills its process; every plan that keeps both fits."""
    return Net(recomputed={raises: "raise", kills: "kill"}), _inputs(batch_size)


def recompute_fails_on_one_rank(batch_size: int = 4, raises: int = 1):
    """Block ``raises``'s recompute fails its allocation on rank 1 alone: rank 0 goes on into the step's next
    collective and waits there for rank 1."""
    return Net(recomputed={raises: "raise on rank 1"}), _inputs(batch_size)


def sleeps_in_factory(batch_size: int = 4):
    while True:  # a factory that never returns
        time.sleep(1)


def sleeps_in_forward(batch_size: int = 4):
    return Net(sleeping_block=1), _inputs(batch_size)


def blocks(batch_size: int = 4, width: int = 32, seq: int = 1):
    """The same model with no limit of its own: where it stops fitting is the allocator's (``ulimit -v``)."""
    return Net(width), _inputs(batch_size, width, seq)


def inputs_too_big_above(batch_size: int = 4, fits: int = 8):
    """A factory whose inputs above ``fits`` samples cannot be allocated (the CPU allocator's own error)."""
    if batch_size > fits:
        torch.empty(1 << 52, dtype=torch.uint8)
    return Net(), _inputs(batch_size)

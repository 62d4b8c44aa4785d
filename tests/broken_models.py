"""Models broken on purpose for the correctness gate: each is fine trained plainly, and a plan that recomputes
its broken unit changes the gradients.

- ``numpy_noise``: unit ``blocks.1`` adds noise drawn from numpy's global generator before its nonlinearity
  (a recompute draws other numbers; checkpointing replays only torch's generator);
- ``counting``: unit ``blocks.1`` counts its calls in a Python attribute and scales by the count's parity
  (a recompute is one more call);
- ``global_backward``: every block writes its index to a module-level dict and applies a custom autograd
  Function whose backward scales by it (a recompute in backward rewrites the value the next backwards read:
  recomputing ``blocks.1`` or ``blocks.2`` changes the gradients; ``blocks.3`` writes what was there, and
  ``blocks.0``'s Function runs its backward before the recompute, with nothing after it).

Each factory returns ``(module, inputs)`` with ``module(*inputs)`` the loss, so it is a workload file too:
``--workload tests/broken_models.py:numpy_noise``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, DEPTH = 64, 4
STATE: dict[str, float] = {"last": 0.0}  # what global_backward's blocks write in forward and read in backward


class Block(nn.Module):
    def __init__(self, width: int, index: int) -> None:
        super().__init__()
        self.fc, self.index = nn.Linear(width, width), index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(x))


class NumpyNoise(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.from_numpy(np.random.standard_normal(x.shape).astype(np.float32))
        return x + F.gelu(self.fc(x) + noise)


class Counting(Block):
    def __init__(self, width: int, index: int) -> None:
        super().__init__(width, index)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + F.gelu(self.fc(x) * (1.0 + 0.5 * (self.calls % 2)))


class GlobalScale(torch.autograd.Function):
    """Identity forward; backward scales the gradient by ``1 + STATE['last']``, read when backward runs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * (1.0 + STATE["last"])


class GlobalBackward(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        STATE["last"] = float(self.index)
        return x + GlobalScale.apply(F.gelu(self.fc(x)))


class Net(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x), y)


def _made(broken: type[Block] | None, everywhere: bool = False, batch_size: int = 512) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    blocks = [(broken if broken is not None and (everywhere or i == 1) else Block)(WIDTH, i) for i in range(DEPTH)]
    return Net(blocks), (torch.randn(batch_size, WIDTH), torch.randint(0, 10, (batch_size,)))


def sound(batch_size: int = 512) -> tuple[nn.Module, tuple]:
    return _made(None, batch_size=batch_size)


def numpy_noise(batch_size: int = 512) -> tuple[nn.Module, tuple]:
    return _made(NumpyNoise, batch_size=batch_size)


def counting(batch_size: int = 512) -> tuple[nn.Module, tuple]:
    return _made(Counting, batch_size=batch_size)


def global_backward(batch_size: int = 512) -> tuple[nn.Module, tuple]:
    return _made(GlobalBackward, everywhere=True, batch_size=batch_size)


BROKEN = {"numpy_noise": numpy_noise, "counting": counting, "global_backward": global_backward}

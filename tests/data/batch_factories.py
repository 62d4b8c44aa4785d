"""User factories for the micro-batch contract (env.workloads.batching)."""
import torch
import torch.nn as nn

CALLS: list[int] = []  # the batch_size each call of ``with_batch_size`` was given


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 8)) for _ in range(3))

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return (x * scale).pow(2).mean()


def with_batch_size(batch_size: int = 3):
    """Batch-aware: its inputs hold ``batch_size`` samples."""
    CALLS.append(batch_size)
    torch.manual_seed(0)
    return Net(), (torch.randn(batch_size, 8), torch.tensor(2.0))


def batch_first():
    """Not batch-aware, but its inputs hold 4 samples along dimension 0 (and a scalar beside them)."""
    torch.manual_seed(0)
    return Net(), (torch.arange(32, dtype=torch.float32).reshape(4, 8), torch.tensor(2.0))

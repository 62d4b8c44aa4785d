"""Broken user models for fail-well checks."""
import torch
import torch.nn as nn


class Tiny(nn.Module):
    def __init__(self, fail_after=-1, no_grad=False):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16)) for _ in range(4))
        self.calls, self.fail_after, self.no_grad = 0, fail_after, no_grad

    def forward(self, x):
        self.calls += 1
        if 0 <= self.fail_after < self.calls:
            raise RuntimeError(f"boom after {self.fail_after} calls")
        for b in self.blocks:
            x = x + b(x)
        loss = x.pow(2).mean()
        return loss.detach() if self.no_grad else loss


def raises_later(fail_after: int = 30):
    return Tiny(fail_after=fail_after), (torch.randn(8, 16),)


def no_grad():
    return Tiny(no_grad=True), (torch.randn(8, 16),)


def wrong_dtype():
    return Tiny(), (torch.randn(8, 16, dtype=torch.float64),)


def tied_blocks():
    """Two blocks share a weight: each block a unit, FSDP2 cannot shard them apart."""
    model = Tiny()
    model.blocks[1][0].weight = model.blocks[0][0].weight
    return model, (torch.randn(8, 16),)

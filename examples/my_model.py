"""The README's own-model example ("Your own model"): a workload factory returning ``(module, inputs)``.

    .venv/bin/python -m search.run --workload "examples/my_model.py:make?batch_size=128"
"""

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, width=256, depth=8):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)])
        self.head = nn.Linear(width, 10)

    def forward(self, x, y):  # the loss, not the logits
        return nn.functional.cross_entropy(self.head(self.blocks(x)), y)


def make(batch_size=64):
    return Net(), (torch.randn(batch_size, 256), torch.randint(0, 10, (batch_size,)))

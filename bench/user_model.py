"""A user-factory workload for the benchmarks: a small Vision Transformer (ViT, Dosovitskiy et al. 2021).

Loaded as ``bench/user_model.py:make`` (options: ``...:make?depth=4&dim=64``), the way a user
brings their own model: the factory returns ``(module, (images, labels))`` and the module's
forward returns the scalar loss. The decision units are ``blocks.0 .. blocks.{depth-1}``, the
largest ModuleList. Pre-norm blocks of multi-head self-attention and a GELU MLP, patch
embedding by a strided convolution, a learned position embedding and mean pooling.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm transformer encoder block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, dim)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Images (B, 3, S, S) and labels (B,) -> cross-entropy loss."""

    def __init__(self, image_size: int, patch: int, dim: int, depth: int, heads: int, n_classes: int,
                 dropout: float) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size={image_size} is not a multiple of patch={patch}; pick sizes that divide")
        self.embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2) + self.pos  # (B, T, dim)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x).mean(dim=1))  # (B, n_classes)
        return F.cross_entropy(logits, labels)


def make(depth: int = 6, dim: int = 128, heads: int = 4, image_size: int = 32, patch: int = 4,
         batch_size: int = 16, n_classes: int = 10, dropout: float = 0.1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model and one batch (the loader seeds torch before calling this)."""
    model = ViT(image_size, patch, dim, depth, max(1, min(heads, dim // 8)), n_classes, dropout)
    images = torch.randn(batch_size, 3, image_size, image_size)
    labels = torch.randint(0, n_classes, (batch_size,))
    return model, (images, labels)

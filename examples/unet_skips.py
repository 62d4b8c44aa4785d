"""A user's U-Net with skip connections, given as a workload factory (no ModuleList anywhere).

Spec: ``examples/unet_skips.py:build`` (options: ``?batch_size=2&image_size=64&width=16``).

The encoder's outputs are kept for the decoder (skip connections), the blocks are plain named
attributes, each block's layers one ``nn.Sequential``, and one ``MaxPool2d`` is called three
times a step. "The children of the largest Sequential" picks the six layers of one block here
and saves nothing; the automatic units (``env.units.choice``) find the blocks.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_block(c_in: int, c_out: int) -> nn.Sequential:
    """Two 3x3 conv + BatchNorm + ReLU, as in Ronneberger et al. (2015)."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
    )


class UNet(nn.Module):
    """Three down steps, a bottleneck and three up steps; returns the denoising MSE."""

    def __init__(self, channels: int = 3, width: int = 32) -> None:
        super().__init__()
        w1, w2, w3, w4 = width, 2 * width, 4 * width, 8 * width
        self.down1, self.down2, self.down3 = conv_block(channels, w1), conv_block(w1, w2), conv_block(w2, w3)
        self.pool = nn.MaxPool2d(2)  # shared: called once per down step
        self.bottom = conv_block(w3, w4)
        self.up3, self.dec3 = nn.ConvTranspose2d(w4, w3, 2, stride=2), conv_block(2 * w3, w3)
        self.up2, self.dec2 = nn.ConvTranspose2d(w3, w2, 2, stride=2), conv_block(2 * w2, w2)
        self.up1, self.dec1 = nn.ConvTranspose2d(w2, w1, 2, stride=2), conv_block(2 * w1, w1)
        self.head = nn.Conv2d(w1, channels, 1)

    def forward(self, noisy: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(noisy)  # (B, w1, H, W)
        d2 = self.down2(self.pool(d1))  # (B, w2, H/2, W/2)
        d3 = self.down3(self.pool(d2))  # (B, w3, H/4, W/4)
        b = self.bottom(self.pool(d3))  # (B, w4, H/8, W/8)
        u3 = self.dec3(torch.cat([self.up3(b), d3], dim=1))
        u2 = self.dec2(torch.cat([self.up2(u3), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return F.mse_loss(self.head(u1), noise)


def build(batch_size: int = 8, image_size: int = 128, width: int = 32) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(module, inputs) with ``module(*inputs)`` the scalar loss: about a second a step on one CPU thread."""
    if image_size % 8:
        raise ValueError(f"image_size={image_size} must be a multiple of 8 (three 2x down steps)")
    g = torch.Generator().manual_seed(0)
    noisy = torch.randn(batch_size, 3, image_size, image_size, generator=g)
    noise = torch.randn(batch_size, 3, image_size, image_size, generator=g)
    return UNet(width=width), (noisy, noise)

"""Built-in models for the built-in workloads.

Each model computes its own scalar training loss from its inputs, so a workload is just
``(model, inputs)``: ``model(*inputs)`` returns the loss. The repeated blocks every model
exposes (``blocks`` / ``features`` / ``layers``) are the decision units that
:func:`env.units.find.find_units` picks by default.

- ``GPT``: a GPT-2-style decoder after nanoGPT (Karpathy, ``model.py``): token + position
  embeddings, pre-LayerNorm blocks of causal self-attention and a 4x MLP, dropout in the
  embeddings, attention and residual paths, and a head tied to the token embedding; the final
  norm, the head and the loss are one module (``lm_loss``, ``env.workloads.lm_loss.LMLoss``), so
  a plan can reach them.
- ``ResNetCNN``: a ResNet-style classifier (He et al. 2015) whose stages differ in width and
  resolution, so per-block memory and time are heterogeneous.
- ``StackedLSTM``: an LSTM language model, one ``nn.LSTM`` per layer with dropout between.
- ``MLP``: residual MLP blocks on a regression target.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from env.workloads.lm_loss import LMLoss


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} must be divisible by n_head={n_head}; pick n_head dividing d_model")
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.proj(y))


class GPTMLP(nn.Module):
    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class GPTBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = GPTMLP(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, n_layer: int, d_model: int, n_head: int,
                 dropout: float) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(d_model, n_head, dropout) for _ in range(n_layer))
        ln_f = nn.LayerNorm(d_model)
        self.lm_loss = LMLoss(head=nn.Linear(d_model, vocab_size, bias=False), norm=ln_f)
        self.lm_loss.head.weight = self.wte.weight  # weight tying, as GPT-2
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.lm_loss(x, targets)  # head and cross-entropy over (B, T, vocab) logits


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class Stem(nn.Module):
    def __init__(self, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, c_out, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, 2, 1)


class ResNetCNN(nn.Module):
    """Stem + ``blocks[i]`` BasicBlocks in stage ``i`` (of width ``widths[i]``), in one Sequential
    ``features``; ``blocks=(3, 4, 6, 3)`` is ResNet-34's depth."""

    def __init__(self, widths: tuple[int, ...], blocks: tuple[int, ...], n_classes: int,
                 dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = [Stem(widths[0])]
        c_in = widths[0]
        for stage, (width, n_blocks) in enumerate(zip(widths, blocks, strict=True)):
            for b in range(n_blocks):
                layers.append(BasicBlock(c_in, width, 2 if (stage > 0 and b == 0) else 1))
                c_in = width
        self.features = nn.Sequential(*layers)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(c_in, n_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.features(images)  # (B, C, H/32, W/32)
        x = self.drop(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))  # (B, C)
        return F.cross_entropy(self.fc(x), labels)


class LSTMLayer(nn.Module):
    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d_model, d_model, batch_first=True)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x)  # (B, T, C)
        return self.drop(y)


class StackedLSTM(nn.Module):
    def __init__(self, vocab_size: int, n_layer: int, d_model: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(LSTMLayer(d_model, dropout) for _ in range(n_layer))
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)  # (B, T, C)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(x)  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class MLPBlock(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm(x)))))


class MLP(nn.Module):
    def __init__(self, d_in: int, width: int, n_layer: int, dropout: float) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*(MLPBlock(width, dropout) for _ in range(n_layer)))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.out(self.blocks(self.inp(x))).squeeze(-1), y)

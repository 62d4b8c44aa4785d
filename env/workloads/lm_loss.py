"""A language model's loss as a module, so that a checkpoint plan can reach it.

At a real vocabulary the logits, their log-softmax and their gradient are most of a step's
activations, and a model that computes them in its own forward keeps them outside every
decision unit. :class:`LMLoss` is the final norm, the LM head and the cross-entropy as one
submodule: a decision unit like any other, whose actions add ``chunked``
(``env.runtime.apply.Chunked``): the head and the loss over chunks of tokens, each chunk
recomputed in backward, so the full logits and their softmax never exist (as torchtune's and
Liger's chunked cross-entropy).

The contract (what a user's model gives to get it)::

    self.lm_loss = LMLoss(head=nn.Linear(d, vocab, bias=False), norm=nn.LayerNorm(d))
    ...
    return self.lm_loss(hidden, targets)  # hidden: (B, T, d), targets: (B, T) -> mean token loss

Each token's loss depends only on its own hidden state and target, so the sum over chunks
divided by the count of targets that are not ``ignore_index`` is the same loss, with the same
gradients (up to float summation order).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # targets that count for nothing, as torch's and transformers' cross-entropy
CHUNKS = 8  # token chunks of ``chunked`` (torchtune's num_output_chunks)


class LMLoss(nn.Module):
    """``forward(hidden (..., d), targets (...)) -> mean cross-entropy of head(norm(hidden))`` over the
    tokens whose target is not ``ignore_index``."""

    def __init__(self, head: nn.Module, norm: nn.Module | None = None, ignore_index: int = IGNORE_INDEX) -> None:
        super().__init__()
        self.norm = norm if norm is not None else nn.Identity()
        self.head = head
        self.ignore_index = ignore_index

    def token_loss_sum(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Sum of the token losses of ``hidden`` (N, d) against ``targets`` (N,)."""
        logits = self.head(self.norm(hidden))  # (N, vocab)
        return F.cross_entropy(logits, targets, ignore_index=self.ignore_index, reduction="sum")

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h, t = hidden.flatten(0, -2), targets.flatten()  # (N, d), (N,)
        return self.token_loss_sum(h, t) / (t != self.ignore_index).sum()

    def chunked(self, hidden: torch.Tensor, targets: torch.Tensor, chunks: int = CHUNKS) -> torch.Tensor:
        """``forward`` over ``chunks`` chunks of tokens, each checkpointed: only one chunk's logits live at a time."""
        h, t = hidden.flatten(0, -2), targets.flatten()  # (N, d), (N,)
        parts = [checkpoint(self.token_loss_sum, hc, tc, use_reentrant=False, preserve_rng_state=True)
                 for hc, tc in zip(h.chunk(chunks), t.chunk(chunks))]
        return torch.stack(parts).sum() / (t != self.ignore_index).sum()


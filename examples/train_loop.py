"""A plain PyTorch training loop that calls ``auto_checkpoint`` once, before training.

    .venv/bin/python examples/train_loop.py                      # 60% of the unplanned step's peak
    .venv/bin/python examples/train_loop.py --budget 900MiB --steps 50

The model is the README's own-model example (``examples/my_model.py``). The first run measures a few plans on
this model (seconds); the next applies the cached choice at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for ``search``

from my_model import make  # noqa: E402

from search import auto_checkpoint  # noqa: E402


def budget(text: str) -> int | float | str:
    """``0.6`` a fraction of the unplanned peak, ``800000000`` bytes, ``900MiB`` a size."""
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


def main(argv: Sequence[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=budget, default=0.6, help="memory for one training step: 0.6, 900MiB, bytes")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cache-dir", default=None, help="where the chosen plan is cached (~/.cache/ckpt-search)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model, (x, y) = make(batch_size=args.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = auto_checkpoint(model, (x, y), args.budget, optimizer=optimizer, cache_dir=args.cache_dir)

    losses = []
    for _ in range(args.steps):  # a real loop draws a new batch of the same shape each step
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    print(f"trained {args.steps} steps with {ckpt.plan.summary()}: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return losses


if __name__ == "__main__":
    main()

"""A transformers ``Trainer`` that trains with a plan ``auto_checkpoint`` chose, called once before training.

    .venv/bin/python examples/hf_trainer.py --budget 0.6 --steps 10

The model is a small Llama made from its config (no download); the data are random token ids. The one call
takes a batch of the shape the Trainer will feed (``per_device_train_batch_size`` x sequence length) and
the model's own loss (``output.loss``); the Trainer then trains the model with the plan applied.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for ``search``

from search import auto_checkpoint  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, each its own label (causal LM)."""

    def __init__(self, n: int, seq_len: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv: Sequence[str] | None = None) -> float:
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=0.6, help="a fraction of the unplanned step's peak")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=args.layers,
                         num_attention_heads=4, max_position_embeddings=args.seq_len,
                         use_cache=False)  # a KV cache is state a recompute would append to again
    model = LlamaForCausalLM(config)
    data = Tokens(args.batch_size * args.steps, args.seq_len, config.vocab_size)
    batch = {k: torch.stack([data[i][k] for i in range(args.batch_size)]) for k in ("input_ids", "labels")}
    ckpt = auto_checkpoint(model, batch, args.budget, loss_fn=lambda out: out.loss, cache_dir=args.cache_dir)

    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, per_device_train_batch_size=args.batch_size, max_steps=args.steps,
                                     learning_rate=1e-3, report_to=[], save_strategy="no", logging_steps=args.steps,
                                     use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0)
        result = Trainer(model=model, args=training, train_dataset=data).train()
    print(f"trained {result.global_step} steps with {ckpt.plan.summary()}: mean loss {result.training_loss:.3f}")
    return result.training_loss


if __name__ == "__main__":
    main()

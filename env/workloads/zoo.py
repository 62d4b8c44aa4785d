"""Model zoo workloads: library models built from their own code and a config (no download).

Specs, like the built-ins (options after ``?``, e.g. ``hf/t5?batch_size=2``):

==================  =====================================================  ==========================
spec                model (random weights)                                 batch and loss
==================  =====================================================  ==========================
``hf/llama``        ``LlamaForCausalLM``, 6 layers, d 256, vocab 1024     8 x 256 tokens, LM loss
``hf/llama-1b``     ``LlamaForCausalLM``, 16 layers, d 2048, vocab 32000  3 x 2048 tokens, LM loss
``hf/gpt2``         ``GPT2LMHeadModel``, 6 layers, d 256, vocab 1024      8 x 256 tokens, LM loss
``hf/bert``         ``BertForMaskedLM``, 6 layers, d 256, vocab 1024      8 x 256 tokens, MLM loss
``hf/t5``           ``T5ForConditionalGeneration``, 6+6 layers, d 256     4 x 256 -> 128 tokens, LM loss
``hf/resnet50``     ``ResNetForImageClassification``, ResNet-50 config    8 x 3x128x128, cross-entropy
``diffusers/unet2d`` ``UNet2DModel``, blocks 32-64-128-128, 2 layers each  4 x 3x64x64 + timesteps, MSE
==================  =====================================================  ==========================

Each takes about a second a step on one CPU thread (measured with ``torch.set_num_threads(1)``),
the size of the built-ins' defaults (``hf/llama-1b``, about 0.95B parameters, is a GPU's size). The causal LMs'
head is moved into a loss unit ``lm_loss`` (``env.workloads.lm_loss.LMLoss``) and their step computes the
model's own loss from it, so a plan can chunk it. transformers and diffusers are optional
(``pip install 'ckpt-search[hf]'``) and imported only when a zoo model is built. Dropout is on
wherever the model has it, so a checkpoint plan that replays a different mask is caught.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from typing import Any, Callable

import torch
import torch.nn as nn

from env.data.errors import WorkloadError
from env.workloads.lm_loss import LMLoss
from env.workloads.spec import int_list
from env.workloads.step import Workload

HF_INSTALL = "pip install 'ckpt-search[hf]'"
LossFn = Callable[[nn.Module, Any], torch.Tensor]
Built = tuple[nn.Module, Any, LossFn]





def zoo_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "diffusers"))


def _library(name: str, spec: str) -> Any:
    if importlib.util.find_spec(name) is None:
        raise WorkloadError(f"workload '{spec}' needs {name}, which is not installed; {HF_INSTALL}")
    return importlib.import_module(name)




def _hf_loss(model: nn.Module, inputs: Any) -> torch.Tensor:
    return model(**inputs).loss


def _with_loss_unit(model: nn.Module) -> nn.Module:
    """A causal LM whose head is moved into a loss unit ``lm_loss`` (``env.workloads.lm_loss.LMLoss``), so a plan
    can reach the logits; its forward is :func:`_causal_lm_forward`, the model's own loss (shifted, ignore index
    -100), so that ``torch.compile(model)`` traces the whole step, the loss unit included."""
    model.lm_loss = LMLoss(head=model.lm_head)
    del model.lm_head  # one home per module: the head is the loss unit's (its weight stays tied where it was)
    model.forward = types.MethodType(_causal_lm_forward, model)
    return model


def _causal_lm_forward(self: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    hidden = self.base_model(input_ids=input_ids).last_hidden_state  # (B, T, d), normed
    return self.lm_loss(hidden[:, :-1], labels[:, 1:])  # token t predicts label t + 1


def _causal_lm_loss(model: nn.Module, inputs: Any) -> torch.Tensor:
    return model(**inputs)  # the model's forward is its loss (a compiled model's call runs the compiled step)


def _tokens(o: dict[str, Any], g: torch.Generator, length: int | None = None) -> torch.Tensor:
    return torch.randint(0, o["vocab_size"], (o["batch_size"], length or o["seq_len"]), generator=g)


def _llama(tf: Any, o: dict[str, Any], g: torch.Generator) -> Built:
    config = tf.LlamaConfig(vocab_size=o["vocab_size"], hidden_size=o["d_model"], intermediate_size=o["d_ff"],
                            num_hidden_layers=o["n_layer"], num_attention_heads=o["n_head"],
                            num_key_value_heads=o["n_head"], max_position_embeddings=o["seq_len"],
                            attention_dropout=o["dropout"], use_cache=False)
    ids = _tokens(o, g)
    return _with_loss_unit(tf.LlamaForCausalLM(config)), {"input_ids": ids, "labels": ids.clone()}, _causal_lm_loss


def _gpt2(tf: Any, o: dict[str, Any], g: torch.Generator) -> Built:
    d = o["dropout"]
    config = tf.GPT2Config(vocab_size=o["vocab_size"], n_positions=o["seq_len"], n_embd=o["d_model"],
                           n_layer=o["n_layer"], n_head=o["n_head"], resid_pdrop=d, embd_pdrop=d, attn_pdrop=d,
                           bos_token_id=0, eos_token_id=0, use_cache=False)
    model = tf.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # its class name does not say; unset, every loss logs a warning (a graph break)
    ids = _tokens(o, g)
    return _with_loss_unit(model), {"input_ids": ids, "labels": ids.clone()}, _causal_lm_loss


def _bert(tf: Any, o: dict[str, Any], g: torch.Generator) -> Built:
    config = tf.BertConfig(vocab_size=o["vocab_size"], hidden_size=o["d_model"], num_hidden_layers=o["n_layer"],
                           num_attention_heads=o["n_head"], intermediate_size=4 * o["d_model"],
                           max_position_embeddings=o["seq_len"], hidden_dropout_prob=o["dropout"],
                           attention_probs_dropout_prob=o["dropout"], use_cache=False)
    ids = _tokens(o, g)
    return tf.BertForMaskedLM(config), {"input_ids": ids, "labels": ids.clone()}, _hf_loss


def _t5(tf: Any, o: dict[str, Any], g: torch.Generator) -> Built:
    config = tf.T5Config(vocab_size=o["vocab_size"], d_model=o["d_model"], d_kv=o["d_model"] // o["n_head"],
                         d_ff=o["d_ff"], num_layers=o["n_layer"], num_decoder_layers=o["n_layer"],
                         num_heads=o["n_head"], dropout_rate=o["dropout"], decoder_start_token_id=0,
                         pad_token_id=0, use_cache=False)
    inputs = {"input_ids": _tokens(o, g), "labels": _tokens(o, g, o["target_len"])}
    return tf.T5ForConditionalGeneration(config), inputs, _hf_loss


def _resnet50(tf: Any, o: dict[str, Any], g: torch.Generator) -> Built:
    depths, widths = int_list(o, "depths"), int_list(o, "widths")
    if len(depths) != len(widths):
        raise WorkloadError(f"option depths={o['depths']} names {len(depths)} stages but widths={o['widths']} "
                            f"names {len(widths)}; give one depth per width")
    config = tf.ResNetConfig(depths=list(depths), hidden_sizes=list(widths), layer_type="bottleneck",
                             num_labels=o["n_classes"])
    images = torch.randn(o["batch_size"], 3, o["image_size"], o["image_size"], generator=g)
    labels = torch.randint(0, o["n_classes"], (o["batch_size"],), generator=g)
    return tf.ResNetForImageClassification(config), {"pixel_values": images, "labels": labels}, _hf_loss


def _unet_loss(model: nn.Module, inputs: Any) -> torch.Tensor:
    """Denoising loss: the predicted noise against a fixed target noise."""
    sample, timesteps, noise = inputs
    return nn.functional.mse_loss(model(sample, timesteps).sample, noise)


def _unet2d(o: dict[str, Any], g: torch.Generator) -> Built:
    diffusers = _library("diffusers", "diffusers/unet2d")
    widths = int_list(o, "widths")
    # attention in the second-lowest resolution only (as diffusers' DDPM training example): an
    # attention block at 32x32 would hold a 1024x1024 score matrix per head and dominate the step
    down = ["DownBlock2D"] * len(widths)
    up = ["UpBlock2D"] * len(widths)
    if len(widths) >= 2:
        down[-2], up[1] = "AttnDownBlock2D", "AttnUpBlock2D"
    model = diffusers.UNet2DModel(sample_size=o["image_size"], block_out_channels=widths,
                                  layers_per_block=o["layers_per_block"], down_block_types=tuple(down),
                                  up_block_types=tuple(up), dropout=o["dropout"],
                                  norm_num_groups=min(32, min(widths)))
    shape = (o["batch_size"], 3, o["image_size"], o["image_size"])
    sample = torch.randn(shape, generator=g)
    timesteps = torch.randint(0, 1000, (o["batch_size"],), generator=g)
    return model.train(), (sample, timesteps, torch.randn(shape, generator=g)), _unet_loss


HF_MODELS: dict[str, Callable[[Any, dict[str, Any], torch.Generator], Built]] = {
    "llama": _llama, "gpt2": _gpt2, "bert": _bert, "t5": _t5, "resnet50": _resnet50,
}


def build_hf(o: dict[str, Any], g: torch.Generator) -> Built:
    """A transformers model from a config, one batch, the model's own loss (``hf/<model>``)."""
    name = str(o["model"])
    if name not in HF_MODELS:
        raise WorkloadError(f"unknown hf model '{name}'; choose one of {', '.join(HF_MODELS)}")
    tf = _library("transformers", f"hf/{name}")
    model, inputs, loss_fn = HF_MODELS[name](tf, o, g)
    return model.train(), inputs, loss_fn


def build_diffusers(o: dict[str, Any], g: torch.Generator) -> Built:
    """A diffusers model from a config, one noisy batch with timesteps, a denoising loss."""
    name = str(o["model"])
    if name != "unet2d":
        raise WorkloadError(f"unknown diffusers model '{name}'; choose one of unet2d")
    return _unet2d(o, g)


BUILDERS: dict[str, Callable[[dict[str, Any], torch.Generator], Built]] = {
    "hf": build_hf, "diffusers": build_diffusers,
}


# ---------------------------------------------------------------------------------------------
# Small library models for tests and examples, as factory specs (``env.workloads.zoo:hf_gpt2?n_layer=4``):
# the zoo's own builders at sizes that take milliseconds a step.

def _small(model: str, **options: Any) -> Workload:
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))  # from the loader's seed
    built, inputs, loss_fn = build_hf(dict(model=model, **options), g)
    return Workload(f"hf_{model}", built, inputs, loss_fn=loss_fn)


def hf_gpt2(n_layer: int = 4, n_embd: int = 64, n_head: int = 2, vocab_size: int = 128, seq_len: int = 16,
            batch_size: int = 2, dropout: float = 0.1) -> Any:
    """A small ``GPT2LMHeadModel`` (random weights), one batch of tokens, LM loss."""
    return _small("gpt2", n_layer=n_layer, d_model=n_embd, n_head=n_head, vocab_size=vocab_size, seq_len=seq_len,
                  batch_size=batch_size, dropout=dropout)


def hf_bert(n_layer: int = 4, hidden: int = 64, n_head: int = 2, vocab_size: int = 128, seq_len: int = 16,
            batch_size: int = 2, dropout: float = 0.1) -> Any:
    """A small ``BertForMaskedLM`` (random weights), one batch of tokens, MLM loss."""
    return _small("bert", n_layer=n_layer, d_model=hidden, n_head=n_head, vocab_size=vocab_size, seq_len=seq_len,
                  batch_size=batch_size, dropout=dropout)


def hf_llama(n_layer: int = 2, hidden: int = 32, n_head: int = 2, vocab_size: int = 128, seq_len: int = 16,
             batch_size: int = 2, dropout: float = 0.1) -> Any:
    """A small ``LlamaForCausalLM`` (random weights), one batch of tokens, LM loss."""
    return _small("llama", n_layer=n_layer, d_model=hidden, n_head=n_head, d_ff=2 * hidden, vocab_size=vocab_size,
                  seq_len=seq_len, batch_size=batch_size, dropout=dropout)

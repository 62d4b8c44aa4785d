"""The precision a training step runs at, as Lightning names it, part of the workload.

==============  =======================================================================
``32``          fp32 weights and compute (the default)
``bf16-mixed``  fp32 weights and optimizer state, the step under ``torch.autocast(bfloat16)``
``16-mixed``    as ``bf16-mixed`` in float16, the loss scaled by a ``torch.amp.GradScaler``
``bf16-true``   bf16 weights, gradients and optimizer state, no autocast
==============  =======================================================================

``matmul_precision`` is ``torch.set_float32_matmul_precision``'s ``highest`` (default) or ``high``
(TF32 on CUDA). Both ride in the workload spec as options (``gpt/small?precision=bf16-mixed``),
so every process that builds the workload, every record keyed by it, the run's config, report,
frontier file and exported plans carry them; the default ``32`` / ``highest`` is not written.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch

from env.workloads.spec import (MATMUL_PRECISIONS, PRECISION_DEFAULTS, PRECISIONS, precision_note,
                                split_precision)

__all__ = ["PRECISIONS", "MATMUL_PRECISIONS", "PRECISION_DEFAULTS", "split_precision", "precision_note", "autocast",
           "grad_scaler", "cast_floats", "fsdp_mixed_precision"]


_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast(precision: str, device: torch.device) -> ContextManager[Any]:
    """The autocast a step's forward runs under (none but for the ``-mixed`` precisions), its weight cache off.

    The cache keeps each weight's low-precision copy from its first use to the end of the forward, so what a
    unit's forward leaves behind depends on what every other unit did (a recomputed unit's copies go when its
    forward ends): per-unit costs no longer add up, and the profile, which adds them, cannot predict a plan's
    peak. The step's peak lies in backward, after the cache is emptied, so turning the cache off does not
    change it (docs/measurement.md, "Autocast's weight cache"). A weight used once per forward is cast once
    either way."""
    if precision not in _AUTOCAST:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=_AUTOCAST[precision], cache_enabled=False)


def fsdp_mixed_precision(precision: str) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for the ``-mixed`` precisions (parameters gathered in the autocast dtype,
    gradients reduced in fp32); None for the others (``bf16-true`` shards bf16 parameters as they are)."""
    if precision not in _AUTOCAST:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=_AUTOCAST[precision], reduce_dtype=torch.float32)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """``16-mixed``'s loss scaler; None for the others. On CPU, float16 autocast may be unsupported: torch says so."""
    return torch.amp.GradScaler(device.type) if precision == "16-mixed" else None


def cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    """``obj`` (a tensor, tuple, list or dict of them) with its floating tensors cast to ``dtype``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(cast_floats(v, dtype) for v in obj)
    return obj

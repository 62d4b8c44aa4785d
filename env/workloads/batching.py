"""A workload at any micro-batch: the same model, loss and optimizer, a batch of another size.

How the batch of a workload is resized depends on what built it (``batching_for``):

==========================================  =================================================================
workload                                    a micro-batch of ``b`` samples
==========================================  =================================================================
built-in and zoo (``gpt/small``, ``hf/..``)  the spec with ``batch_size=b`` (same seed: the same kind of data)
a user factory with a ``batch_size``        the factory called with ``batch_size=b`` (and the spec's options)
parameter
any workload, with ``batch_dim`` given      every input tensor whose size along ``batch_dim`` is the batch's
(``--batch-dim 0``: batch-first inputs)     is sliced to ``b`` (fewer) or tiled to ``b`` (more) along it
anything else                               refused in one line that says how to make the factory batch-aware
==========================================  =================================================================

The model is never rebuilt for another batch: ``MicroBatches.use(b)`` swaps the workload's inputs
for the ``b``-sample ones and puts them back after, so its weights and optimizer state stay what
they are (a throw-away model is built once per size where only the factory can make the batch).
Inputs are made once per size and kept. ``tokens_per_sample`` says how many tokens a sample
holds where the workload knows (language models: the sequence length), for tokens/s.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch

from env.data.errors import WorkloadError
from env.workloads.spec import WorkloadSpec, builtin_options
from env.workloads.workload import Inputs, Workload, resolve_factory, load_workload

__all__ = ["MicroBatches", "batching_for", "tokens_per_sample", "resize_inputs"]


def resize_inputs(inputs: Inputs, size: int, batch_dim: int, base: int) -> Inputs:
    """Each tensor of ``inputs`` whose size along ``batch_dim`` is ``base``, as ``size`` samples along it:
    its first ``size`` (fewer) or its samples repeated in order (more); anything else as it is."""
    def resized(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.dim() > batch_dim and v.shape[batch_dim] == base:
            return v.index_select(batch_dim, torch.arange(size, device=v.device) % base)
        return v

    if isinstance(inputs, dict):
        return {k: resized(v) for k, v in inputs.items()}
    return tuple(resized(v) for v in inputs)


def _first_batch(inputs: Inputs, batch_dim: int) -> int | None:
    values = inputs.values() if isinstance(inputs, dict) else inputs
    return next((int(v.shape[batch_dim]) for v in values if isinstance(v, torch.Tensor) and v.dim() > batch_dim), None)


class MicroBatches:
    """The inputs of one workload at any micro-batch size; ``base`` is the size it was built with."""

    def __init__(self, workload: Workload, base: int, how: str, batch_dim: int | None = None) -> None:
        self.workload, self.base, self.how, self.batch_dim = workload, base, how, batch_dim
        self._inputs: dict[int, Inputs] = {base: workload.inputs}

    def inputs(self, size: int) -> Inputs:
        """The workload's inputs with ``size`` samples (made on first use, then kept)."""
        if size < 1:
            raise WorkloadError(f"micro-batch {size} must be at least 1 sample")
        if size not in self._inputs:
            self._inputs[size] = self._make(size)
        return self._inputs[size]

    def _make(self, size: int) -> Inputs:
        if self.batch_dim is not None:
            return resize_inputs(self._inputs[self.base], size, self.batch_dim, self.base)
        spec = WorkloadSpec.parse(self.workload.spec)
        options = tuple(sorted({**dict(spec.options), "batch_size": str(size)}.items()))
        seed = int(self.workload.meta.get("seed", 0))
        other = load_workload(WorkloadSpec(spec.target, spec.preset, options), seed=seed)
        device = self.workload.device
        return {k: _to(v, device) for k, v in other.inputs.items()} if isinstance(other.inputs, dict) else \
            tuple(_to(v, device) for v in other.inputs)

    @contextlib.contextmanager
    def use(self, size: int) -> Iterator[Workload]:
        """The workload with ``size``-sample inputs inside the block (its model and optimizer untouched)."""
        before = self.workload.inputs
        self.workload.inputs = self.inputs(size)
        try:
            yield self.workload
        finally:
            self.workload.inputs = before


def _to(v: Any, device: torch.device) -> Any:
    return v.to(device) if isinstance(v, torch.Tensor) else v


def batching_for(workload: Workload, batch_dim: int | None = None) -> MicroBatches:
    """How ``workload`` changes its micro-batch (the module's table), or a one-line ``WorkloadError``."""
    if batch_dim is not None:
        base = _first_batch(workload.inputs, batch_dim)
        if batch_dim < 0 or base is None:
            raise WorkloadError(f"--batch-dim {batch_dim}: workload '{workload.spec}' has no input tensor with that "
                                "dimension; give the dimension its inputs hold the samples in (0: batch-first)")
        return MicroBatches(workload, base, f"inputs sliced or tiled along dimension {batch_dim}", batch_dim)
    spec = WorkloadSpec.parse(workload.spec)
    if spec.is_builtin:
        return MicroBatches(workload, int(builtin_options(spec)["batch_size"]), "the batch_size option")
    parameter = inspect.signature(resolve_factory(spec.target)).parameters.get("batch_size")
    if parameter is None or parameter.kind in (parameter.POSITIONAL_ONLY, parameter.VAR_POSITIONAL):
        raise WorkloadError(
            f"workload factory '{spec.target}' takes no batch_size, so its micro-batch cannot change; add a "
            "batch_size=... parameter that sets how many samples its inputs hold, or give --batch-dim 0 if its "
            "inputs hold the samples along their first dimension")
    given = dict(spec.options).get("batch_size")
    base = int(given) if given is not None else (parameter.default if isinstance(parameter.default, int) else None)
    base = base if base is not None else _first_batch(workload.inputs, 0)
    if base is None:
        raise WorkloadError(f"workload factory '{spec.target}': give its batch_size a default, or name it in the spec "
                            f"({spec.target}?batch_size=8)")
    return MicroBatches(workload, int(base), "the factory's batch_size parameter")


def tokens_per_sample(workload: Workload) -> int | None:
    """Tokens one sample holds (a language model's sequence length), or None where the workload does
    not say: built-ins with a ``seq_len`` option (``tokens`` when set), factories through
    ``Workload.meta['tokens_per_sample']``."""
    if "tokens_per_sample" in workload.meta:
        return int(workload.meta["tokens_per_sample"])
    spec = WorkloadSpec.parse(workload.spec)
    if not spec.is_builtin:
        return None
    options = builtin_options(spec)
    if "seq_len" not in options:
        return None
    return int(options.get("tokens") or options["seq_len"])

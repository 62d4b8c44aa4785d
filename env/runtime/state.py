"""What a check or a measurement on the user's own model must leave as it found it.

``env.runtime.chains.state_kept`` puts back gradients, buffers and torch's generators. Here, besides:

- :func:`python_state_kept`: numpy's and Python's global generators and every module's plain public attributes
  (numbers, flags, strings: a call counter, a step flag), which a forward may read and change;
- :func:`training_state_kept`: all of it, and the weights and the optimizer's state, copied to host memory, so
  that measured training steps (which move the weights) leave the model as it was.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn as nn

from env.runtime.chains import state_kept

PLAIN = (int, float, bool, str, type(None))  # the module attributes put back


def plain_attributes(model: nn.Module) -> dict[tuple[str, str], Any]:
    """Every module's plain public attributes (numbers, flags, strings), by (module name, attribute)."""
    return {(name, k): v for name, m in model.named_modules() for k, v in vars(m).items()
            if not k.startswith("_") and isinstance(v, PLAIN)}


@contextlib.contextmanager
def python_state_kept(model: nn.Module) -> Iterator[None]:
    """numpy's and Python's global generators and the modules' plain attributes as they were on entry."""
    np_state, py_state = np.random.get_state(), random.getstate()
    attrs = plain_attributes(model)
    try:
        yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
        modules = dict(model.named_modules())
        for (name, k) in set(plain_attributes(model)) - set(attrs):
            modules[name].__dict__.pop(k, None)  # made during the block
        for (name, k), v in attrs.items():
            modules[name].__dict__[k] = v


def _to_host(obj: Any) -> Any:
    """A copy of a nested state dict with every tensor cloned to host memory."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_host(v) for v in obj)
    return obj


@contextlib.contextmanager
def training_state_kept(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Iterator[None]:
    """Weights, gradients, buffers, the optimizer's state, the generators and plain module attributes as on entry:
    training steps taken inside leave no trace. The copies live in host memory, not on the model's device."""
    weights = [(p, p.detach().to("cpu", copy=True)) for p in model.parameters()]
    opt_state = _to_host(optimizer.state_dict()) if optimizer is not None else None
    try:
        with state_kept(model), python_state_kept(model):
            yield
    finally:
        with torch.no_grad():
            for p, saved in weights:
                p.copy_(saved)
        if optimizer is not None:
            optimizer.load_state_dict(opt_state)

"""``Workload``: what one training step is (a model, one example batch, a loss, an optimizer, a precision).

``env.workloads.workload.load_workload`` builds one from a spec; the library models' factories
(``env.workloads.zoo``) build one directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from env.data.errors import WorkloadError
from env.workloads import precision

Inputs = tuple[Any, ...] | dict[str, Any]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW, what large models are trained with: its two state tensors per parameter count."""
    return torch.optim.AdamW(params, lr=1e-4)


@dataclass
class Workload:
    """One training step: ``loss_fn(model, inputs)`` (default: call the model) then backward, at ``precision``
    (``env.workloads.precision``: the forward under its autocast, ``16-mixed``'s backward and step through a
    gradient scaler; ``bf16-true``'s model and inputs are cast by ``load_workload``)."""

    spec: str
    model: nn.Module
    inputs: Inputs
    loss_fn: Callable[[nn.Module, Inputs], torch.Tensor] | None = None
    optimizer_factory: OptimizerFactory = default_optimizer
    meta: dict[str, Any] = field(default_factory=dict)
    precision: str = "32"  # Lightning's name (env.workloads.precision): 32, bf16-mixed, 16-mixed, bf16-true
    _optimizer: torch.optim.Optimizer | None = field(default=None, init=False, repr=False)
    _scaler: Any = field(default=None, init=False, repr=False)  # 16-mixed's GradScaler, made on first backward

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The workload's one optimizer, made on first use: its state is part of what is live in a step."""
        if self._optimizer is None:
            self._optimizer = self.optimizer_factory(self.model.parameters())
        return self._optimizer

    def loss(self) -> torch.Tensor:
        """The step's forward, under the precision's autocast."""
        with precision.autocast(self.precision, self.device):
            if self.loss_fn is not None:
                out = self.loss_fn(self.model, self.inputs)
            elif isinstance(self.inputs, dict):
                out = self.model(**self.inputs)
            else:
                out = self.model(*self.inputs)
        if not (isinstance(out, torch.Tensor) and out.dim() == 0 and out.is_floating_point()):
            got = f"a tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise WorkloadError(
                f"workload '{self.spec}': the loss must be a scalar float tensor, got {got}; "
                "reduce it in the model or loss_fn (e.g. .mean())"
            )
        return out

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``; at ``16-mixed`` the scaled loss's."""
        if self.precision == "16-mixed" and self._scaler is None:
            self._scaler = precision.grad_scaler(self.precision, self.device)
        (self._scaler.scale(loss) if self._scaler is not None else loss).backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; at ``16-mixed`` through the scaler (skipped on inf/NaN gradients, then rescaled)."""
        if self._scaler is None:
            optimizer.step()
            return
        self._scaler.step(optimizer)
        self._scaler.update()

    @property
    def batch_shape(self) -> str:
        """The shapes of the input tensors, e.g. ``idx:8x256,targets:8x256``."""
        items = self.inputs.items() if isinstance(self.inputs, dict) else enumerate(self.inputs)
        parts = [f"{k}:{'x'.join(map(str, v.shape))}" for k, v in items if isinstance(v, torch.Tensor)]
        return ",".join(parts)

    @property
    def device(self) -> torch.device:
        p = next(self.model.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def to(self, device: str | torch.device) -> "Workload":
        self.model.to(device)
        if isinstance(self.inputs, dict):
            self.inputs = {k: _move(v, device) for k, v in self.inputs.items()}
        else:
            self.inputs = tuple(_move(v, device) for v in self.inputs)
        return self


def _move(v: Any, device: str | torch.device) -> Any:
    return v.to(device) if isinstance(v, torch.Tensor) else v

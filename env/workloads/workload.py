"""Workloads: what one training step is (a model, one example batch, a loss, an optimizer).

``load_workload(spec)`` builds what a spec string names (``env.workloads.spec``: a built-in such as
``gpt/tiny``, a library model such as ``hf/llama``, or a user's ``path/to/file.py:factory``). The
simplest factory returns ``(module, inputs)`` where ``module(*inputs)`` (or ``module(**inputs)`` for a
dict) returns a scalar loss; a richer one returns a :class:`Workload`. Everything is built under a
fixed seed, so two processes building the same spec get the same weights and the same batch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from env.data.errors import WorkloadError
from env.workloads import models, precision, zoo
from env.workloads.spec import BUILTIN_DEFAULTS, WorkloadSpec, builtin_options, guess_option, int_list

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


# ---------------------------------------------------------------------------------------------
# Built-ins. Defaults take about a second a step on 2 CPU cores; ``tiny`` is for tests.



def _build_gpt(o: dict[str, Any], g: torch.Generator) -> tuple[nn.Module, Inputs]:
    model = models.GPT(o["vocab_size"], o["seq_len"], o["n_layer"], o["d_model"], o["n_head"], o["dropout"])
    tokens = o["tokens"] or o["seq_len"]  # a batch of shorter sequences than the model's context: the same model
    if not 0 < tokens <= o["seq_len"]:
        raise WorkloadError(f"option tokens={o['tokens']} must lie between 1 and seq_len={o['seq_len']} (0: seq_len)")
    shape = (o["batch_size"], tokens)
    idx = torch.randint(0, o["vocab_size"], shape, generator=g)
    return model, (idx, torch.randint(0, o["vocab_size"], shape, generator=g))




def _build_cnn(o: dict[str, Any], g: torch.Generator) -> tuple[nn.Module, Inputs]:
    widths = int_list(o, "widths")
    blocks = int_list(o, "blocks_per_stage")
    if len(blocks) == 1:
        blocks *= len(widths)
    if len(blocks) != len(widths):
        raise WorkloadError(f"cnn option blocks_per_stage={o['blocks_per_stage']} names {len(blocks)} stages but "
                            f"widths={o['widths']} names {len(widths)}; give one count, or one per width")
    model = models.ResNetCNN(widths, blocks, o["n_classes"], o["dropout"])
    images = torch.randn(o["batch_size"], 3, o["image_size"], o["image_size"], generator=g)
    return model, (images, torch.randint(0, o["n_classes"], (o["batch_size"],), generator=g))


def _build_lstm(o: dict[str, Any], g: torch.Generator) -> tuple[nn.Module, Inputs]:
    model = models.StackedLSTM(o["vocab_size"], o["n_layer"], o["d_model"], o["dropout"])
    shape = (o["batch_size"], o["seq_len"])
    idx = torch.randint(0, o["vocab_size"], shape, generator=g)
    return model, (idx, torch.randint(0, o["vocab_size"], shape, generator=g))


def _build_mlp(o: dict[str, Any], g: torch.Generator) -> tuple[nn.Module, Inputs]:
    model = models.MLP(o["d_in"], o["width"], o["n_layer"], o["dropout"])
    x = torch.randn(o["batch_size"], o["d_in"], generator=g)
    return model, (x, torch.randn(o["batch_size"], generator=g))


BUILDERS: dict[str, Callable[[dict[str, Any], torch.Generator], tuple[Any, ...]]] = {
    "gpt": _build_gpt, "cnn": _build_cnn, "lstm": _build_lstm, "mlp": _build_mlp,
}
# Library models (hf/llama, diffusers/unet2d, ...): a builder per library, the models are its presets.
# Their builders return (model, inputs, loss_fn).
BUILDERS.update(zoo.BUILDERS)
assert set(BUILDERS) == set(BUILTIN_DEFAULTS), "every built-in spec needs a builder"


# ---------------------------------------------------------------------------------------------
# Spec strings



def resolve_factory(target: str) -> Callable[..., Any]:
    """A user's factory ``path/to/file.py:factory`` or ``package.module:factory``, its file imported; one
    ``WorkloadError`` line where the file is missing, fails to import or lacks the factory."""
    where, _, func = target.rpartition(":")
    if not where or not func:
        raise WorkloadError(f"workload '{target}' must look like path/to/file.py:factory or package.module:factory")
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise WorkloadError(f"workload file '{where}' does not exist; check the path (relative to {Path.cwd()})")
        mod_name = f"_ckpt_workload_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:  # the user's file failed to import: say which and why, on one line
            raise WorkloadError(f"workload file '{where}' failed to import: {type(e).__name__}: {e}; fix the file") from e
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise WorkloadError(f"cannot import module '{where}' for workload '{target}': {e}; check PYTHONPATH") from e
    factory = getattr(module, func, None)
    if not callable(factory):
        public = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                  and getattr(v, "__module__", None) == module.__name__]
        raise WorkloadError(
            f"'{where}' has no factory function '{func}'; define it there or name one of: {', '.join(public) or '(none)'}"
        )
    return factory


def load_workload(spec: str | WorkloadSpec, seed: int = 0, device: str | torch.device = "cpu") -> Workload:
    """Build the workload a spec names, deterministically for a seed, on a device."""
    full = WorkloadSpec.parse(spec) if isinstance(spec, str) else spec
    own, chosen = precision.split_precision(dict(full.options))
    parsed = WorkloadSpec(full.target, full.preset, tuple(sorted(own.items())))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(seed)
        if parsed.is_builtin:
            opts = builtin_options(parsed)
            model, inputs, *loss_fn = BUILDERS[parsed.target](opts, g)
            workload = Workload(str(parsed), model, inputs, loss_fn=loss_fn[0] if loss_fn else None,
                                meta={"options": opts, "seed": seed})
        else:
            workload = _call_factory(parsed, seed)
    workload.spec, workload.precision = str(full), chosen["precision"]
    workload.meta["precision"] = dict(chosen)
    torch.set_float32_matmul_precision(chosen["matmul_precision"])  # process-wide: one workload per measuring process
    if workload.precision == "bf16-true":  # bf16 weights, hence gradients and optimizer state
        workload.model.to(torch.bfloat16)
        workload.inputs = precision.cast_floats(workload.inputs, torch.bfloat16)
    return workload.to(device)


def _call_factory(parsed: WorkloadSpec, seed: int) -> Workload:
    factory = resolve_factory(parsed.target)
    kwargs = {k: guess_option(v) for k, v in parsed.options}
    try:
        made = factory(**kwargs)
    except Exception as e:  # a broken user factory: one line naming it and its error
        raise WorkloadError(
            f"workload factory '{parsed.target}' raised {type(e).__name__}: {e}; fix the factory (call it alone to see the traceback)"
        ) from e
    if isinstance(made, Workload):
        made.spec = str(parsed)
        made.meta.setdefault("seed", seed)
        return made
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        module, inputs = made
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if not isinstance(inputs, (tuple, list, dict)):
            raise WorkloadError(
                f"workload factory '{parsed.target}' returned inputs of type {type(inputs).__name__}; "
                "return a tensor, a tuple of arguments or a dict of keyword arguments"
            )
        inputs = tuple(inputs) if isinstance(inputs, list) else inputs
        return Workload(str(parsed), module, inputs, meta={"seed": seed, "options": dict(kwargs)})
    raise WorkloadError(
        f"workload factory '{parsed.target}' returned {type(made).__name__}; "
        "return (module, inputs) with module(*inputs) a scalar loss, or an env.workloads.workload.Workload"
    )



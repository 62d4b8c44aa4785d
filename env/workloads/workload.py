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
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from env.data.errors import WorkloadError
from env.workloads import models, precision, zoo
from env.workloads.spec import BUILTIN_DEFAULTS, WorkloadSpec, builtin_options, guess_option, int_list
from env.workloads.step import Inputs, OptimizerFactory, Workload, default_optimizer

__all__ = ["Inputs", "OptimizerFactory", "Workload", "default_optimizer", "load_workload", "resolve_factory"]

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



"""Workload spec strings and the options of the built-in and library workloads. Torch-free.

A workload is named by a spec string:

- a built-in: ``gpt``, ``cnn``, ``lstm``, ``mlp``, optionally with a preset and options:
  ``gpt/tiny``, ``gpt?n_layer=12``, ``cnn/tiny?batch_size=4``;
- a library model built from its config (``env.workloads.zoo``; optional extra ``hf``): ``hf/llama``,
  ``hf/gpt2``, ``hf/bert``, ``hf/t5``, ``hf/resnet50``, ``diffusers/unet2d``, options as above;
- a user's factory: ``path/to/file.py:factory`` or ``package.module:factory``, options passed
  to the factory as keyword arguments (``my.py:make?width=64``).

``builtin_options`` resolves a built-in's options (defaults, then preset, then the spec's own);
``env.workloads.workload.load_workload`` builds what a spec names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from env.data.errors import WorkloadError

# ---------------------------------------------------------------------------------------------
# Built-ins. Defaults take about a second a step on 2 CPU cores; ``tiny`` is for tests.

BUILTIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt": dict(vocab_size=4096, seq_len=256, n_layer=6, d_model=384, n_head=6, dropout=0.1, batch_size=8, tokens=0),
    "cnn": dict(widths="32,64,128,256", blocks_per_stage="2", image_size=160, n_classes=10, dropout=0.1,
                batch_size=32),
    "lstm": dict(vocab_size=4096, seq_len=128, n_layer=6, d_model=256, dropout=0.1, batch_size=16),
    "mlp": dict(d_in=256, width=512, n_layer=8, dropout=0.1, batch_size=1024),
}
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "gpt": {"tiny": dict(vocab_size=128, seq_len=16, n_layer=4, d_model=32, n_head=2, batch_size=2),
            "small": dict(vocab_size=1024, seq_len=128, n_layer=6, d_model=128, n_head=4, batch_size=4),
            # GPT-2 124M; the batch fills about 40% of an 80 GB GPU at bf16-mixed, all kept (estimate: docs/workloads.md)
            "gpt2": dict(vocab_size=50257, seq_len=1024, n_layer=12, d_model=768, n_head=12, batch_size=24)},
    "cnn": {"tiny": dict(widths="8,16", blocks_per_stage="2", image_size=32, batch_size=2),
            "small": dict(widths="16,32,64", blocks_per_stage="2", image_size=64, batch_size=8)},
    "lstm": {"tiny": dict(vocab_size=64, seq_len=8, n_layer=3, d_model=16, batch_size=2),
             "small": dict(vocab_size=1024, seq_len=64, n_layer=4, d_model=128, batch_size=8)},
    "mlp": {"tiny": dict(d_in=8, width=16, n_layer=4, batch_size=4),
            "small": dict(d_in=64, width=256, n_layer=6, batch_size=128)},
}
CORE_BUILTINS: tuple[str, ...] = tuple(BUILTIN_DEFAULTS)

# Library models (hf/llama, diffusers/unet2d, ...): a target per library, the models are its presets
# (env.workloads.zoo builds them). ``model`` names the architecture a preset builds.
_LM = dict(n_layer=6, d_model=256, n_head=4, vocab_size=1024, seq_len=256, batch_size=8, dropout=0.1)
ZOO_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "hf": {
        "llama": dict(model="llama", **_LM, d_ff=688),
        # about 0.95B parameters (TinyLlama's width at 16 layers, heads not grouped); the batch fills about 40% of an 80 GB GPU
        # at bf16-mixed, all kept (estimate: docs/workloads.md)
        "llama-1b": dict(model="llama", n_layer=16, d_model=2048, n_head=32, vocab_size=32000, seq_len=2048,
                         batch_size=3, dropout=0.0, d_ff=5632),
        "gpt2": dict(model="gpt2", **_LM),
        "bert": dict(model="bert", **_LM),
        "t5": dict(model="t5", **{**_LM, "batch_size": 4}, d_ff=1024, target_len=128),
        "resnet50": dict(model="resnet50", depths="3,4,6,3", widths="256,512,1024,2048", image_size=128,
                         n_classes=10, batch_size=8),
    },
    "diffusers": {
        "unet2d": dict(model="unet2d", widths="32,64,128,128", layers_per_block=2, image_size=64, batch_size=4,
                       dropout=0.1),
    },
}
# no defaults: a zoo spec names its model (builtin_options asks for a preset)
BUILTIN_DEFAULTS.update({target: {} for target in ZOO_PRESETS})
PRESETS.update(ZOO_PRESETS)


def zoo_specs() -> list[str]:
    """Every zoo workload as a spec: ``hf/llama``, ..., ``diffusers/unet2d``."""
    return [f"{target}/{preset}" for target, presets in ZOO_PRESETS.items() for preset in presets]


def workload_names() -> list[str]:
    """The core built-ins (each has a ``tiny`` preset); library models: ``env.workloads.zoo.zoo_specs()``."""
    return list(CORE_BUILTINS)


def int_list(o: dict[str, Any], key: str) -> tuple[int, ...]:
    """A comma-separated option of positive integers, e.g. ``widths=32,64,128``."""
    try:
        values = tuple(int(v) for v in str(o[key]).split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise WorkloadError(f"option {key}={o[key]} must be positive integers separated by commas, e.g. {key}=2,2")
    return values


@dataclass(frozen=True)
class WorkloadSpec:
    """A parsed spec: ``target`` (built-in name or ``file.py:func`` / ``pkg.mod:func``), preset, options."""

    target: str
    preset: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> "WorkloadSpec":
        text = text.strip()
        if not text:
            raise WorkloadError("empty workload spec; give a built-in (gpt, cnn, lstm, mlp) or path/to/file.py:factory")
        head, _, query = text.partition("?")
        options = tuple(sorted(parse_qsl(query, keep_blank_values=True)))
        preset = None
        if ":" not in head and "/" in head:
            head, preset = head.split("/", 1)
        return cls(head, preset, options)

    @property
    def is_builtin(self) -> bool:
        return ":" not in self.target

    def __str__(self) -> str:
        s = self.target + (f"/{self.preset}" if self.preset else "")
        return s + (f"?{urlencode(self.options)}" if self.options else "")


_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def coerce_option(key: str, value: str, like: Any) -> Any:
    """``value`` as the type of the option's default ``like``; a bad value fails on one line."""
    if isinstance(like, bool):
        if value.lower() not in _BOOLS:
            raise WorkloadError(f"option {key}={value} must be true or false (also 1/0, yes/no), e.g. {key}=true")
        return _BOOLS[value.lower()]
    for kind in (int, float):
        if isinstance(like, kind):
            try:
                return kind(value)
            except ValueError:
                raise WorkloadError(f"option {key}={value} must be {'an integer' if kind is int else 'a number'}, "
                                    f"e.g. {key}={like}") from None
    return value


def guess_option(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def builtin_options(spec: WorkloadSpec) -> dict[str, Any]:
    """The resolved options of a built-in spec (defaults, then preset, then explicit options); the precision
    options every workload takes (``split_precision``) are checked there and left out here."""
    if spec.target not in BUILTIN_DEFAULTS:
        raise WorkloadError(
            f"unknown workload '{spec.target}'; choose one of {', '.join(CORE_BUILTINS)}, "
            f"a library model ({', '.join(zoo_specs())}), "
            "or give path/to/file.py:factory or package.module:factory"
        )
    opts = dict(BUILTIN_DEFAULTS[spec.target])
    if spec.preset is None and not opts:  # a library target (hf, diffusers): its presets are the models
        choices = ", ".join(f"{spec.target}/{p}" for p in PRESETS[spec.target])
        raise WorkloadError(f"workload '{spec.target}' needs a model preset; choose one of {choices}")
    if spec.preset is not None:
        presets = PRESETS[spec.target]
        if spec.preset not in presets:
            raise WorkloadError(
                f"unknown preset '{spec.preset}' for workload '{spec.target}'; choose one of {', '.join(presets)}"
            )
        opts.update(presets[spec.preset])
    own, _ = split_precision(dict(spec.options))  # the options every workload takes, checked there
    for key, value in own.items():
        if key not in opts:
            raise WorkloadError(
                f"unknown option '{key}' for workload '{spec.target}'; valid options: {', '.join(sorted(opts))}"
            )
        opts[key] = coerce_option(key, value, opts[key])
    check_ranges(spec.target, opts)
    return opts


AT_LEAST_ZERO = ("tokens",)  # 0: the workload's own default
FRACTIONS = ("dropout",)  # a probability in [0, 1)


def check_ranges(target: str, opts: dict[str, Any]) -> None:
    """Every numeric option of a built-in in its range, checked once for the CLI and the dashboard alike:
    sizes and counts at least 1 (``gpt?n_layer=0`` builds a model with no blocks), ``tokens`` at least 0,
    ``dropout`` in [0, 1). One line naming the option, its value and the range."""
    for key, value in opts.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key in FRACTIONS:
            ok, want = 0 <= value < 1, "in [0, 1)"
        elif key in AT_LEAST_ZERO:
            ok, want = value >= 0, "at least 0"
        else:
            ok, want = value >= 1, "at least 1"
        if not ok:
            raise WorkloadError(f"option {key}={value} of workload '{target}' must be {want}; e.g. {key}="
                                f"{BUILTIN_DEFAULTS.get(target, {}).get(key, 1) or 1}")


# ---------------------------------------------------------------------------------------------
# Precision: options every workload takes (env.workloads.precision runs the step so)

PRECISIONS: tuple[str, ...] = ("32", "bf16-mixed", "16-mixed", "bf16-true")
MATMUL_PRECISIONS: tuple[str, ...] = ("highest", "high")
PRECISION_DEFAULTS = {"precision": "32", "matmul_precision": "highest"}  # options every workload takes


def split_precision(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the workload's own options, its precision options with defaults filled in), the latter checked."""
    own = {k: v for k, v in options.items() if k not in PRECISION_DEFAULTS}
    chosen = {k: str(options.get(k, d)) for k, d in PRECISION_DEFAULTS.items()}
    if chosen["precision"] not in PRECISIONS:
        raise WorkloadError(f"precision={chosen['precision']} is not one of {', '.join(PRECISIONS)} (Lightning's "
                            "names); e.g. precision=bf16-mixed")
    if chosen["matmul_precision"] not in MATMUL_PRECISIONS:
        raise WorkloadError(f"matmul_precision={chosen['matmul_precision']} is not one of "
                            f"{', '.join(MATMUL_PRECISIONS)}; e.g. matmul_precision=high (TF32 on CUDA)")
    return own, chosen


def fold_precision(workload: str, precision: str, matmul_precision: str) -> tuple[str, str, str]:
    """(spec, precision, matmul_precision) with the precision options written into the spec, which then says them
    alone: a value the spec names stands unless the flag gives another than the default; defaults are not
    written. A bad value is one ``WorkloadError`` line."""
    spec = WorkloadSpec.parse(workload)
    options = dict(spec.options)
    for key, flag in (("precision", precision), ("matmul_precision", matmul_precision)):
        default = PRECISION_DEFAULTS[key]
        options[key] = str(flag) if str(flag) != default else options.get(key, default)
    _, chosen = split_precision(options)
    own = {k: v for k, v in options.items() if PRECISION_DEFAULTS.get(k) != v}
    if own != dict(spec.options):  # as given otherwise: a run's spec and the records' stay what they were
        workload = str(WorkloadSpec(spec.target, spec.preset, tuple(sorted(own.items()))))
    return workload, chosen["precision"], chosen["matmul_precision"]


def precision_note(measured: str, applied: str) -> str | None:
    """One line when a plan measured at one precision is applied at another; None when they agree."""
    if measured == applied:
        return None
    return (f"this plan was measured at precision {measured} and is applied at {applied}: its peak and time were "
            f"measured for another step; search again with --precision {applied} for a plan priced at it")

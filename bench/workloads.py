"""The workloads the benchmarks measure: their sizes, and the units an expert would name on library models.

- ``BENCH_WORKLOADS``: the sizes the benchmarks measure by default. The built-in defaults take
  about 1.5 s a step (gpt) on 2 CPU cores and a measurement about five steps, too slow for the
  hundred-odd measurements a search comparison needs within ~5 minutes a workload; these
  "small" sizes keep each step under ~0.3 s while every unit still holds real activations.
- ``QUICK_WORKLOADS``: the same architectures at a few seconds a run, for ``--quick``.
- ``EXPERT_UNITS``: library models with the units a person who read the model would name
  (every block of each stage, encoder and decoder), and the options of a tiny size of each.
"""

from __future__ import annotations

from dataclasses import dataclass

USER_MODEL = "bench/user_model.py:make"
USER_UNET = "examples/unet_skips.py:build"

# name -> spec measured by default; "small" sizes so that one workload's comparison fits ~5 min
BENCH_WORKLOADS: dict[str, str] = {
    "gpt": "gpt/small",
    "cnn": "cnn/small?image_size=96&batch_size=16",
    "lstm": "lstm/small?n_layer=6",
    "user": USER_MODEL,
}
QUICK_WORKLOADS: dict[str, str] = {
    "gpt": "gpt/tiny",
    "cnn": "cnn/tiny",
    "lstm": "lstm/tiny",
    "user": USER_MODEL + "?depth=4&dim=16&image_size=16&patch=8&batch_size=2",
}


def workload_specs(names: list[str], quick: bool) -> dict[str, str]:
    """Short names (gpt, cnn, lstm, user), specs, or ``label=spec`` -> {label: spec}.

    A short name means the bench size (``BENCH_WORKLOADS``), or the quick one with ``quick``;
    ``gpt=gpt`` measures the built-in default size under the label ``gpt``.
    """
    table = QUICK_WORKLOADS if quick else BENCH_WORKLOADS
    out = {}
    for n in names:
        label, _, spec = n.partition("=")
        out[label] = spec if spec else table.get(n, n)
    return out


@dataclass(frozen=True)
class ExpertUnits:
    spec: str
    expert: tuple[str, ...]  # globs an expert would give
    quick: str  # options of a tiny size, for --quick


EXPERT_UNITS: tuple[ExpertUnits, ...] = (
    ExpertUnits("diffusers/unet2d", ("down_blocks.*", "mid_block", "up_blocks.*"), "batch_size=1&image_size=32"),
    ExpertUnits("hf/resnet50", ("resnet.encoder.stages.*.layers.*",), "batch_size=1&image_size=64"),
    ExpertUnits("hf/t5", ("encoder.block.*", "decoder.block.*"), "batch_size=1&seq_len=32&target_len=16"),
    ExpertUnits(USER_UNET, ("down1", "down2", "down3", "bottom", "dec3", "dec2", "dec1"), "batch_size=1&image_size=32"),
    ExpertUnits("hf/llama", ("model.layers.*",), "batch_size=1&seq_len=32"),
    ExpertUnits("hf/gpt2", ("transformer.h.*",), "batch_size=1&seq_len=32"),
    ExpertUnits("hf/bert", ("bert.encoder.layer.*",), "batch_size=1&seq_len=32"),
)

"""Workloads: built-ins build deterministically; bad specs, files and factories fail on one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from env.data.errors import WorkloadError
from env.workloads.spec import PRESETS, WorkloadSpec, builtin_options, workload_names
from env.workloads.workload import Workload, load_workload

TINY = [f"{name}/tiny" for name in ("gpt", "cnn", "lstm", "mlp")]


def one_line_error(exc: pytest.ExceptionInfo, *words: str) -> str:
    """The message, after asserting it is one line and names every word given."""
    msg = str(exc.value)
    assert "\n" not in msg, f"message is not one line: {msg!r}"
    for word in words:
        assert word in msg, f"{word!r} missing from: {msg}"
    return msg


def refused(spec: str, *words: str) -> str:
    """Loading ``spec`` fails with a one-line WorkloadError naming every word given; the message."""
    with pytest.raises(WorkloadError) as e:
        load_workload(spec)
    return one_line_error(e, *words)


def test_every_builtin_has_a_tiny_preset() -> None:
    assert set(workload_names()) == {"gpt", "cnn", "lstm", "mlp"}
    assert all("tiny" in PRESETS[name] for name in workload_names())


@pytest.mark.parametrize("spec", TINY)
def test_a_builtin_builds_the_same_weights_and_batch_for_a_seed(spec: str) -> None:
    a, b, other = load_workload(spec, seed=3), load_workload(spec, seed=3), load_workload(spec, seed=4)
    for (name, pa), (_, pb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(pa, pb), name
    assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs))
    assert not all(torch.equal(x, y) for x, y in zip(a.inputs, other.inputs))
    loss = a.loss()
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert a.model.training  # dropout is on during a measured step


def test_spec_options_override_the_preset_and_round_trip() -> None:
    w = load_workload("gpt/tiny?n_layer=2&batch_size=3")
    assert len(w.model.blocks) == 2
    assert w.batch_shape == "0:3x16,1:3x16"
    assert w.spec == "gpt/tiny?batch_size=3&n_layer=2"
    assert WorkloadSpec.parse(w.spec) == WorkloadSpec.parse("gpt/tiny?n_layer=2&batch_size=3")
    assert builtin_options(WorkloadSpec.parse("cnn/tiny?dropout=0.5"))["dropout"] == 0.5


def test_cnn_stages_take_one_depth_each_as_resnet() -> None:
    w = load_workload("cnn/tiny?widths=8,16,32,64&blocks_per_stage=3,4,6,3")
    assert len(w.model.features) == 1 + 16  # the stem, then ResNet-34's 3+4+6+3 blocks
    assert len(load_workload("cnn/tiny?blocks_per_stage=3").model.features) == 1 + 2 * 3
    with pytest.raises(WorkloadError) as e:
        load_workload("cnn/tiny?blocks_per_stage=3,4,6")
    one_line_error(e, "blocks_per_stage=3,4,6", "3 stages", "widths=8,16", "one per width")
    with pytest.raises(WorkloadError) as e:
        load_workload("cnn/tiny?blocks_per_stage=two")
    one_line_error(e, "blocks_per_stage=two", "positive integers")


def test_unknown_workload_names_the_choices() -> None:
    with pytest.raises(WorkloadError) as e:
        load_workload("transformer")
    one_line_error(e, "unknown workload 'transformer'", "gpt, cnn, lstm, mlp", "file.py:factory")


def test_unknown_preset_names_the_presets() -> None:
    with pytest.raises(WorkloadError) as e:
        load_workload("gpt/huge")
    one_line_error(e, "unknown preset 'huge'", "'gpt'", "tiny, small")


def test_unknown_option_names_the_valid_options() -> None:
    with pytest.raises(WorkloadError) as e:
        load_workload("mlp/tiny?depth=3")
    one_line_error(e, "unknown option 'depth'", "n_layer", "width")


def test_empty_spec() -> None:
    with pytest.raises(WorkloadError) as e:
        load_workload("  ")
    one_line_error(e, "empty workload spec", "gpt")


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "user_workload.py"
    path.write_text(body)
    return path


USER_FILE = '''
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Linear(width, width) for _ in range(3)))
    def forward(self, x):
        return self.blocks(x).pow(2).mean()

def make(width=8):
    return Net(width), torch.randn(4, width)

def vector_loss():
    class V(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        def forward(self, x):
            return self.blocks(x).sum(dim=1)
    return V(), torch.randn(3, 4)

def broken():
    raise ValueError("width must be even\\nsee the docs")

def not_a_workload():
    return 42
'''


def test_a_user_file_factory_builds_with_options(tmp_path: Path) -> None:
    path = _write(tmp_path, USER_FILE)
    w = load_workload(f"{path}:make?width=6")
    assert isinstance(w, Workload) and w.batch_shape == "0:4x6"
    assert w.loss().dim() == 0


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError) as e:
        load_workload(f"{tmp_path}/nope.py:make")
    one_line_error(e, "nope.py' does not exist", "check the path")


def test_a_file_without_the_factory_names_the_ones_it_has(tmp_path: Path) -> None:
    path = _write(tmp_path, USER_FILE)
    with pytest.raises(WorkloadError) as e:
        load_workload(f"{path}:build")
    msg = one_line_error(e, "no factory function 'build'", "make", "broken", "define it")
    assert "randn" not in msg  # imported names are not offered as factories


def test_a_factory_that_raises_is_one_line_with_its_cause(tmp_path: Path) -> None:
    path = _write(tmp_path, USER_FILE)
    with pytest.raises(WorkloadError) as e:
        load_workload(f"{path}:broken")
    one_line_error(e, ":broken' raised ValueError", "width must be even see the docs", "fix the factory")


def test_a_file_that_fails_to_import(tmp_path: Path) -> None:
    path = _write(tmp_path, "import torch\nraise RuntimeError('no GPU\\nat all')\n")
    with pytest.raises(WorkloadError) as e:
        load_workload(f"{path}:make")
    one_line_error(e, "failed to import", "RuntimeError: no GPU at all", "fix the file")


def test_a_factory_returning_something_else(tmp_path: Path) -> None:
    path = _write(tmp_path, USER_FILE)
    with pytest.raises(WorkloadError) as e:
        load_workload(f"{path}:not_a_workload")
    one_line_error(e, "returned int", "(module, inputs)")


def test_a_loss_that_is_not_a_scalar(tmp_path: Path) -> None:
    path = _write(tmp_path, USER_FILE)
    w = load_workload(f"{path}:vector_loss")
    with pytest.raises(WorkloadError) as e:
        w.loss()
    one_line_error(e, "must be a scalar float tensor", "shape (3,)", ".mean()")


def test_a_module_factory_that_cannot_be_imported() -> None:
    with pytest.raises(WorkloadError) as e:
        load_workload("no_such_package_xyz.models:make")
    one_line_error(e, "cannot import module 'no_such_package_xyz.models'", "PYTHONPATH")


def test_gpt_tokens_are_shorter_sequences_on_the_same_model() -> None:
    """``tokens``: a batch of shorter sequences than the context; the model (and a plan's fingerprint) stays."""
    from env.data.plan import fingerprint

    short, full = load_workload("gpt/tiny?tokens=8"), load_workload("gpt/tiny")
    assert short.inputs[0].shape == (2, 8) and full.inputs[0].shape == (2, 16)
    assert fingerprint(short.model, ["blocks.0"]) == fingerprint(full.model, ["blocks.0"])
    assert torch.isfinite(short.loss())


def test_the_gpu_sized_presets_have_their_models_shapes_on_the_meta_device():
    """gpt/gpt2 is GPT-2 124M and hf/llama-1b about 0.95B parameters; built on the meta device (no memory)."""
    from env.workloads import models
    from env.workloads.spec import WorkloadSpec, builtin_options

    o = builtin_options(WorkloadSpec.parse("gpt/gpt2"))
    with torch.device("meta"):
        gpt2 = models.GPT(o["vocab_size"], o["seq_len"], o["n_layer"], o["d_model"], o["n_head"], o["dropout"])
    assert round(sum(p.numel() for p in gpt2.parameters()) / 1e6) == 124  # the head is tied to the embedding
    assert (o["seq_len"], o["batch_size"]) == (1024, 24)
    transformers = pytest.importorskip("transformers")
    o = builtin_options(WorkloadSpec.parse("hf/llama-1b"))
    config = transformers.LlamaConfig(vocab_size=o["vocab_size"], hidden_size=o["d_model"], intermediate_size=o["d_ff"],
                                      num_hidden_layers=o["n_layer"], num_attention_heads=o["n_head"])
    with torch.device("meta"):
        llama = transformers.LlamaForCausalLM(config)
    assert round(sum(p.numel() for p in llama.parameters()) / 1e7) == 95  # 0.95B, embedding and head untied
    assert (o["seq_len"], o["batch_size"]) == (2048, 3)

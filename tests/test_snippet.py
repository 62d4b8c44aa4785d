"""The standalone snippet: same gradients, peak and model state as apply_plan; refuses other models."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from env.data.plan import Plan, fingerprint
from env.measure.measurement import measure
from env.runtime.apply import plan_for
from env.units.find import find_units
from env.workloads.workload import load_workload
from search import apply_plan
from search.training.snippet import merge_imports, plan_snippet

MIXED = ["recompute", "selective", "keep", "recompute"]
GRADED = ["light", "selective", "keep", "light"]  # 'light': the graded selective checkpoint


def _load(snippet: str) -> dict:
    ns: dict = {}
    exec(compile(snippet, "<snippet>", "exec"), ns)
    return ns


def _grads(w) -> dict[str, torch.Tensor]:
    torch.manual_seed(11)
    w.loss().backward()
    return {n: p.grad.clone() for n, p in w.model.named_parameters()}


def test_snippet_defines_the_plan_and_needs_only_torch():
    w = load_workload("gpt/tiny")
    plan = plan_for(w.model, find_units(w.model), MIXED)
    text = plan_snippet(plan, title="gpt/tiny")
    imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    roots = {line.split()[1].split(".")[0] for line in imports}
    assert roots <= {"__future__", "torch", "contextlib", "functools", "typing", "dataclasses", "hashlib", "enum", "weakref", "warnings"}, roots
    ns = _load(text)
    assert ns["PLAN"] == {k: v.value for k, v in plan.actions.items()}
    assert ns["FINGERPRINT"] == plan.fingerprint
    assert "recompute 2" in text.splitlines()[0]


def test_snippet_imports_each_name_once():
    w = load_workload("gpt/tiny")
    text = plan_snippet(plan_for(w.model, find_units(w.model), MIXED))
    imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert len(imports) == len(set(imports)) and "from __future__ import annotations" not in imports
    modules = [line.split()[1] for line in imports if line.startswith("from ")]
    assert len(modules) == len(set(modules)), imports  # one `from m import ...` per module
    names = [n.strip() for line in imports if line.startswith("from ") for n in line.split(" import ")[1].split(",")]
    assert len(names) == len(set(names)), imports
    assert merge_imports(["from typing import Any", "import os", "from typing import Any, Callable as C", "import os",
                          "from __future__ import annotations"]) == ["import os", "from typing import Any, Callable as C"]


def test_snippet_loads_as_a_module_by_name_and_from_its_path(tmp_path: Path):
    """Users import the exported file by name, or load it from a path with importlib (a module that is
    then not in sys.modules): both define the plan, in a process that imports nothing of this project."""
    w = load_workload("gpt/tiny")
    plan = plan_for(w.model, find_units(w.model), MIXED)
    (tmp_path / "ckpt_plan.py").write_text(plan_snippet(plan))
    script = textwrap.dedent(f"""
        import importlib.util, sys
        import ckpt_plan
        spec = importlib.util.spec_from_file_location("exported_plan", {str(tmp_path / "ckpt_plan.py")!r})
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)  # not registered in sys.modules
        assert "exported_plan" not in sys.modules
        assert loaded.PLAN == ckpt_plan.PLAN and loaded.FINGERPRINT == ckpt_plan.FINGERPRINT
        assert not [m for m in sys.modules if m.split(".")[0] in ("env", "search", "agents", "dashboard")]
        print(loaded.FINGERPRINT)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == plan.fingerprint


@pytest.mark.slow
@pytest.mark.parametrize("actions", [MIXED, GRADED], ids=["mixed", "light"])
def test_snippet_gives_the_same_gradients_and_peak_as_apply_plan(actions):
    w_plan, w_snip, w_none = (load_workload("gpt/tiny", seed=0) for _ in range(3))
    units = find_units(w_plan.model)
    plan = plan_for(w_plan.model, units, actions)
    remove = _load(plan_snippet(plan))["apply_checkpoint_plan"](w_snip.model)
    handle = apply_plan(w_plan.model, plan)
    g_none, g_plan, g_snip = _grads(w_none), _grads(w_plan), _grads(w_snip)
    for name in g_none:
        torch.testing.assert_close(g_snip[name], g_none[name], rtol=0, atol=1e-6, msg=name)
        torch.testing.assert_close(g_snip[name], g_plan[name], rtol=0, atol=0, msg=name)
    for w in (w_plan, w_snip):
        w.model.zero_grad(set_to_none=True)
    handle.remove()
    nothing = Plan(fingerprint=fingerprint(w_snip.model, []), actions={})
    peak_snip = measure(w_snip, nothing, repeats=1).peak_bytes  # snippet's wrappers stay installed
    peak_plan = measure(w_plan, plan, units, repeats=1).peak_bytes
    assert peak_snip == peak_plan
    remove()
    assert [n for n, m in w_snip.model.named_modules() if "forward" in m.__dict__] == []


def test_snippet_keeps_batchnorm_running_stats_as_without_checkpointing():
    w_snip, w_none = load_workload("cnn/tiny", seed=0), load_workload("cnn/tiny", seed=0)
    units = find_units(w_snip.model)
    _load(plan_snippet(plan_for(w_snip.model, units, ["recompute"] * len(units))))["apply_checkpoint_plan"](w_snip.model)
    _grads(w_snip), _grads(w_none)
    buffers = dict(w_none.model.named_buffers())
    assert any("running_mean" in n for n in buffers)
    for name, buf in w_snip.model.named_buffers():
        torch.testing.assert_close(buf, buffers[name], rtol=0, atol=0, msg=name)


def test_snippet_refuses_another_model():
    w, wide = load_workload("gpt/tiny"), load_workload("gpt/tiny?d_model=64")
    plan = plan_for(wide.model, find_units(wide.model), MIXED)
    apply = _load(plan_snippet(plan))["apply_checkpoint_plan"]
    with pytest.raises(ValueError, match="plan was made for another model .*export the plan for this model"):
        apply(w.model)
    assert [n for n, m in w.model.named_modules() if "forward" in m.__dict__] == []


@pytest.mark.slow
def test_snippet_wrappers_compile_into_one_graph_with_the_eager_gradients():
    """Apply the snippet's plan, then compile (fullgraph): one graph, a region per checkpointed unit,
    and (through AOTAutograd's partitioner, which recomputes the regions) the gradients of no plan."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    w_snip, w_none = load_workload("gpt/tiny", seed=0), load_workload("gpt/tiny", seed=0)
    remove = _load(plan_snippet(plan_for(w_snip.model, find_units(w_snip.model), MIXED)))["apply_checkpoint_plan"](w_snip.model)
    record = EagerAndRecordGraphs()
    torch._dynamo.reset()
    torch.compile(w_snip.model, backend=record, fullgraph=True)(*w_snip.inputs)
    regions = [n for n in record.graphs[0].graph.nodes if n.target is torch.ops.higher_order.tag_activation_checkpoint]
    assert len(record.graphs) == 1 and len(regions) == sum(a != "keep" for a in MIXED)
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        compiled = torch.compile(w_snip.model, backend="aot_eager", fullgraph=True)
        torch.manual_seed(11)
        compiled(*w_snip.inputs).backward()
    torch._dynamo.reset()
    g_snip = {n: p.grad.clone() for n, p in w_snip.model.named_parameters()}
    g_none = _grads(w_none)
    for name in g_none:
        torch.testing.assert_close(g_snip[name], g_none[name], rtol=1e-4, atol=1e-5, msg=name)
    remove()


CHAINED = ["recompute", "chain", "chain", "keep"]  # gpt/tiny's first three blocks as one region


def test_snippet_applies_chains_with_the_gradients_and_peak_of_apply_plan():
    w_plan, w_snip, w_none = (load_workload("gpt/tiny", seed=0) for _ in range(3))
    units = find_units(w_plan.model)
    plan = plan_for(w_plan.model, units, CHAINED)
    remove = _load(plan_snippet(plan))["apply_checkpoint_plan"](w_snip.model)
    assert [n for n, m in w_snip.model.named_modules() if "forward" in m.__dict__] == units[:3]
    handle = apply_plan(w_plan.model, plan)
    g_none, g_plan, g_snip = _grads(w_none), _grads(w_plan), _grads(w_snip)
    for name in g_none:
        torch.testing.assert_close(g_snip[name], g_none[name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(g_snip[name], g_plan[name], rtol=0, atol=0, msg=name)
    for w in (w_plan, w_snip):
        w.model.zero_grad(set_to_none=True)
    handle.remove()
    nothing = Plan(fingerprint=fingerprint(w_snip.model, []), actions={})
    assert measure(w_snip, nothing, repeats=1).peak_bytes == measure(w_plan, plan, units, repeats=1).peak_bytes
    remove()
    assert [n for n, m in w_snip.model.named_modules() if "forward" in m.__dict__] == []


@pytest.mark.parametrize("action", ["offload", "chunked"])
def test_snippet_refuses_what_apply_plan_refuses_in_the_same_words(action):
    """An action's preconditions live on its policy (``Policy.unmet``): on a CPU model, ``offload`` and ``chunked``
    on a block (not a loss unit) are refused by the snippet as by ``apply_actions``, before any unit is wrapped."""
    from env.data.errors import PlanError
    from env.runtime.apply import apply_actions

    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    plan = plan_for(w.model, units, ["recompute", action] + ["keep"] * (len(units) - 2))
    with pytest.raises(PlanError) as ours:
        apply_actions(w.model, plan, units)
    ns = _load(plan_snippet(plan))
    with pytest.raises(ns["PlanError"]) as snippet:
        ns["apply_checkpoint_plan"](w.model)
    assert str(snippet.value) == str(ours.value)
    assert str(ours.value).startswith(f"action '{action}' (unit '{units[1]}') needs a ")
    assert [n for n, m in w.model.named_modules() if "forward" in m.__dict__] == []


def test_snippet_refuses_a_chain_over_units_that_do_not_chain():
    w = load_workload("gpt/tiny")
    units = find_units(w.model, "sub-block")
    plan = plan_for(w.model, units, ["recompute", "chain", "chain"] + ["keep"] * (len(units) - 3))
    ns = _load(plan_snippet(plan))
    remove = ns["apply_checkpoint_plan"](w.model)
    with pytest.raises(ns["PlanError"], match="units 'blocks.0.attn' and 'blocks.0.ln_2' do not chain"):
        w.loss()
    assert issubclass(ns["PlanError"], ValueError)
    remove()


@pytest.mark.slow
def test_snippet_and_apply_plan_compile_each_unit_with_the_eager_gradients():
    """``compile_units=True`` (how a plan searched with --compile is applied): every unit runs compiled, the
    chain region's and the recomputed units' gradients are those of no plan, and remove() leaves nothing."""
    w_plan, w_snip, w_none = (load_workload("gpt/tiny", seed=0) for _ in range(3))
    units = find_units(w_plan.model)
    plan = plan_for(w_plan.model, units, ["recompute", "chain", "selective", "keep"])
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        remove = _load(plan_snippet(plan))["apply_checkpoint_plan"](w_snip.model, compile_units=True)
        handle = apply_plan(w_plan.model, plan, compile_units=True)
        assert [n for n, m in w_snip.model.named_modules() if "forward" in m.__dict__] == units
        graphs = counters["stats"]["unique_graphs"]
        g_none, g_plan, g_snip = _grads(w_none), _grads(w_plan), _grads(w_snip)
        assert counters["stats"]["unique_graphs"] - graphs >= 2  # the blocks' forward, selective's checkpoint
    torch._dynamo.reset()
    for name in g_none:
        torch.testing.assert_close(g_snip[name], g_none[name], rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(g_plan[name], g_none[name], rtol=1e-4, atol=1e-5, msg=name)
    handle.remove()
    remove()
    for w in (w_plan, w_snip):
        assert [n for n, m in w.model.named_modules() if "forward" in m.__dict__] == []


def test_snippet_applies_blocks_with_the_gradients_of_apply_plan_and_refuses_half_a_block():
    """'block' recomputes the units' parent: the snippet wraps the parents, as ``apply_plan`` does, with the
    gradients of no plan (dropout on), and refuses a parent only partly 'block' in apply_plan's words."""
    from env.data.errors import PlanError

    w_plan, w_snip, w_none = (load_workload("gpt/tiny", seed=0) for _ in range(3))
    units = find_units(w_plan.model, "sub-block")
    plan = plan_for(w_plan.model, units, ["block"] * 8 + ["recompute"] + ["keep"] * 7)
    remove = _load(plan_snippet(plan))["apply_checkpoint_plan"](w_snip.model)
    assert [n for n, m in w_snip.model.named_modules() if "forward" in m.__dict__] == ["blocks.0", "blocks.1",
                                                                                       "blocks.2.ln_1"]
    handle = apply_plan(w_plan.model, plan)
    g_none, g_plan, g_snip = _grads(w_none), _grads(w_plan), _grads(w_snip)
    for name in g_none:
        torch.testing.assert_close(g_snip[name], g_none[name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(g_snip[name], g_plan[name], rtol=0, atol=0, msg=name)
    handle.remove()
    remove()
    half = plan_for(w_none.model, units, ["block"] * 3 + ["keep"] * 13)
    with pytest.raises(PlanError) as ours:
        apply_plan(w_none.model, half)
    ns = _load(plan_snippet(half))
    with pytest.raises(ns["PlanError"]) as snippet:
        ns["apply_checkpoint_plan"](w_none.model)
    assert str(snippet.value) == str(ours.value)

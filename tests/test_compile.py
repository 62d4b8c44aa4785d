"""Plans under torch.compile: one graph, the eager gradients and buffers; compiled measurement.

Compiling is slow on these CPUs, so the compiling tests are ``slow`` and use ``gpt/tiny`` and a
2-layer Llama. Dynamo alone (``backend="eager"``) checks for graph breaks; ``aot_eager`` adds
AOTAutograd and the partitioner, which is where a checkpointed region is recomputed; inductor
runs the whole stack. Inductor draws random numbers its own way, so the tests that compare a
compiled step with an eager one set ``fallback_random`` (dropout then draws as eager does).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn as nn
from torch._dynamo.testing import EagerAndRecordGraphs
from torch._dynamo.utils import counters

from env.data.errors import MeasurementError, PlanError
from env.data.measured import MeasuredPlan as Measurement
from env.data.plan import Plan, fingerprint
from env.measure.compiled import CompileOptions, unit_compiler
from env.measure.measurement import measure
from env.measure.peers import compile_budget_peer, measure_peer
from env.runtime.apply import apply_actions, plan_for
from env.units.find import find_units
from env.workloads.workload import Workload, load_workload
from search.training.integrations import hf_available, hf_units
from tests.test_workloads import one_line_error

LLAMA = "env.workloads.zoo:hf_llama"
MIXED = ["keep", "recompute", "selective", "recompute"]  # every CPU action, on gpt/tiny's 4 blocks
SEED = 7
needs_hf = pytest.mark.skipif(not hf_available(), reason="transformers is not installed")


def _units(w: Workload) -> list[str]:
    return hf_units(w.model) if w.spec.startswith("search.training.integrations") else find_units(w.model)


def _actions(units: list[str]) -> list[str]:
    return MIXED if len(units) == 4 else ["recompute", "selective"] * (len(units) // 2)


def _step(w: Workload, model: nn.Module, initial: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict]:
    """One forward/backward of ``model`` (the workload's model, maybe compiled) from ``initial``."""
    w.model.load_state_dict(initial)
    w.model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)
    loss = dataclasses.replace(w, model=model).loss()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in w.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, copy.deepcopy(w.model.state_dict())


def _recorded(w: Workload, units: list[str], actions: list[str]) -> tuple[int, int]:
    """(graphs, checkpoint regions) dynamo records for one planned step compiled with fullgraph=True."""
    backend = EagerAndRecordGraphs()
    torch._dynamo.reset()
    with apply_actions(w.model, plan_for(w.model, units, actions), units):
        dataclasses.replace(w, model=torch.compile(w.model, backend=backend, fullgraph=True)).loss().backward()
    torch._dynamo.reset()
    tag = torch.ops.higher_order.tag_activation_checkpoint
    return len(backend.graphs), sum(n.target is tag for g in backend.graphs for n in g.graph.nodes)


def _compiled_step(w: Workload, units: list[str], actions: list[str], backend: str,
                   initial: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict]:
    """``_step`` with the plan applied and the model compiled (fullgraph) from a fresh dynamo state."""
    torch._dynamo.reset()
    with apply_actions(w.model, plan_for(w.model, units, actions), units):
        out = _step(w, torch.compile(w.model, backend=backend, fullgraph=True), initial)
    torch._dynamo.reset()
    return out


def _assert_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == ref.keys() and ref
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-4, atol=1e-5, msg=f"{what}: {name}")


@pytest.fixture
def eager_random():
    """Inductor draws dropout masks as eager does, so a compiled step can be compared with an eager one."""
    with torch._inductor.config.patch(fallback_random=True):
        yield


def _needs(spec: str) -> None:
    if spec == LLAMA and not hf_available():
        pytest.skip("transformers is not installed")


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["gpt/tiny", LLAMA])
def test_every_action_traces_into_one_graph_with_a_region_per_checkpointed_unit(spec: str) -> None:
    _needs(spec)
    w = load_workload(spec)
    units = _units(w)
    actions = _actions(units)
    assert _recorded(w, units, actions) == (1, sum(a != "keep" for a in actions))


@pytest.mark.slow
@pytest.mark.parametrize("spec, backend", [("gpt/tiny", "inductor"), (LLAMA, "aot_eager")])
def test_a_compiled_plan_gives_the_eager_gradients_with_dropout_on(spec: str, backend: str, eager_random) -> None:
    _needs(spec)
    w = load_workload(spec)
    units = _units(w)
    initial = copy.deepcopy(w.model.state_dict())
    ref_loss, ref_grads, _ = _step(w, w.model, initial)
    torch.manual_seed(SEED + 1)
    with torch.no_grad():
        assert not torch.equal(w.loss(), ref_loss)  # dropout is on: the seed is what makes the steps equal
    loss, grads, _ = _compiled_step(w, units, _actions(units), backend, initial)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    _assert_close(grads, ref_grads, f"{spec} compiled with {backend}")


@pytest.mark.slow
def test_a_compiled_recompute_updates_batchnorm_buffers_once() -> None:
    w = load_workload("cnn/tiny")
    units = find_units(w.model)
    initial = copy.deepcopy(w.model.state_dict())
    _, _, ref_state = _step(w, w.model, initial)
    _, _, state = _compiled_step(w, units, ["recompute"] * len(units), "aot_eager", initial)
    tracked = [k for k in state if k.endswith("num_batches_tracked")]
    assert tracked and all(int(state[k]) == int(initial[k]) + 1 for k in tracked)
    for key in state:
        torch.testing.assert_close(state[key], ref_state[key], rtol=1e-5, atol=1e-6, msg=key)


def _plan(w: Workload, actions: list[str]) -> tuple[Plan, list[str]]:
    units = find_units(w.model)
    return plan_for(w.model, units, actions), units


@pytest.mark.slow
def test_compiled_measurement_reads_the_compiled_peak_and_reports_compile_time() -> None:
    w = load_workload("gpt/tiny")
    plan, units = _plan(w, MIXED)
    eager = measure(w, plan, units, repeats=1)
    first = measure(w, plan, units, repeats=2, compile=True)
    again = measure(w, plan, units, repeats=2, compile=True)  # a fresh compile (dynamo reset), same graph
    keep = measure(w, _plan(w, ["keep"] * 4)[0], units, repeats=1, compile=True)
    for m in (first, again):
        assert m.compile_seconds is not None and m.compile_seconds > 0
        assert m.recompiles == 0 and m.graph_breaks == 0
        assert m.live_before_bytes == eager.live_before_bytes and len(m.step_seconds_samples) == 2
    assert eager.compile_seconds is None and eager.recompiles is None
    assert first.peak_bytes == again.peak_bytes  # exact and repeatable, as eager
    assert first.live_before_bytes < first.peak_bytes < keep.peak_bytes  # the plan's recompute shows compiled too
    assert not any("forward" in m.__dict__ for m in w.model.modules())  # the plan is removed


class _Breaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(y).mean()


class _Restless(nn.Module):
    """Its forward reads a string that changes every call: a guard that fails every step."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        tag = "step" + str(self.calls)
        return self.a(x).mean() * (2.0 if tag.endswith("1") else 1.0)


def _bare(w: Workload) -> Plan:
    return Plan(fingerprint=fingerprint(w.model, []), actions={})


@pytest.mark.slow
def test_a_model_that_breaks_the_graph_is_compiled_with_breaks_and_counted() -> None:
    w = Workload("breaks", _Breaks(), (torch.randn(4, 8),))
    m = measure(w, _bare(w), repeats=1, compile=CompileOptions(backend="eager"))
    assert m.graph_breaks is not None and m.graph_breaks >= 1 and m.recompiles == 0
    assert m.peak_bytes > m.live_before_bytes


@pytest.mark.slow
def test_recompiling_every_step_is_refused_on_one_line() -> None:
    w = Workload("restless", _Restless(), (torch.randn(4, 8),))
    with pytest.raises(MeasurementError) as e:
        measure(w, _bare(w), repeats=1, compile=CompileOptions(backend="eager", max_compile_steps=2))
    one_line_error(e, "restless", "compiled new graphs in each of", "max_compile_steps")


def _failing_backend(gm: torch.fx.GraphModule, example_inputs: list) -> None:
    raise RuntimeError("cannot determine truth value of Relational: 128*s20*s33 < 16")  # as inductor did on a UNet


def test_a_compiler_failure_is_one_line_that_says_what_to_do() -> None:
    w = Workload("breaks", _Breaks(), (torch.randn(4, 8),))
    torch._dynamo.register_backend(_failing_backend, name="ckpt_test_failing")
    with pytest.raises(MeasurementError) as e:
        measure(w, _bare(w), repeats=1, compile=CompileOptions(backend="ckpt_test_failing"))
    one_line_error(e, "'breaks' failed to compile", "ckpt_test_failing", "Relational", "measure it eagerly")


def test_compiled_and_eager_records_do_not_merge() -> None:
    record = dict(workload="w", batch_shape="b", digest="d", actions=["keep"], peak_bytes=10, live_before_bytes=4,
                  step_seconds_samples=[0.1], device="cpu", torch_version="x", clock="wall")
    compiled, eager = Measurement(**record, compile_seconds=3.0, recompiles=0, graph_breaks=0), Measurement(**record)
    assert compiled.merged(compiled).step_seconds_samples == [0.1, 0.1]
    with pytest.raises(MeasurementError) as e:
        compiled.merged(eager)
    one_line_error(e, "compiled and an eager")
    assert Measurement.model_validate_json(compiled.model_dump_json()) == compiled


def test_a_budget_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(MeasurementError) as e:
        CompileOptions(activation_memory_budget=1.5)
    one_line_error(e, "activation_memory_budget=1.5", "between 0.0 and 1.0")


@pytest.mark.slow
def test_a_chain_region_is_one_checkpoint_in_one_graph_with_the_eager_gradients(eager_random) -> None:
    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    actions = ["recompute", "chain", "chain", "keep"]  # blocks 0..2 as one region
    assert _recorded(w, units, actions) == (1, 1)
    initial = copy.deepcopy(w.model.state_dict())
    ref_loss, ref_grads, _ = _step(w, w.model, initial)
    for backend_name in ("aot_eager", "inductor"):
        loss, grads, _ = _compiled_step(w, units, actions, backend_name, initial)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        _assert_close(grads, ref_grads, f"chained, compiled with {backend_name}")


@pytest.mark.slow
def test_a_compiled_chain_over_units_that_do_not_chain_is_refused() -> None:
    """With fullgraph=True dynamo reports the refusal's message; without, the frame runs eagerly and refuses."""
    w = load_workload("gpt/tiny")
    units = find_units(w.model, "sub-block")
    actions = ["recompute", "chain", "chain"] + ["keep"] * (len(units) - 3)
    for fullgraph, error in ((True, torch._dynamo.exc.Unsupported), (False, PlanError)):
        torch._dynamo.reset()
        with apply_actions(w.model, plan_for(w.model, units, actions), units), pytest.raises(error) as e:
            dataclasses.replace(w, model=torch.compile(w.model, backend="eager", fullgraph=fullgraph)).loss()
        torch._dynamo.reset()
        assert "units 'blocks.0.attn' and 'blocks.0.ln_2' do not chain" in str(e.value)


# -- regional compilation (CompileOptions.scope="units") ------------------------------------------------------------

def _units_step(w: Workload, units: list[str], actions: list[str], backend: str,
                initial: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict]:
    """``_step`` with the plan applied to units compiled one by one (``compile_unit``), the rest eager."""
    torch._dynamo.reset()
    compile_unit = unit_compiler(CompileOptions(scope="units", backend=backend))
    with apply_actions(w.model, plan_for(w.model, units, actions), units, compile_unit=compile_unit):
        out = _step(w, w.model, initial)
    torch._dynamo.reset()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("actions", [MIXED, ["recompute", "chain", "chain", "selective"], ["light", "keep", "light", "selective"]],
                         ids=["keep-recompute-selective", "chain", "light"])
def test_a_plan_on_units_compiled_one_by_one_gives_the_eager_gradients_with_dropout_on(actions: list[str],
                                                                                       eager_random) -> None:
    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    initial = copy.deepcopy(w.model.state_dict())
    ref_loss, ref_grads, _ = _step(w, w.model, initial)
    torch.manual_seed(SEED + 1)
    with torch.no_grad():
        assert not torch.equal(w.loss(), ref_loss)  # dropout is on: the seed is what makes the steps equal
    loss, grads, _ = _units_step(w, units, actions, "inductor", initial)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    _assert_close(grads, ref_grads, f"{actions} on units compiled with inductor")
    assert not any("forward" in m.__dict__ for m in w.model.modules())  # the plan and the compiled units are gone


@pytest.mark.slow
def test_a_recomputed_conv_unit_compiled_alone_keeps_no_copy_of_its_input() -> None:
    """Inductor's layout optimization copies a convolution's input into channels-last order, and a recomputed
    unit compiled with it saved that copy beside its input (``RECOMPUTED_UNIT_OPTIONS``): on cnn/tiny every unit
    recomputed then peaked 21 KB above eager, and checkpoint_sequential (eager) got lower than any compiled plan."""
    w = load_workload("cnn/tiny")
    units = find_units(w.model)
    plan = plan_for(w.model, units, ["recompute"] * len(units))
    eager = measure(w, plan, units, repeats=1)
    compiled = measure(w, plan, units, repeats=1, compile=CompileOptions(scope="units"))
    assert compiled.peak_bytes <= eager.peak_bytes, (compiled.peak_bytes, eager.peak_bytes)


@pytest.mark.slow
def test_units_scope_compiles_each_variant_once_and_every_later_plan_reuses_it() -> None:
    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    options = CompileOptions(scope="units", backend="aot_eager")
    torch._dynamo.reset()

    def run(actions: list[str]) -> Measurement:
        return measure(w, plan_for(w.model, units, actions), units, repeats=1, compile=options)

    keep = run(["keep"] * 4)
    assert keep.compile_seconds is not None and keep.graph_breaks == 0 and keep.recompiles == 0
    graphs = counters["stats"]["unique_graphs"]
    chained = run(["recompute", "chain", "chain", "keep"])  # a region checkpoints the compiled forwards: none new
    assert counters["stats"]["unique_graphs"] == graphs
    recompute = run(["recompute"] * 4)  # compiled with its checkpoint: one variant for the four blocks
    selective = run(["selective", "keep", "selective", "keep"])
    assert counters["stats"]["unique_graphs"] - graphs == 2
    graphs = counters["stats"]["unique_graphs"]
    mixed = run(MIXED)  # every variant seen: compiles nothing
    assert counters["stats"]["unique_graphs"] == graphs and mixed.recompiles == 0
    assert recompute.peak_bytes < mixed.peak_bytes < keep.peak_bytes
    assert recompute.peak_bytes < chained.peak_bytes < keep.peak_bytes
    assert selective.peak_bytes < keep.peak_bytes
    assert not any("forward" in m.__dict__ for m in w.model.modules())
    torch._dynamo.reset()


def test_a_peer_is_compiled_whole_whatever_the_scope_of_the_plans() -> None:
    w = Workload("breaks", _Breaks(), (torch.randn(4, 8),))
    peer = compile_budget_peer(0.5)
    m = measure_peer(w, peer, repeats=1, compile=CompileOptions(scope="units", backend="eager"))
    assert m.graph_breaks is not None and m.graph_breaks >= 1  # the model was compiled: it broke the graph


def test_an_unknown_compile_scope_is_refused() -> None:
    with pytest.raises(MeasurementError) as e:
        CompileOptions(scope="layers")
    one_line_error(e, "compile scope 'layers'", "'units'")


@pytest.mark.slow
def test_compile_scope_both_measures_frontier_and_rules_whole_model_and_shows_the_faster_way(tmp_path,
                                                                                           ray_session) -> None:
    import json

    from search.export import export
    from search.records import meta
    from search.records.pareto import nondominated
    from search.records.store import RunStore
    from search.run import main

    assert main(["--workload", "gpt/tiny", "--compile", "--compile-scope", "both", "--agents", "1",
                 "--timesteps", "128", "--chunk-timesteps", "128", "--max-measurements", "8", "--repeats", "1",
                 "--peers", "none",  # each peer would compile too; the peers' compiled runs: tests/test_peers.py
                 "--no-progress", "--no-batch-scaling", "--out", str(tmp_path), "--name", "both"]) == 0
    run_dir = tmp_path / "both"
    front = json.loads((run_dir / "frontier.json").read_text())
    with RunStore(run_dir, readonly=True) as s:
        whole, plans = s.read(meta.WHOLE_MODEL), {m.digest: m for m in s.measured()}
        assert "whole-model pass" in s.read(meta.PHASE_SECONDS)
        rules = set(s.read(meta.RULES).values()) | (set(s.read(meta.EXACT)) & set(plans))
        rank = s.ranking()
    assert whole and set(whole) <= set(plans)  # plans the search measured, measured again whole
    assert rules <= set(whole)  # the rules and exact plans among them: compiled whole, the plans' order changes
    for m in whole.values():  # each compiled on its own, apart from the plan's regional record
        assert m.compile_seconds is not None and m.measurement_ids[0] not in plans[m.digest].measurement_ids
    scopes = [p["compile_scope"] for p in front["points"]]
    assert scopes and set(scopes) <= {"units", "model"}
    # one frontier over both ways: no point shown is dominated by another, whichever way either was compiled
    assert nondominated([(p["peak_bytes"], p["step_seconds"]) for p in front["points"]]).all()
    for p in front["points"]:  # a point shows the measurement of the way it names
        plan = Plan(fingerprint=front["fingerprint"], actions=p["plan"])
        record = whole[plan.digest] if p["compile_scope"] == "model" else plans[plan.digest]
        assert p["peak_bytes"] == record.peak_bytes
        if p["compile_scope"] == "model":  # its own time as ranked, not held to the regional baseline's
            assert p["step_seconds"] == pytest.approx(rank(record, floor=False).step_seconds)
    report = (run_dir / "report.md").read_text()
    assert ("| compiled |" in report) == (len(set(scopes)) > 1)
    if "model" in scopes:  # exported with how to compile it; apply_plan reads the plan as ever
        model_point = max((p for p in front["points"] if p["compile_scope"] == "model"), key=lambda p: p["peak_bytes"])
        done = export(run_dir, model_point["peak_bytes"] / 2**20 + 1e-6)
        data = json.loads(done.text)
        if done.point.compile_scope == "model":
            assert data["compile_scope"] == "model" and "torch.compile(model)" in data["apply"]
        assert Plan.from_json(done.text).actions == done.plan.actions
    # plans/, one per agent budget, says as the export does how each was compiled when it was measured
    files = list((run_dir / "plans").glob("budget_*MB.json"))
    assert files
    by_plan = {Plan(fingerprint=front["fingerprint"], actions=p["plan"]).digest: p for p in front["points"]}
    for f in files:
        data, plan = json.loads(f.read_text()), Plan.load(f)
        assert data["compile_scope"] == by_plan[plan.digest]["compile_scope"] and data["apply"]

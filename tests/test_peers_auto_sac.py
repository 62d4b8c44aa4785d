"""PyTorch's auto-SAC as a peer (``env.measure.auto_sac``): its decisions, the gradients it keeps, the memory it saves.

The gradients are checked with dropout on (``gpt/tiny``): one step with the peer against one without from the
same RNG state. A plan that checkpoints nothing would pass that, so each budget tested is checked to pick modules.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from env.data.errors import PlanError, WorkloadError
from env.data.plan import Action
from env.measure.measurement import measure
from env.measure.peers import GRADIENT_TOLERANCE, PeerKind, gradient_error, measure_peer, peers_for, torch_auto_sac_peer
from env.runtime.apply import plan_for
from env.units.find import find_units
from env.workloads.workload import Workload, load_workload
from tests.test_workloads import one_line_error

ROOT = Path(__file__).resolve().parents[1]


def _missing() -> str | None:
    from env.measure.auto_sac import missing

    return missing()


needs_pulp = pytest.mark.skipif(_missing() is not None, reason="PuLP or pwlf is not installed (the autosac extra)")


@pytest.fixture(scope="module")
def tiny():
    return load_workload("gpt/tiny")  # dropout 0.1


@needs_pulp
def test_auto_sac_decides_more_the_lower_its_budget(tiny) -> None:
    """Budget 0.0 is the lowest peak its ILP meets, 1.0 its estimate of the unplanned one (nothing decided); in
    between its estimated peak stays within the GiB it was given and falls with the budget."""
    from env.measure.auto_sac import solve

    plans = [solve(tiny, b) for b in (0.0, 0.5, 1.0)]
    low, mid, full = plans
    assert full.discard == {} and full.saves == {} and full.estimated_recompute_seconds == 0.0
    assert full.estimated_peak_bytes == full.unplanned_peak_bytes
    assert low.estimated_peak_bytes < mid.estimated_peak_bytes < full.estimated_peak_bytes
    assert low.estimated_recompute_seconds > mid.estimated_recompute_seconds > 0.0
    for p in plans:
        assert p.estimated_peak_bytes <= p.memory_budget_bytes
        assert all(0.0 < r <= 1.0 for r in p.discard.values())
        for fqn, saves in p.saves.items():  # a module of the model, each of its ops saved or recomputed
            tiny.model.get_submodule(fqn)
            assert set(saves) <= {0, 1}
    assert low.discard.keys() and all("blocks." in f for f in low.discard)
    assert "CPU" in low.estimated_on


@needs_pulp
@pytest.mark.parametrize("budget", [0.0, 0.5])
def test_auto_sac_keeps_the_gradients_with_dropout_on(tiny, budget: float) -> None:
    from env.measure.auto_sac import solve

    assert tiny.model.blocks[0].mlp.dropout.p > 0  # dropout on, so a mask drawn again would show
    initial = copy.deepcopy(tiny.model.state_dict())
    assert solve(tiny, budget).saves  # it checkpoints something
    assert gradient_error(tiny, torch_auto_sac_peer(budget)) < 1e-6
    assert not any("forward" in m.__dict__ for m in tiny.model.modules())  # undone
    assert all(p.grad is None for p in tiny.model.parameters())
    for name, t in tiny.model.state_dict().items():
        torch.testing.assert_close(t, initial[name], rtol=0, atol=0, msg=name)


@needs_pulp
def test_auto_sac_under_a_budget_peaks_below_the_unplanned_step(tiny) -> None:
    """Measured (CPU peaks are exact): auto-SAC at its lowest budget below the unplanned step, and at 1.0, where it
    decides nothing, the unplanned step itself."""
    units = find_units(tiny.model)
    unplanned = measure(tiny, plan_for(tiny.model, units, [Action.KEEP] * len(units)), units, repeats=1)
    low = measure_peer(tiny, torch_auto_sac_peer(0.0), repeats=1)
    full = measure_peer(tiny, torch_auto_sac_peer(1.0), repeats=1)
    assert low.digest == "peer:auto-sac-0.0"
    assert low.peak_bytes < unplanned.peak_bytes == full.peak_bytes


@needs_pulp
def test_auto_sac_is_offered_at_each_budget_where_the_model_has_blocks(tiny) -> None:
    peers = [p for p in peers_for(tiny, budgets=(0.0, 0.5)) if p.kind is PeerKind.TORCH_AUTO_SAC]
    assert [p.name for p in peers] == ["auto-sac-0.0", "auto-sac-0.5"]
    assert all("op times measured on this CPU" in p.note for p in peers)  # what replaced torch's CUDA estimates
    assert peers[1].label == "PyTorch's auto-SAC (sac_milp), budget 0.5"
    # compiled, a step traces other ops than the eager ones its per-op decisions name: not offered
    assert not [p for p in peers_for(tiny, budgets=(0.5,), compiled=True) if p.kind is PeerKind.TORCH_AUTO_SAC]
    one_layer = Workload("linear", torch.nn.Linear(4, 1), (torch.randn(2, 4),), loss_fn=lambda m, x: m(*x).sum())
    assert [p.kind for p in peers_for(one_layer, budgets=(0.5,))] == [PeerKind.COMPILE_BUDGET]  # no blocks


def test_the_torchtitan_op_policy_keeps_the_gradients_with_dropout_on(tiny) -> None:
    from env.measure.peers import torchtitan_op_sac_peer

    assert gradient_error(tiny, torchtitan_op_sac_peer("blocks")) < min(1e-6, GRADIENT_TOLERANCE)


def test_a_budget_outside_zero_to_one_is_refused_in_one_line(tiny) -> None:
    from env.measure.auto_sac import solve

    with pytest.raises(WorkloadError) as e:
        solve(tiny, 1.5)
    one_line_error(e, "budget=1.5", "between 0.0", "1.0")


@needs_pulp
def test_a_budget_where_auto_sac_has_no_policy_is_offered_unmeasured_with_why() -> None:
    """On cnn/tiny, torch's per-module ILP for the first conv block has no solution at discard ratio 1.0 (its
    in-place ReLU must be saved with its parent, and the module may save nothing), where
    ``get_optimal_checkpointing_policy_per_module`` returns no decisions: one line. A peer that carries that line is
    offered as it is, and ``measurable`` leaves it out with it, so that a search goes on without it (a search once
    ended there, installing it). Which budgets meet that ratio moves with the op times the ILP is given."""
    from env.measure import auto_sac
    from env.measure.peers import decided, measurable

    cnn = load_workload("cnn/tiny")
    a = auto_sac._analysis(cnn)
    first = next(f for f in a.sac_stats if f.endswith(".features.0"))
    assert len(auto_sac.per_op(a.sac_stats[first], 0.0, "features.0", 1.0, "cnn/tiny")) == len(
        a.sac_stats[first].func_names)  # nothing discarded: a decision per op
    with pytest.raises(auto_sac.NoAutoSacPlan) as e:
        auto_sac.per_op(a.sac_stats[first], 1.0, "features.0", 0.0, "cnn/tiny")
    one_line_error(e, "no per-op policy for 'features.0'", "discard ratio 1.00", "pick another budget")
    none = torch_auto_sac_peer(0.0).model_copy(update={"params": {"budget": 0.0, "no_plan": str(e.value)}})
    some = decided(cnn, torch_auto_sac_peer(1.0))
    assert decided(cnn, none) is none and "decided" in some.params  # not solved again
    kept, lines = measurable([none, some])
    assert kept == [some] and lines == [f"peer auto-sac-0.0 not measured: {e.value}"]


@needs_pulp
def test_a_model_torchs_estimators_fail_on_has_no_auto_sac_peer_and_says_why_in_one_line() -> None:
    """On transformers' Llama torch's ``aggregate_stats`` looks up a pre-backward snapshot ``MemTracker`` never took
    (KeyError): every auto-SAC peer there is offered with that line and not measured, and the estimators run once."""
    pytest.importorskip("transformers")
    from env.measure import auto_sac
    from env.measure.peers import decided, measurable

    llama = load_workload("hf/llama?n_layer=1")
    peers = [decided(llama, torch_auto_sac_peer(b)) for b in (0.0, 0.5)]
    kept, lines = measurable(peers)
    assert kept == [] and len(lines) == 2
    for line in lines:
        assert "torch's auto-SAC cannot analyse workload 'hf/llama?n_layer=1'" in line and "KeyError" in line
        assert "aggregate_stats" in line and "\n" not in line
    assert isinstance(next(iter(auto_sac._ANALYSES[llama.model].values())), auto_sac.NoAutoSacPlan)  # kept, once


def test_a_policy_refuses_an_op_its_estimator_did_not_see() -> None:
    """The decisions are per op in the estimator's order: an op that is not the one seen there is refused."""
    from torch.utils.checkpoint import checkpoint

    from env.measure.auto_sac import op_policy

    x = torch.randn(4, 4, requires_grad=True)
    context_fn = op_policy("blocks.0", ["mm"], (1,))
    with pytest.raises(PlanError) as e:
        checkpoint(lambda t: t.sin(), x, use_reentrant=False, context_fn=context_fn)
    one_line_error(e, "blocks.0", "aten.sin", "mm", "solve again")
    with pytest.raises(PlanError) as e:
        op_policy("blocks.0", ["mm", "sin"], (1,))
    one_line_error(e, "blocks.0", "1 decisions for 2 ops")


def test_without_pulp_auto_sac_is_skipped_in_one_line() -> None:
    """A process where ``pulp`` cannot be imported: the kind is not offered, with a one-line warning that says how
    to install it, and a peer asked for by name is refused in one line."""
    code = (
        "import sys, warnings; sys.modules['pulp'] = None\n"
        "from env.workloads.workload import Workload, load_workload\n"
        "from env.measure.peers import peers_for, prepared, torch_auto_sac_peer\n"
        "w = load_workload('gpt/tiny')\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    kinds = {p.kind.value for p in peers_for(w, budgets=(0.5,))}\n"
        "print('KINDS', sorted(kinds))\n"
        "print('WARN', '|'.join(str(s.message) for s in seen))\n"
        "try:\n"
        "    with prepared(w, torch_auto_sac_peer(0.5)):\n"
        "        pass\n"
        "except Exception as e:\n"
        "    print('ERR', type(e).__name__, str(e))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines() if " " in line}
    assert "torch_auto_sac" not in lines["KINDS"] and "torchtitan_op_sac" in lines["KINDS"]
    warning = lines["WARN"]
    assert "\n" not in warning and "pulp is not installed" in warning and "pip install -e '.[autosac]'" in warning
    assert lines["ERR"].startswith("WorkloadError peer 'auto-sac-0.5': PyTorch's auto-SAC is skipped: pulp")


@needs_pulp
def test_decisions_made_once_are_what_another_process_installs_and_measures(tiny) -> None:
    """auto-SAC decides from op times measured as it runs, so its plan could move between processes: the peer
    carries its decisions (``decided``), a process that never solved installs exactly them (its peak is the
    deciding process's, to the byte), keeps the gradients, and decisions for another model are one line."""
    from env.measure.auto_sac import AutoSacPlan, installed
    from env.measure.peers import decided

    peer = decided(tiny, torch_auto_sac_peer(0.0))
    plan = AutoSacPlan.from_json(str(peer.params["decided"]))
    assert plan.saves and plan == AutoSacPlan.from_json(plan.to_json()) and peer.name == "auto-sac-0.0"
    assert decided(tiny, peer) is peer  # decided once
    here = measure_peer(tiny, peer, repeats=1)
    code = ("import json, sys\nfrom env.measure.peers import Peer, measure_peer, gradient_error\n"
            "from env.measure import auto_sac\nfrom env.workloads.workload import load_workload\n"
            "w = load_workload('gpt/tiny')\npeer = Peer.model_validate_json(sys.stdin.read())\n"
            "m = measure_peer(w, peer, repeats=1)\n"
            "print(json.dumps({'peak': m.peak_bytes, 'solved': len(auto_sac._ANALYSES),"
            " 'error': gradient_error(w, peer)}))\n")
    done = subprocess.run([sys.executable, "-c", code], input=peer.model_dump_json(), capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    there = json.loads(done.stdout.strip().splitlines()[-1])
    assert there["solved"] == 0 and there["peak"] == here.peak_bytes and there["error"] < 1e-6
    other = load_workload("gpt/tiny?n_layer=1")
    with pytest.raises(PlanError) as e, installed(other, plan):
        pass
    one_line_error(e, "modules this model lacks", "solve again")


@needs_pulp
def test_the_report_shows_auto_sacs_estimates_beside_what_was_measured(tiny) -> None:
    """The search's report (not only the bench) puts auto-SAC's own estimates beside its measurement."""
    from env.measure.peers import decided
    from search.engine.report import estimates_markdown
    from search.records.peer_verdicts import PeerEstimate, peer_verdicts

    peer = decided(tiny, torch_auto_sac_peer(0.0))
    estimate = PeerEstimate.from_params(peer.params)
    assert estimate is not None and 0 < estimate.saving < 1 and PeerEstimate.from_params({"budget": 0.5}) is None
    base, m = measure(tiny, plan_for(tiny.model, ["blocks.0"], ["keep"]), repeats=1), measure_peer(tiny, peer, repeats=1)
    rows = [v.model_dump(mode="json") for v in peer_verdicts({peer.name: m}, [base], {}, estimates={peer.name: estimate})]
    lines = estimates_markdown(rows, {"peak_bytes": base.peak_bytes, "step_seconds": base.step_seconds})
    row = next(line for line in lines if line.startswith("| auto-sac-0.0 |"))
    assert f"| {estimate.saving:.0%} | {1 - m.peak_bytes / base.peak_bytes:.0%} |" in row
    assert "op times measured" in " ".join(lines) or "CPU" in " ".join(lines)
    assert estimates_markdown([r | {"estimate": None} for r in rows], {"peak_bytes": 1, "step_seconds": 1}) == []

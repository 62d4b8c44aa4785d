"""The loss as a decision unit: ``LMLoss`` chunked gives the unchunked loss and gradients, every plan
(``chunked`` included) at every precision gives the unplanned step's, and the profile, the cost
model, the exact solver and the env offer ``chunked`` on the loss unit alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from agents.baselines import baseline_rules
from agents.exact import exact_frontier
from env.cost.cost_model import CostModel
from env.data.errors import PlanError
from env.data.plan import Action, Plan
from env.gym.checkpoint_env import CheckpointEnv
from env.measure.profiler import profile
from env.runtime.apply import apply_actions, plan_for
from env.units.choice import resolve_units
from env.workloads.lm_loss import LMLoss
from env.workloads.workload import load_workload

TINY = "gpt/tiny?dropout=0.1"  # dropout on: a plan that replays another mask changes the gradients
# Tolerances against the unplanned step, per precision. 32: keep/recompute/selective replay the same ops and
# are exact; chunked sums the token losses and the head's weight gradient chunk by chunk, another float order
# (float32 epsilon ~1e-7, a few hundred terms). bf16: the same reordering in 8-bit mantissas (epsilon 2**-8),
# relative to the largest gradient entry.
TOLERANCE = {"32": 1e-5, "bf16-mixed": 2e-2, "bf16-true": 3e-2}


def _step(workload, units: list[str], actions: list[Action]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients of one step under the plan, from the same weights and RNG state."""
    torch.manual_seed(0)
    with apply_actions(workload.model, plan_for(workload.model, units, actions), units):
        loss = workload.loss()
        workload.backward(loss)
    grads = {n: p.grad.float().clone() for n, p in workload.model.named_parameters()}
    workload.model.zero_grad(set_to_none=True)
    return loss.detach().float(), grads


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return bool((a - b).abs().max() <= tol * max(1e-6, b.abs().max().item()))


def test_chunked_loss_is_the_unchunked_loss_with_its_gradients():
    torch.manual_seed(0)
    loss = LMLoss(head=nn.Linear(16, 50, bias=False), norm=nn.LayerNorm(16))
    hidden = torch.randn(3, 10, 16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 10))
    targets[0, :4] = -100  # ignored tokens count for nothing, in both
    full = loss(hidden, targets)
    g_full = torch.autograd.grad(full, [hidden, *loss.parameters()])
    chunked = loss.chunked(hidden, targets, chunks=4)
    g_chunked = torch.autograd.grad(chunked, [hidden, *loss.parameters()])
    ref = nn.functional.cross_entropy(loss.head(loss.norm(hidden)).flatten(0, 1), targets.flatten())
    assert torch.allclose(full, ref, rtol=1e-6) and torch.allclose(chunked, full, rtol=1e-6)
    for a, b in zip(g_chunked, g_full):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_gpt_units_include_the_loss_unit_which_is_never_split():
    choice = resolve_units(load_workload(TINY))
    assert choice.units[-1] == "lm_loss"
    assert not any(u.startswith("lm_loss.") for u in choice.units)


@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "bf16-true"])
def test_every_action_at_every_precision_gives_the_unplanned_loss_and_gradients(precision):
    w = load_workload(f"{TINY}&precision={precision}")
    units = resolve_units(w).units
    base_loss, base = _step(w, units, [Action.KEEP] * len(units))
    tol = TOLERANCE[precision]
    for action in (Action.RECOMPUTE, Action.SELECTIVE, Action.CHUNKED):
        actions = [Action.CHUNKED if u == "lm_loss" else (action if action != Action.CHUNKED else Action.RECOMPUTE)
                   for u in units] if action == Action.CHUNKED else [action] * len(units)
        loss, grads = _step(w, units, actions)
        assert _close(loss, base_loss, tol), (precision, action, loss, base_loss)
        for name, g in grads.items():
            assert _close(g, base[name], tol), (precision, action, name)


def test_chunked_is_refused_off_the_loss_unit():
    w = load_workload("gpt/tiny")
    units = resolve_units(w).units
    plan = plan_for(w.model, units, [Action.CHUNKED] + [Action.KEEP] * (len(units) - 1))
    with pytest.raises(PlanError, match="needs a loss unit"):
        apply_actions(w.model, plan, units)


def test_profile_offers_chunked_on_the_loss_unit_alone():
    w = load_workload("gpt/tiny?vocab_size=2048&batch_size=4")
    units = resolve_units(w).units
    prof = profile(w, units, [Action.KEEP, Action.RECOMPUTE, Action.CHUNKED], repeats=1)
    assert prof.chunk_units == [u == "lm_loss" for u in units]
    cm = CostModel(prof)
    k = prof.actions.index(Action.CHUNKED)
    with pytest.raises(PlanError, match="only a loss unit"):
        cm.predict([k] + [0] * (len(units) - 1))
    frontier = exact_frontier(cm)
    assert all(a != k for p in frontier for a in p.plan[:-1])
    assert frontier[0].plan[-1] == k  # the lowest peak chunks the loss
    rules = baseline_rules(len(units), prof.actions, links=prof.chain_links, loss_units=prof.chunk_units, n_random=20)
    assert rules["all_chunked"][-1] == k
    assert all(a != k for plan in rules.values() for a in plan[:-1])
    env = CheckpointEnv(prof, frontier[0].peak_bytes * 2)
    env.reset(seed=0)
    for i in range(len(units)):
        mask = env.action_masks()
        assert mask[k] == (i == len(units) - 1)  # chunked offered on the loss unit alone
        _, _, done, _, info = env.step(k)  # taken anyway off the loss unit: kept
    assert done and env._walk.plan == [prof.actions.index(Action.KEEP)] * (len(units) - 1) + [k]


def test_plan_with_chunked_is_schema_3_and_round_trips():
    plan = Plan(fingerprint="fp", actions={"blocks.0": Action.RECOMPUTE, "lm_loss": Action.CHUNKED})
    again = Plan.from_json(plan.to_json())
    assert plan.schema_version == 3 and again == plan


@pytest.mark.parametrize("factory", ["hf_llama", "hf_gpt2"])
def test_zoo_causal_lms_compute_their_own_loss_through_the_loss_unit(factory):
    pytest.importorskip("transformers")
    w = load_workload(f"env.workloads.zoo:{factory}?dropout=0")
    head = w.model.lm_loss.head
    w.model.lm_head = head  # transformers' own forward (its class's), with the head back where it looks for it
    own = type(w.model).forward(w.model, **w.inputs).loss
    del w.model.lm_head
    assert torch.allclose(w.loss(), own, rtol=1e-5)
    units = resolve_units(w).units
    assert units[-1] == "lm_loss"


def test_the_snippet_chunks_the_loss_as_apply_plan_does():
    from search.training.snippet import plan_snippet

    w = load_workload(TINY)
    units = resolve_units(w).units
    plan = plan_for(w.model, units, [Action.RECOMPUTE] * (len(units) - 1) + [Action.CHUNKED])
    ns: dict = {}
    exec(compile(plan_snippet(plan), "<snippet>", "exec"), ns)
    base_loss, base = _step(w, units, [Action.KEEP] * len(units))
    remove = ns["apply_checkpoint_plan"](w.model)
    torch.manual_seed(0)
    loss = w.loss()
    loss.backward()
    remove()
    assert _close(loss.detach(), base_loss, TOLERANCE["32"])
    assert all(_close(p.grad, base[n], TOLERANCE["32"]) for n, p in w.model.named_parameters())
    with pytest.warns(UserWarning, match="measured at precision 32 and is applied at bf16-mixed"):
        ns["apply_checkpoint_plan"](w.model, precision="bf16-mixed")()


def test_the_units_line_says_what_no_plan_reaches_where_the_loss_is_no_unit():
    lines = resolve_units(load_workload("lstm/tiny?vocab_size=4096")).lines()  # its loss is in its own forward
    assert "of all) is saved outside them (the loss, top-level ops), which no plan can reach" in lines[-2]
    assert "LMLoss" in lines[-1]
    assert not any("no plan can reach" in line for line in resolve_units(load_workload("gpt/tiny")).lines())

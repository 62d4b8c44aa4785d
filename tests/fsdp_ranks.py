"""The rank side of ``tests/test_fsdp.py``: what each of two spawned gloo ranks checks and saves.

Kept apart from the tests so that a spawned rank imports only the project's ``env`` and the export code
(not Ray, not pytest's test module).
"""

from __future__ import annotations

import torch

STEP_SEED = 1234
# a plan applied before fully_shard, after it (apply_plan on the sharded model), or by the standalone snippet after it
GRAD_CASES = ("none", "recompute:before", "selective:before", "recompute:after", "selective:after", "selective:snippet")
# a chain region under FSDP2, refused: one region over every unit, applied before sharding and after it
CHAIN_CASES = ("before", "after")
UNIFORM = ("keep", "recompute", "selective")


def rank_checks(rank: int, ranks: int, port: int, out: str) -> None:
    """One rank of the test module's group: gradients of each case, then peaks and a profile of the sharded gpt/tiny."""
    torch.set_num_threads(1)
    from env.data.plan import fingerprint
    from env.measure.fsdp import join_group, leave_group, shard_workload
    from env.measure.measurement import measure
    from env.measure.profiler import profile
    from env.runtime.apply import plan_for
    from env.units.find import find_units
    from env.workloads.workload import load_workload
    from search.training.apply import apply_plan
    from search.training.snippet import plan_snippet

    join_group(rank, ranks, port, "cpu")
    result: dict = {"grads": {}, "fingerprints": []}
    for case in GRAD_CASES:
        w = load_workload("gpt/tiny", seed=0)
        units = find_units(w.model)
        action, _, how = case.partition(":")
        plan = plan_for(w.model, units, [action] * len(units)) if how else None  # as a plan file has it
        if how == "before":
            apply_plan(w.model, plan)
        torch.manual_seed(0)  # the dropout masks of the step shard_workload takes, as the one-device reference's
        mine = fingerprint(w.model, units)
        w = shard_workload(w, units)
        result["fingerprints"].append((mine, fingerprint(w.model, units)))
        if how == "after":  # the plan made for the unsharded model, onto the sharded one
            apply_plan(w.model, plan)
        if how == "snippet":
            code: dict = {}
            exec(plan_snippet(plan), code)
            code["apply_checkpoint_plan"](w.model)
        w.model.zero_grad(set_to_none=True)
        torch.manual_seed(STEP_SEED)
        loss = w.loss()
        loss.backward()
        result["grads"][case] = (loss.detach(), {n: p.grad.full_tensor() for n, p in w.model.named_parameters()})
    result["chain_refusals"] = [_chain_refusal(how) for how in CHAIN_CASES]
    w = shard_workload(load_workload("gpt/tiny", seed=0), units)
    # check=True: the profile is refused unless its predicted peaks hold on this rank
    result["profile"] = profile(w, units, repeats=1).model_dump(mode="json")
    result["peaks"] = {a: [measure(w, plan_for(w.model, units, [a] * len(units)), units, repeats=1).peak_bytes
                           for _ in range(2)] for a in UNIFORM}
    result["gate"] = _gate_checks()
    torch.save(result, f"{out}.{rank}")
    leave_group()


def _gate_checks() -> dict[str, dict]:
    """The correctness gate on sharded models, as an FSDP group runs it (``FsdpRank.check``): every uniform plan of
    gpt/tiny, and recompute-everything on the model whose ``blocks.1`` draws numpy noise."""
    from env.measure.fsdp import shard_workload
    from env.measure.gate import agreed_error, check_plan
    from env.runtime.apply import plan_for
    from env.units.find import find_units
    from env.workloads.workload import load_workload

    checks = {}
    for spec, actions in [("gpt/tiny", a) for a in UNIFORM[1:]] + [("tests/broken_models.py:numpy_noise", "recompute")]:
        w = load_workload(spec, seed=0)
        units = find_units(w.model)
        w = shard_workload(w, units)
        plan = plan_for(w.model, units, [actions] * len(units))
        checks[f"{spec} {actions}"] = check_plan(w, plan, units, seed=STEP_SEED, error_of=agreed_error).model_dump()
    return checks


def _chain_refusal(how: str) -> str:
    """The one line a chained plan gets under FSDP2, applied before ``fully_shard`` or after it ('' if none)."""
    from env.data.errors import PlanError
    from env.measure.fsdp import shard_workload
    from env.runtime.apply import plan_for
    from env.units.find import find_units
    from env.workloads.workload import load_workload
    from search.training.apply import apply_plan

    w = load_workload("gpt/tiny", seed=0)
    units = find_units(w.model)
    plan = plan_for(w.model, units, ["recompute"] + ["chain"] * (len(units) - 1))
    try:
        if how == "before":
            apply_plan(w.model, plan)
        w = shard_workload(w, units)
        if how == "after":
            apply_plan(w.model, plan)
    except PlanError as e:
        return str(e)
    return ""

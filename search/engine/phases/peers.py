"""What users pick instead of a plan (``env.measure.peers``), measured by the same Evaluators in this run."""

from __future__ import annotations

from search.engine import ray_session
from search.engine.phases.context import RunContext
from search.records import meta

PEER_KINDS = {"none": (), "eager": ("hf_checkpointing", "checkpoint_sequential"),
              "all": ("hf_checkpointing", "checkpoint_sequential", "compile_budget")}  # by --peers


def measure_peers(ctx: RunContext) -> None:
    """The peers of ``--peers`` that apply to the workload and were not measured yet (a resumed
    run measured some already), each kept beside the plans (store meta ``peers``)."""
    kinds = PEER_KINDS[ctx.cfg.peers]
    if not kinds:
        return
    done = set(ctx.ledger.store.read(meta.PEERS))
    pool = ctx.measurer.pool
    offered = ray_session.get(pool.first.peers.remote(list(kinds), list(ctx.cfg.peer_budgets)))
    ctx.measurer.measure_peers([p for p in offered if p.name not in done])

"""What users pick instead of a plan (``env.measure.peers``), measured by the same Evaluators in this run.

A peer that is a plan of ours (``env.measure.peers.peer_plan``: every ``checkpoint_sequential``, transformers'
checkpointing and torchtitan's layer policy whose blocks are decision units) is measured once, as that plan,
and shown as it: it contends for the frontier as any plan does. The others are measured as themselves here.
Both kinds are measured again in the deciding and confirming passes, right after the plan that answers them
(``side_by_side_peers``), so that a verdict compares measurements taken together.
"""

from __future__ import annotations

from typing import Any, Collection

from env.data.types import PlanSource
from env.measure.peers import Peer, kinds_selected, measurable
from search.engine import ray_session
from search.engine.context import RunContext
from search.records import meta
from search.records.peer_verdicts import answer_to


def measure_peers(ctx: RunContext) -> None:
    """The peers of ``--peers`` that apply to the workload and were not measured yet (a resumed run measured
    some already), each kept beside the plans (store meta ``peers``): a plan of ours as that plan, the others
    as themselves."""
    kinds = kinds_selected(ctx.cfg.peers)
    if not kinds:
        return
    done = set(ctx.ledger.store.read(meta.PEERS))
    first = ctx.measurer.pool.first
    offered, lines = measurable([p for p in ray_session.get(first.peers.remote(list(kinds),
                                                                               list(ctx.cfg.peer_budgets)))
                                 if p.name not in done])
    for line in lines:
        ctx.ledger.note(line)
    if not offered:
        return
    codec = ctx.ledger.codec
    names = {a.value for a in codec.actions}
    as_plans = ray_session.get(first.peer_plans.remote(offered))
    plans = [(p, a) for p, a in zip(offered, as_plans) if a is not None and set(a) <= names
             and ctx.ledger.setup.cost_model.chain_error(codec.indices(a)) is None]  # a block: one this model has
    measured = ctx.measurer.measure([(codec.indices(a), PlanSource.peer(p.name)) for p, a in plans])
    for (peer, _), m in zip(plans, measured):
        ctx.ledger.record_peer_plan(peer.name, m.digest, peer.note, peer.label)
    mine = {p.name for p, _ in plans}
    ctx.measurer.measure_peers([p for p in offered if p.name not in mine])


def side_by_side_peers(ctx: RunContext, todo: list[str], done: list[str], limit: int,
                       only: Collection[str] | None = None) -> list[str | Peer]:
    """``todo`` (digests of measured plans) with each peer (of ``only``, by name, where given) placed right after
    the plan that answers it (our fastest plan of the strict frontier at no more memory) until the passes so far
    (``done``) measured both the peer and that answer ``limit`` times: a peer measured as itself, and a peer that is
    a plan of ours as that plan (unless it answers itself). The answer is taken as ranked now: where the passes'
    measurements moved it to a plan they measured less than ``limit`` times, that plan is put in, and a peer
    measured as itself is measured again beside it (a peer that is a plan of ours is measured at most ``limit``
    times, as every plan is), so that the answer its verdict names was measured in the same passes (the passes end:
    an answer is added only while it has fewer than ``limit``). The answer is put in where ``todo`` lacks it and the
    passes measured it less than ``limit`` times (else the peer goes last: its answer is measured in these passes
    already). Peers that ran out of memory, and those with no plan of ours as low, are left out."""
    ledger = ctx.ledger
    front = ledger.frontier()
    entries = ledger.store.read(meta.PEERS)
    out: list[str | Peer] = list(todo)
    for name, m in sorted(ledger.peers().items(), key=lambda kv: kv[1].peak_bytes):
        entry, answer = entries[name], answer_to(m, front)
        item: str | Peer | None = entry.get("plan") or (Peer.model_validate(entry["spec"]) if entry.get("spec") else None)
        if (item is None or m.oom or answer is None or answer.digest == m.digest or item in out
                or (only is not None and name not in only)):
            continue
        item_done = done.count(item_key(item)) >= limit
        if item_done and done.count(answer.digest) >= limit:
            continue
        if answer.digest not in out and done.count(answer.digest) < limit:
            out.append(answer.digest)
        if not item_done or isinstance(item, Peer):  # a plan is measured at most ``limit`` times in the passes
            out.insert(out.index(answer.digest) + 1 if answer.digest in out else len(out), item)
    return out


def item_key(item: Any) -> str:
    """What a pass counts an item of ``side_by_side_peers`` by: a plan's digest, a peer's ``peer:<name>``."""
    return item.digest if isinstance(item, Peer) else item

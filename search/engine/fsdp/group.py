"""FsdpGroup: the ``MeasuringActor`` whose plans are measured under FSDP2 by a group of Ray actors (``--fsdp N``).

The group is one Ray actor that the ``EvaluatorPool`` starts, restarts and calls as it does an
``Evaluator``: both implement ``search.engine.measuring_actor.MeasuringActor`` whole (info, warm_up, profile,
check, peers, evaluate, measure_at, drain, ...), so no phase of the search knows about FSDP. It starts ``N`` ``FsdpRank`` actors on its own node (one GPU each on GPUs), which form one
torch process group (gloo on CPU, NCCL on GPU; they meet on loopback at a port rank 0 picks) and
hold the workload sharded with ``fully_shard`` (``env.measure.fsdp``); rank 0 chooses the units.
Every request goes to all ranks at once:

- a measurement is one plan on every rank, merged by ``env.data.ranks.merge_ranks``: the largest
  rank's peak, per step the slowest rank's time, with the clock and device saying so;
- the profile is taken on every rank under FSDP (its allocations include what the rank gathers), each
  rank's predicted peaks checked against its own measured ones, and the search prices plans with the
  profile of the rank whose baseline peak is the largest (``env.data.ranks.binding_profile``);
- the records every measuring actor keeps (ids, cache, journal, references) stay here, in the group.

When a rank dies, or fails while the others wait for it in a collective, the group stops every rank
and raises ``RankDiedError``; the pool restarts the group as one and puts its plan back on the queue, and
records a plan that killed it twice as not fitting, as it does a single Evaluator's (every rank makes its
record without a step, ``FsdpRank.not_fitting``). A step whose allocation fails on a rank is that rank's
not-fitting record, and the group's (``merge_ranks``); where the other ranks are left waiting in a
collective for it, the group is stopped as for a death.
The group offers no peers (``peers`` answers none): transformers' checkpointing and ``checkpoint_sequential``
would wrap the sharded modules from outside, and compiled peers compile. Nor does it measure at other
micro-batches or with the whole model compiled: ``SearchConfig`` refuses ``--fsdp`` with a throughput search and
with ``--compile``, so those calls, the one-device ``Evaluator``'s own, never reach a group.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from env.data.errors import CkptSearchError, ModelError
from env.data.measured import MeasuredPlan
from env.data.plan import Plan
from env.data.ranks import binding_profile, merge_ranks, rank_device
from env.data.unit_choice import UnitChoice
from env.measure.peers import Peer
from env.units.choice import MAX_UNITS
from search.engine import ray_session
from search.engine.evaluator import resolve_device
from search.engine.fsdp.rank import FsdpRank
from search.engine.measuring_actor import MeasuringActor

RANK_GRACE_S = 30.0  # how long the other ranks get to answer once one has failed (a collective may hold them)
RANK_GRACE_ENV = "CKPT_SEARCH_RANK_GRACE_S"  # sets it, in seconds
PEERS_NOTE = ("peers are not measured under FSDP: transformers' checkpointing and checkpoint_sequential wrap the "
              "sharded modules from outside, and torch.compile's budget compiles")


class FsdpGroup(MeasuringActor):
    """The Evaluator's signature (its workload built as the group starts), and ``ranks``: how many ranks it has."""

    def __init__(self, workload_spec: str, seed: int, units: Sequence[str], actions: Sequence[str], repeats: int,
                 device: str = "auto", threads: int | None = None, name: str = "evaluator_0", compile: bool = False,
                 max_units: int = MAX_UNITS, reference_every: float = 0.0, ranks: int = 2) -> None:
        import ray

        self.ray, self.device, self.n_ranks = ray, resolve_device(device), ranks
        self.handles: list[Any] = []
        actor = _rank_actor(self.device.startswith("cuda"))
        first = actor.remote(workload_spec, seed, list(units), max_units, self.device, threads, 0, ranks)
        self.handles = [first]
        chosen = self._on_ranks(lambda h: h.chosen_units.remote(), [first])[0]  # rank 0 chooses, all shard these
        self.handles += [actor.remote(workload_spec, seed, chosen, max_units, self.device, threads, r, ranks)
                         for r in range(1, ranks)]
        port = self._on_ranks(lambda h: h.rendezvous.remote(), [first])[0]
        self.rank_info = self._on_ranks(lambda h: h.join.remote(port))
        self.fingerprint = self.rank_info[0]["fingerprint"]
        self._keep_records(workload_spec, seed, repeats, compile, UnitChoice.model_validate(
            self.rank_info[0]["unit_choice"]), actions, name, reference_every)
        self.profile_rank: int | None = None

    def _described(self) -> dict[str, Any]:
        first = self.rank_info[0]
        fsdp = {"ranks": self.n_ranks, "backend": first["backend"], "sharded": first["sharded"],
                "peers": PEERS_NOTE}
        return {"batch_shape": first["batch_shape"], "device_model": rank_device(first["device_model"], self.n_ranks),
                "fsdp": fsdp, "rank_pids": [r["pid"] for r in self.rank_info]}

    def profile(self) -> dict[str, Any]:
        profiles = self._on_ranks(lambda h: h.profile.remote([a.value for a in self.actions], self.repeats))
        self.profile_rank, prof = binding_profile(profiles)
        return prof.model_dump(mode="json")

    def warm_up(self) -> dict[str, Any]:
        """Every rank steps until its step time settles; the group took as many steps as its slowest rank."""
        return {"evaluator": self.label, "steps": max(self._on_ranks(lambda h: h.warm_up.remote()))}

    def check(self, plans: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
        """The correctness gate under FSDP: every rank checks each plan on its part of the sharded step, with the
        gradients gathered whole and the error agreed across the group (``FsdpRank.check``); rank 0's verdicts."""
        return self._on_ranks(lambda h: h.check.remote([list(p) for p in plans], self.seed))[0]

    def peers(self, kinds: Sequence[str], budgets: Sequence[float]) -> list[Peer]:
        """None of any kind: under FSDP no peer is measured (``PEERS_NOTE``)."""
        return []

    def measure_at(self, item: Sequence[str] | Peer, micro_batch: int, batch_dim: int | None = None,
                   source: str = "", known: MeasuredPlan | None = None, stop_above: int | None = None,
                   not_fitting: bool = False, eager: bool = False) -> dict[str, Any]:
        """A plan on every rank, on a sharded copy of the workload built at batch size ``micro_batch`` (built-in
        workloads: the price page's batch scaling); ``not_fitting``: each rank's record made without a step. A
        group measures plans only (no peer under FSDP), eagerly, profiling each rank's peak and timing every step:
        ``batch_dim``, ``known`` and ``stop_above`` serve a throughput search, which ``--fsdp`` refuses."""
        if isinstance(item, Peer):
            raise CkptSearchError(f"peer '{item.name}' under --fsdp: no peer is measured under FSDP; drop --fsdp "
                                  "to measure it")
        actions, mid = list(item), self._next_id()
        if not_fitting:
            m = merge_ranks(self._on_ranks(lambda h: h.not_fitting.remote(actions, source, mid)))
        else:
            m = merge_ranks(self._on_ranks(lambda h: h.measure_at_batch.remote(actions, micro_batch, self.repeats,
                                                                               source, mid)))
        return {"micro_batch": micro_batch, "record": m.model_copy(update={"evaluators": [self.label]})}

    def stop(self) -> None:
        """End every rank now (one may be waiting in a collective for a rank that will never come)."""
        for h in self.handles:
            self.ray.kill(h, no_restart=True)

    def _plan(self, actions: Sequence[str]) -> Plan:
        return Plan.from_list(self.units, list(actions), self.fingerprint)

    def _measure(self, plan: Plan, source: str, is_reference: bool, known: MeasuredPlan | None = None) -> MeasuredPlan:
        """One measurement on every rank; ``known`` is not lent to the ranks, whose peaks are each profiled."""
        names = [a.value for a in plan.action_list(self.units)]
        mid = self._next_id()
        records = self._on_ranks(lambda h: h.measure.remote(names, source, mid, self.repeats))
        return self._labelled(merge_ranks(records), is_reference)

    def _killed(self, digest: str, actions: Sequence[str], source: str) -> MeasuredPlan:
        """The record of a plan that killed the group's ranks twice: every rank's, made without a step, merged."""
        mid = self._next_id()
        return merge_ranks(self._on_ranks(lambda h: h.not_fitting.remote(list(actions), source, mid)))

    def _on_ranks(self, call: Any, handles: Sequence[Any] | None = None) -> list[Any]:
        """``call(rank handle)`` on every rank (or ``handles``) at once; their answers in rank order. A rank that
        died or failed stops the group: ``RankDiedError`` for a death, else the rank's own error. A rank whose step
        did not fit (an ``oom`` record) while the others are still in the step gives them ``RANK_GRACE_S``: those
        that ran out of memory at the same allocation answer at once, one left in a collective never does."""
        handles = list(self.handles if handles is None else handles)
        refs = [call(h) for h in handles]
        answers: dict[int, Any] = {}
        failed: dict[int, BaseException] = {}
        pending = list(refs)
        while pending:
            short = failed or any(getattr(a, "oom", False) for a in answers.values())
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=rank_grace_s() if short else None)
            if not ready:
                break  # the others wait in a collective for the failed rank
            k = refs.index(ready[0])
            try:
                answers[k] = ray_session.get(ready[0])
            except Exception as e:  # the group's to judge: a death restarts it, the model's error ends the run
                failed[k] = e
        if failed or pending:
            self.stop()
            stuck = [refs.index(r) for r in pending]
            raise self._failure(failed, stuck) if failed else self._left_waiting(answers, stuck)
        return [answers[k] for k in range(len(refs))]

    def _left_waiting(self, answers: dict[int, Any], stuck: list[int]) -> BaseException:
        """What the group raises when ranks ran out of memory and others were left in the step: a death of the
        group (restarted; the pool records a plan that does it twice as not fitting)."""
        short = sorted(k for k, a in answers.items() if getattr(a, "oom", False))
        return ray_session.RankDiedError(f"rank {short[0]} of {self.n_ranks} ran out of memory and ranks {stuck} were "
                                         f"left waiting for it in a collective; the group's ranks were stopped")

    def _failure(self, failed: dict[int, BaseException], stuck: list[int]) -> BaseException:
        """What the group raises when ranks failed: a death first (the others then fail too, in collectives)."""
        n = self.n_ranks
        for k, e in sorted(failed.items()):
            if isinstance(e, ray_session.actor_gone()):
                return ray_session.RankDiedError(f"rank {k} of {n} died ({ray_session.death_cause(e, limit=160)}); "
                                                 "the group's ranks were stopped")
        k, e = min(failed.items())
        if isinstance(e, CkptSearchError):
            kind = ModelError if isinstance(e, ModelError) else type(e)
            return kind(f"rank {k} of {n}: {e}" + (f" (ranks {stuck} were left waiting)" if stuck else ""))
        return e


def rank_grace_s() -> float:
    """``RANK_GRACE_S``, or the seconds ``CKPT_SEARCH_RANK_GRACE_S`` gives: ranks that ran out of memory at the same
    allocation answer within a second of each other, so a shorter grace still tells them from a rank left waiting."""
    text = os.environ.get(RANK_GRACE_ENV, "")
    try:
        seconds = float(text) if text else RANK_GRACE_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise CkptSearchError(f"{RANK_GRACE_ENV}={text!r} is not a positive number of seconds; set it to one "
                              f"(e.g. 30) or unset it")
    return seconds


def _rank_actor(gpu: bool) -> Any:
    """``FsdpRank`` as a Ray actor class on the group's node (a GPU each when ``gpu``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0, num_gpus=1 if gpu else 0, max_concurrency=1)(FsdpRank).options(
        scheduling_strategy=here)


def ray_fsdp_group() -> Any:
    """``FsdpGroup`` as a Ray actor class (it holds no device itself: its ranks do)."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=1)(FsdpGroup)


def group_count(fsdp: int, device: str, devices: int, evaluators: int, measure_threads: int,
                nodes: Sequence[dict[str, Any]]) -> tuple[int, bool]:
    """(how many groups, on GPUs?) of ``fsdp`` ranks each, all of a group's ranks on one node: on GPUs every
    group that fits (a GPU per rank; at most ``devices`` GPUs in all when given), on CPUs ``evaluators``
    groups. A cluster where no group fits is one line, as is a bad ``CKPT_SEARCH_RANK_GRACE_S`` (read here, before
    any rank starts)."""
    rank_grace_s()
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    gpus = [int(r.get("GPU", 0)) for r in alive] or [0]
    kind = resolve_device(device) if device != "auto" else ("cuda" if sum(gpus) >= 1 else "cpu")
    if kind.startswith("cuda"):
        groups = sum(g // fsdp for g in gpus)
        if not groups:
            raise CkptSearchError(f"--fsdp {fsdp} on GPUs needs {fsdp} GPUs on one node (one per rank) and the "
                                  f"largest node has {max(gpus)}; use --fsdp {max(max(gpus), 1)} or fewer, "
                                  "--device cpu, or a cluster with larger nodes (--address)")
        return (min(groups, max(1, devices // fsdp)) if devices else groups), True
    threads = max(1, measure_threads)
    cores = max([int(r.get("CPU", 0)) for r in alive] or [0])
    if cores < fsdp * threads:
        raise CkptSearchError(f"--fsdp {fsdp} needs {fsdp * threads} CPU cores on one node ({fsdp} ranks of "
                              f"{threads} measuring thread(s), --measure-threads) and the largest node has {cores}; "
                              f"use --fsdp {max(cores // threads, 1)} or fewer, or join a larger cluster (--address)")
    return evaluators, False


def group_nodes(fsdp: int, nodes: Sequence[dict[str, Any]]) -> list[str]:
    """The node of each GPU group in turn: every alive node once per ``fsdp`` GPUs it has, in node order."""
    alive = sorted((n for n in nodes if n.get("Alive")), key=lambda n: n["NodeID"])
    return [n["NodeID"] for n in alive for _ in range(int(n.get("Resources", {}).get("GPU", 0)) // fsdp)]

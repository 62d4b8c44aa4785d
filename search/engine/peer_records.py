"""PeerRecords: the ledger's peers (``env.measure.peers``), kept beside the plans in store meta ``peers``,
never on their frontier.

A peer measured as itself keeps its own record, merged as a plan's is (``MeasuredPlan.merged``); a peer that
is a plan of ours keeps that plan's record as the store has it. ``Ledger`` holds these methods; they use its
store, archive, ranking and lock.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from env.data.measured import MeasuredPlan
from search.engine.archive import ParetoArchive
from search.records import meta
from search.records.config import measured_scope
from search.records.store import RunStore


class PeerRecords:
    store: RunStore
    archive: ParetoArchive
    lock: threading.RLock
    _rank: Callable[..., MeasuredPlan]

    def record_peer(self, name: str, m: MeasuredPlan, note: str = "", spec: dict[str, Any] | None = None,
                    label: str = "") -> MeasuredPlan:
        """A peer's measurement: kept beside the plans (store meta ``peers``), never on their frontier. ``spec``:
        the peer as JSON (``env.measure.peers.Peer``), kept so that the passes can measure it again."""
        with self.lock:
            peers = self.store.read(meta.PEERS)
            old = peers.get(name)
            merged = old["record"].merged(m) if old is not None else m
            entry: meta.PeerEntry = {**(old or {}), "record": merged, "note": note}  # type: ignore[typeddict-item]
            if spec is not None:
                entry.update(spec=spec, label=label)
            peers[name] = entry
            self.store.write(meta.PEERS, peers)
        return merged

    def record_peer_plan(self, name: str, digest: str, note: str = "", label: str = "") -> None:
        """A peer that is a plan of ours (measured as that plan, ``digest``): kept beside the plans with that
        plan's record as the store has it now (``refresh_peer_plans`` brings it up to date)."""
        with self.lock:
            peers = self.store.read(meta.PEERS)
            peers[name] = {"record": self.archive.measured[digest], "note": note, "plan": digest, "label": label}
            self.store.write(meta.PEERS, peers)

    def refresh_peer_plans(self) -> None:
        """Each peer that is a plan of ours given its plan's record as the store has it now (every measurement)."""
        with self.lock:
            peers = self.store.read(meta.PEERS)
            for entry in peers.values():
                row = self.store.get(entry["plan"]) if entry.get("plan") else None
                if row is not None and row.measurement is not None:
                    entry["record"] = row.measurement
            self.store.write(meta.PEERS, peers)

    def peers(self) -> dict[str, MeasuredPlan]:
        """Each measured peer's record as the search ranks it; a peer that is a plan of ours: that plan's."""
        compiled = measured_scope(self.store.read(meta.CONFIG)) is not None  # compiled peers: the whole model each
        out = {}
        for k, v in self.store.read(meta.PEERS).items():
            plan = v.get("plan")
            out[k] = (self.archive.measured[plan] if plan in self.archive.measured
                      else self._rank(v["record"], floor=not compiled))
        return out

    def peer_plans(self) -> dict[str, str | None]:
        """Each measured peer's plan of ours (its digest), None where it is measured as itself."""
        return {k: v.get("plan") for k, v in self.store.read(meta.PEERS).items()}

"""The live terminal view of a search (rich): agents' progress, evaluations, frontier, hypervolume."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table

from env.data.types import MIB
from search.engine.agent_pool import AgentSlot


@dataclass(frozen=True)
class RoundStatus:
    """What the view shows after a round: the agents and the store's latest snapshot."""

    workload: str
    agents: Sequence[AgentSlot]
    timesteps_per_agent: int
    snapshot: dict[str, Any]  # RunStore.snapshots() row: n_evaluations, n_measured, frontier_size, hypervolume


class ProgressView:
    def __init__(self, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.live: Live | None = None

    def __enter__(self) -> "ProgressView":
        if self.enabled and self.console.is_terminal:
            self.live = Live(Table(), console=self.console, refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def update(self, status: RoundStatus) -> None:
        table = Table(title=f"ckpt-search: {status.workload}")
        for col in ("agent", "budgets MiB", "steps", "episodes", "best reward", "status"):
            table.add_column(col)
        for s in status.agents:
            budgets = (f"{s.budget_range[0] / MIB:.1f}-{s.budget_range[1] / MIB:.1f}" if s.budget_range
                       else f"{s.budget_bytes / MIB:.1f}")
            table.add_row(s.name, budgets, f"{s.timesteps}/{status.timesteps_per_agent}",
                          str(s.episodes), "-" if s.best_reward == float("-inf") else f"{s.best_reward:.3f}", s.status)
        last = status.snapshot
        table.caption = (f"evaluations {last['n_evaluations']} (measured {last['n_measured']}), "
                         f"frontier {last['frontier_size']}, hypervolume {last['hypervolume']:.4f}")
        if self.live is not None:
            self.live.update(table)
        elif self.enabled:
            done = sum(s.timesteps for s in status.agents)
            print(f"[search] steps {done}/{status.timesteps_per_agent * len(status.agents)}  {table.caption}",
                  file=sys.stderr, flush=True)

    def summary(self, report: dict[str, Any]) -> None:
        if not self.enabled:
            return
        b = report["baseline"]
        self.console.print(f"frontier: {len(report['frontier'])} measured plans; baseline {b['peak_bytes'] / MIB:.1f} MiB, "
                           f"{b['step_seconds'] * 1e3:.0f} ms")
        both = len({p.get("compile_scope") for p in report["frontier"]}) > 1  # --compile-scope both
        for p in report["frontier"]:
            self.console.print(f"  {p['peak_bytes'] / MIB:8.1f} MiB ({1 - p['peak_bytes'] / b['peak_bytes']:4.0%} saved)  "
                               f"{p['step_seconds'] * 1e3:8.1f} ms ({p['step_seconds'] / b['step_seconds'] - 1:+4.0%})  {', '.join(p['found_by'])}"
                               + ("  (whole model compiled)" if p.get("compile_scope") == "model" and both else ""))
        phases = report.get("phase_seconds") or {}
        if phases:
            self.console.print(f"time: {sum(phases.values()):.0f} s; " + ", ".join(
                f"{name} {s:.0f} s" for name, s in sorted(phases.items(), key=lambda kv: -kv[1]) if s >= 0.5))
        for e in report["events"]:
            self.console.print(f"  note: {e}")

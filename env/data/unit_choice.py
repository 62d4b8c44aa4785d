"""``UnitChoice``: the decision units of a workload and how much of the activation memory they hold
(chosen by ``env.units.find.choice``). Torch-free."""

from __future__ import annotations

from pydantic import BaseModel

from env.data.types import MIB


class UnitChoice(BaseModel):
    """The decision units of a workload and how much of the activation memory they hold."""

    units: list[str]  # FQNs, in forward execution order
    saved_bytes: list[int]  # per unit: bytes its subtree saves for backward
    total_saved_bytes: int  # everything saved for backward in one step, also outside any module
    coverable_bytes: int  # saved inside the model's submodules: what units can hold
    coverage: float  # sum(saved_bytes) / coverable_bytes (0.0 when not measured)
    mode: str  # auto, blocks, sub-blocks or patterns

    def lines(self) -> list[str]:
        """Human-readable: each unit with its saved MiB and share, then the coverage."""
        width = max((len(u) for u in self.units), default=0)
        share = [b / self.coverable_bytes if self.coverable_bytes else 0.0 for b in self.saved_bytes]
        out = [f"{u:<{width}}  {b / MIB:8.2f} MiB  {s:6.1%}"
               for u, b, s in zip(self.units, self.saved_bytes, share)]
        outside = self.total_saved_bytes - self.coverable_bytes
        out.append(f"{len(self.units)} units ({self.mode}) hold {self.coverage:.1%} of the "
                   f"{self.coverable_bytes / MIB:.1f} MiB the model's modules save for backward"
                   + (f"; {outside / MIB:.1f} MiB more ({outside / self.total_saved_bytes:.0%} of all) is saved outside "
                      "them (the loss, top-level ops), which no plan can reach" if outside else ""))
        if self.total_saved_bytes and outside / self.total_saved_bytes > 0.1:
            out.append("the loss can be a unit of its own (keep, recompute or chunked): give it as an "
                       "env.workloads.lm_loss.LMLoss of the last hidden states (README, 'Your own model')")
        return out

"""Predict a plan's peak memory and step time from a ModelProfile, without the model.

Walks the step's timeline (``env.data``): forward segments keep bytes, backward segments
free them while gradients accumulate and recomputation adds its transient; the peak is the
maximum of (level at a segment's start + that segment's rise), never a sum. Time is the sum
of the segments' times. Arrays are precomputed once per profile; a prediction costs O(n).

A chain region (units ``j..k``: a ``recompute`` and the ``chain`` units after it) walks its
forward unit by unit, each as its action's forward (``chain``: no input kept). In backward the
region is recomputed at once when the gradient reaches it: its units but the last are rerun as
under ``keep`` (their kept bytes pile up, with each one's transient on top), then the last unit
runs its backward as a recomputed unit does, then the others theirs as kept units do. So the
region's transient is the sum of its units' activations, and a one-unit region is exactly a
``recompute``. A block span (every unit of one parent ``block``, ``ModelProfile.block_spans``) is priced as a
chain region over the span (``block_costs``: its first unit as under ``recompute``, the others as under ``chain``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from env.data.errors import PlanError
from env.data.model_profile import ModelProfile
from env.data.plan import Action, Plan, chain_error, regions


@dataclass(frozen=True)
class Prediction:
    peak_bytes: int
    step_seconds: float


class CostModel:
    """``predict(action_indices)`` for the profile's units; indices into ``profile.actions``."""

    def __init__(self, profile: ModelProfile) -> None:
        self.profile = profile
        acts = profile.actions
        n = len(profile.units)
        # (n, A) arrays: forward/backward delta, rise, seconds of unit i under action a
        self.f_delta = np.array([[profile.costs[a][i].fwd.delta_bytes for a in acts] for i in range(n)], dtype=np.int64)
        self.f_rise = np.array([[profile.costs[a][i].fwd.rise_bytes for a in acts] for i in range(n)], dtype=np.int64)
        self.b_delta = np.array([[profile.costs[a][i].bwd.delta_bytes for a in acts] for i in range(n)], dtype=np.int64)
        self.b_rise = np.array([[profile.costs[a][i].bwd.rise_bytes for a in acts] for i in range(n)], dtype=np.int64)
        self.seconds = np.array([[profile.costs[a][i].fwd.seconds + profile.costs[a][i].bwd.seconds for a in acts]
                                 for i in range(n)])
        self.fixed_seconds = profile.pre.seconds + profile.post.seconds + profile.tail.seconds
        # python lists: faster than numpy indexing for the short loops below
        self._fd, self._fr = self.f_delta.tolist(), self.f_rise.tolist()
        self._bd, self._br = self.b_delta.tolist(), self.b_rise.tolist()
        self._s = self.seconds.tolist()
        index = {a: k for k, a in enumerate(acts)}
        self.keep, self.rec = index.get(Action.KEEP), index.get(Action.RECOMPUTE)
        self.chain = index.get(Action.CHAIN)  # None: plans have no chains
        self.links = profile.links()  # links[i]: unit i may continue the region of unit i - 1
        self.block = index.get(Action.BLOCK)  # None: plans have no blocks
        self.spans = [tuple(s) for s in profile.block_spans] if self.block is not None else []
        self.allowed = [[profile.allows(i, a) for a in acts] for i in range(n)]  # 'chunked': loss units only
        for region in (a for a in (self.chain, self.block) if a is not None):
            if self.keep is None or self.rec is None:
                raise PlanError(f"the profile has '{acts[region].value}' but not "
                                f"{'keep' if self.keep is None else 'recompute'}; a region starts as a recompute "
                                "and is recomputed as kept units: profile both")

    def with_step_seconds(self, seconds: np.ndarray, fixed_seconds: float) -> "CostModel":
        """This model with its step times replaced: ``seconds[i][a]`` per unit and action plus
        ``fixed_seconds`` (e.g. the times a correction fitted to measurements); peaks unchanged."""
        seconds = np.asarray(seconds, dtype=float)
        if seconds.shape != self.seconds.shape:
            raise ValueError(f"step seconds of shape {seconds.shape} for a model of shape {self.seconds.shape}; "
                             "give one time per unit and profiled action")
        cm = copy.copy(self)
        cm.seconds, cm._s, cm.fixed_seconds = seconds, seconds.tolist(), float(fixed_seconds)
        return cm

    @property
    def n_units(self) -> int:
        return len(self.profile.units)

    def action_index(self, action: Action) -> int:
        return self.profile.actions.index(action)

    def indices(self, plan: Plan) -> list[int]:
        if plan.fingerprint != self.profile.fingerprint:
            raise PlanError(f"plan fingerprint {plan.fingerprint} is not this profile's ({self.profile.fingerprint}); "
                            "profile the plan's model")
        try:
            return [self.profile.actions.index(a) for a in plan.action_list(self.profile.units)]
        except ValueError:
            raise PlanError(f"plan uses an action the profile lacks; profiled actions: "
                            f"{', '.join(a.value for a in self.profile.actions)}") from None

    def forward_levels(self, actions: Sequence[int]) -> list[int]:
        """Bytes live after each unit's forward, for the first ``len(actions)`` units."""
        level = self.profile.base_bytes + self.profile.pre.delta_bytes
        out = []
        for i, a in enumerate(actions):
            level += self._fd[i][a]
            out.append(level)
        return out

    def peak_bytes(self, actions: Sequence[int]) -> int:
        if any(a is not None and a in actions for a in (self.chain, self.block)):
            return self._chained_peak_bytes(actions)
        p = self.profile
        level = p.base_bytes
        peak = level + p.pre.rise_bytes
        level += p.pre.delta_bytes
        fd, fr, bd, br = self._fd, self._fr, self._bd, self._br
        for i, a in enumerate(actions):
            peak = max(peak, level + fr[i][a])
            level += fd[i][a]
        peak = max(peak, level + p.post.rise_bytes)
        level += p.post.delta_bytes
        for i in range(len(actions) - 1, -1, -1):
            a = actions[i]
            peak = max(peak, level + br[i][a])
            level += bd[i][a]
        return max(peak, level + p.tail.rise_bytes)

    def _chained_peak_bytes(self, actions: Sequence[int]) -> int:
        """``peak_bytes`` of a plan with chain regions (see the module docstring)."""
        p, fd, fr, bd, br, keep = self.profile, self._fd, self._fr, self._bd, self._br, self.keep
        level = p.base_bytes
        peak = level + p.pre.rise_bytes
        level += p.pre.delta_bytes
        for i, a in enumerate(actions):
            peak = max(peak, level + fr[i][a])
            level += fd[i][a]
        peak = max(peak, level + p.post.rise_bytes)
        level += p.post.delta_bytes
        first_of = {stop - 1: start for start, stop in regions([p.actions[a] for a in actions])}
        first_of.update({stop - 1: start for start, stop in self.spans if actions[start] == self.block})
        i = len(actions) - 1
        while i >= 0:
            start = first_of.get(i, i)
            for m in range(start, i):  # the region's units but the last, rerun as kept
                peak = max(peak, level + fr[m][keep])
                level += fd[m][keep]
            peak = max(peak, level + br[i][actions[i]])
            level += bd[i][actions[i]]
            for m in range(i - 1, start - 1, -1):
                peak = max(peak, level + br[m][keep])
                level += bd[m][keep]
            i = start - 1
        return max(peak, level + p.tail.rise_bytes)

    def chain_error(self, actions: Sequence[int]) -> str | None:
        """Why a plan's chains are not valid here (a chain after no region, or across units that do not
        chain), its blocks (``block_error``), or its 'chunked' (on a unit that is no loss unit); None if they are."""
        units = self.profile.units
        bad = next((i for i, a in enumerate(actions) if not self.allowed[i][a]), None)
        if bad is not None:
            return (f"unit '{units[bad]}' is '{self.profile.actions[actions[bad]].value}', which only a loss unit "
                    "(final norm, head and loss as one LMLoss module) can be; keep or recompute it")
        why = self.block_error(actions)
        if why or self.chain is None or self.chain not in actions:
            return why
        why = chain_error(units, [self.profile.actions[a] for a in actions])
        if why:
            return why
        bad = next((i for i, a in enumerate(actions) if a == self.chain and not self.links[i]), None)
        if bad is not None:
            return (f"units '{units[bad - 1]}' and '{units[bad]}' do not chain in this model (the profile found "
                    f"'{units[bad]}' is not run on '{units[bad - 1]}''s output alone); make '{units[bad]}' recompute")
        return None

    def block_error(self, actions: Sequence[int]) -> str | None:
        """Why a plan's blocks are not valid here: a 'block' unit in no span of the profile, or a span whose units
        are not all 'block'; None if they are."""
        if self.block is None or self.block not in actions:
            return None
        units, spans = self.profile.units, {i: span for span in self.spans for i in range(*span)}
        for i, a in enumerate(actions):
            if a != self.block:
                continue
            if i not in spans:
                return (f"unit '{units[i]}' is 'block', and this profile found no parent whose units, recomputed as "
                        "that parent, give the same step; make it recompute")
            start, stop = spans[i]
            other = next((j for j in range(start, stop) if actions[j] != self.block), None)
            if other is not None:
                return (f"unit '{units[i]}' is 'block' and '{units[other]}' of the same parent is "
                        f"'{self.profile.actions[actions[other]].value}'; make every unit of the parent block, or none")
        return None

    def step_seconds(self, actions: Sequence[int]) -> float:
        s = self._s
        return self.fixed_seconds + sum(s[i][a] for i, a in enumerate(actions))

    def predict(self, actions: Sequence[int] | Plan) -> Prediction:
        idx = self.indices(actions) if isinstance(actions, Plan) else list(actions)
        if len(idx) != self.n_units:
            raise PlanError(f"{len(idx)} actions for {self.n_units} units; give one per unit")
        why = self.chain_error(idx)
        if why:
            raise PlanError(why)
        return Prediction(self.peak_bytes(idx), self.step_seconds(idx))

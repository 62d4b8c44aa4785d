"""Behaviour cloning of a budget-conditioned policy from the exact solver's plans.

The teacher is the exact frontier (``agents.exact``) on the cost model corrected by the plans
measured so far (``MeasuredCorrection.corrected_model``): for a budget b its plan is the
fastest frontier point whose peak fits b. The label-setting solver grows combinatorially with
units of many different sizes (a 64-unit profile of varied units: 4903 frontier points, over
2 minutes), so the teacher compares peak states in steps of 0.5% of how far they lie below the
all-keep plan's (``exact_frontier(relative=...)``): 1.4 s and 0.99969 of the exact frontier's
hypervolume at 64 units, 2.3 s at 96, and every rule of ``agents.baselines`` still dominated.
Steps of a fixed number of bytes lost the plans that differ from all-keep by a unit or two.

The teacher's plans include chain regions where the profile has ``chain`` (the exact solver
searches them), so the policy learns when to open, continue and close a region; its
observation says whether a region is open (``CheckpointEnv``'s table).

A demonstration is one episode of ``CheckpointEnv`` at one budget following the teacher's
plan: the observations the policy will see, the masks, the teacher's actions and the
episode's reward (the return of every step, gamma = 1). Cloning fits the policy's masked
action distribution to the teacher's actions and its value head to the returns, so that PPO
starts from the teacher's plans with a critic that already knows what they score.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from sb3_contrib import MaskablePPO

from agents.exact import FrontierPoint, exact_frontier, pareto_points
from env.gym.checkpoint_env import CheckpointEnv


@dataclass(frozen=True)
class Demonstrations:
    obs: np.ndarray  # (N, obs_dim) float32, N = episodes * n_units
    masks: np.ndarray  # (N, A) bool
    actions: np.ndarray  # (N,) int64, enabled-action indices
    returns: np.ndarray  # (N,) float32: the episode's reward
    weights: np.ndarray  # (N,) float32, mean 1: the episode's weight in the cloning loss
    episodes: int


@dataclass(frozen=True)
class CloneStats:
    updates: int  # minibatch updates
    loss: float  # last minibatch's cross-entropy
    value_loss: float  # last minibatch's squared error of the value head
    accuracy: float  # share of demonstrated steps whose most likely allowed action is the teacher's
    regret: float  # the best regret() (see PPOAgent.regret): the policy's
    seconds: float


def teacher_frontier(env: CheckpointEnv, relative: float, floor: float,
                     incumbents: Iterable[tuple[int, ...]] = ()) -> list[FrontierPoint]:
    """The frontier of ``env``'s enabled actions on its corrected cost model, joined by the measured
    ``incumbents``, each plan priced as the env's reward prices it: measured step time when it was
    measured, else the corrected prediction; peaks in measured bytes (the prediction scaled by the
    measured/predicted peak ratio, or the measured peak where that is larger, so that a demonstrated
    plan fits every budget it is demonstrated at, for the masks and for the reward). Sorted by peak.

    The corrected model is an additive fit, pulled towards the profile: it smooths over what single
    plans measured. On the solver's plans alone, a plan measured faster than the fit predicts it
    (an incumbent) was never taught, and one measured slower was taught at its predicted time: in a
    48-unit search the agents' plans between 85 and 112 MB measured 3-6% slower than the exact
    solver's plans measured beside them, which the agents saw and never took up. The solver compares
    peak states in steps of ``relative`` of how far they lie below the all-keep plan's, and at least
    ``floor`` of the baseline's activation bytes."""
    cm = env.correction.corrected_model()
    act_bytes = max(1, env.baseline_peak - env.profile.base_bytes)
    solved = exact_frontier(cm, env.enabled_indices, resolution_bytes=max(1, int(floor * act_bytes)), relative=relative)
    scaled, measured, enabled = env.correction.scaled_peak, env.correction.measured, set(env.enabled_indices)

    def priced(plan: tuple[int, ...], predicted_peak: int, predicted_seconds: float) -> tuple[int, float, tuple[int, ...]]:
        peak, known = scaled(predicted_peak), measured.get(plan)
        return (max(peak, known[0]), known[1], plan) if known else (peak, predicted_seconds, plan)

    points = [priced(tuple(p.plan), p.peak_bytes, p.step_seconds) for p in solved]
    points += [priced(plan, env.cost_model.peak_bytes(list(plan)), measured[plan][1]) for plan in dict.fromkeys(incumbents)
               if plan in measured and set(plan) <= enabled]  # measured: priced at what was measured
    return pareto_points(points)


def teacher_plan(frontier: Sequence[FrontierPoint], budget_bytes: int) -> tuple[int, ...]:
    """The fastest frontier plan that fits the budget; the lowest-peak one if none fits."""
    fits = [p for p in frontier if p.peak_bytes <= budget_bytes]
    return fits[-1].plan if fits else frontier[0].plan


def demo_budgets(frontier: Sequence[FrontierPoint], budget_range: tuple[int, int], max_points: int,
                 n_random: int, rng: np.random.Generator) -> list[int]:
    """Budgets to demonstrate: the peaks of up to ``max_points`` frontier points in the range
    (where the teacher's plan changes), evenly spread, plus ``n_random`` uniform draws."""
    low, high = budget_range
    peaks = sorted({p.peak_bytes for p in frontier if low <= p.peak_bytes <= high} | {low, high})
    if len(peaks) > max_points:  # evenly spread, both ends kept
        peaks = [peaks[round(j)] for j in np.linspace(0, len(peaks) - 1, max_points)]
    drawn = rng.integers(low, high, size=n_random, endpoint=True).tolist() if high > low else []
    return sorted(set(peaks) | set(drawn))


def demonstrations(env: CheckpointEnv, frontier: Sequence[FrontierPoint], budgets: Sequence[int],
                   time_scale: float) -> Demonstrations:
    """One teacher episode per budget, on a copy of ``env`` (no ``on_plan``, cost model only).

    An episode weighs ``1 / (|teacher's seconds / baseline's - 1| + time_scale)`` (normalised to
    mean 1): near the baseline the frontier's plans differ by hundredths of a percent of the step
    time, and a step off costs as much, relative to what the plan buys, as a wrong unit in the
    middle of the range; unweighted, those few steps are lost among the rest."""
    walk = copy.copy(env)
    walk.on_plan, walk.reward_mode = None, "model"  # demonstrations are never measured
    index = {a: k for k, a in enumerate(env.enabled_indices)}
    obs, masks, actions, returns, weights = [], [], [], [], []
    for budget in budgets:
        o, _ = walk.reset(options={"budget_bytes": int(budget)})
        start = len(obs)
        reward = 0.0
        for a in teacher_plan(frontier, int(budget)):
            obs.append(o)
            masks.append(walk.action_masks())
            actions.append(index[a])
            o, reward, *_ = walk.step(index[a])
        returns += [reward] * (len(obs) - start)
        weights += [1.0 / (abs(reward + 1.0) + time_scale)] * (len(obs) - start)  # reward = -seconds / baseline's
    w = np.array(weights, dtype=np.float32)
    return Demonstrations(np.array(obs, dtype=np.float32), np.array(masks, dtype=bool),
                          np.array(actions, dtype=np.int64), np.array(returns, dtype=np.float32),
                          w / w.mean() if len(w) else w, len(budgets))


def clone(model: MaskablePPO, demos: Demonstrations, regret: Callable[[], float], max_updates: int,
          tolerance: float, lr: float, batch_size: int, rng: np.random.Generator,
          check_every: int = 200, patience: int = 3) -> CloneStats:
    """Fit the policy to the demonstrations (cross-entropy of the masked action distribution plus
    the value head's squared error) until ``regret()`` (how much slower the policy's plans are
    than the teacher's) is at most ``tolerance``, has not improved for ``patience`` checks (one
    every ``check_every`` updates), or ``max_updates`` minibatch updates; the policy keeps the
    weights of its best check.

    Not every step can match: the same observation can be demonstrated with different actions
    (budgets between two frontier points, ties), and the masks keep every plan feasible whatever
    the policy picks; so the plans are what cloning is judged by, not the per-step accuracy."""
    t0 = time.perf_counter()
    policy = model.policy
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    obs = torch.as_tensor(demos.obs, device=policy.device)
    actions = torch.as_tensor(demos.actions, device=policy.device)
    returns = torch.as_tensor(demos.returns, device=policy.device)
    weights = torch.as_tensor(demos.weights, device=policy.device)
    n = len(demos.actions)
    per_epoch = -(-n // batch_size)
    order = rng.permutation(n)
    updates, loss, value, since_best = 0, float("nan"), float("nan"), 0
    best, best_state = regret(), copy.deepcopy(policy.state_dict())
    while updates < max_updates and best > tolerance and since_best < patience:
        policy.set_training_mode(True)
        for _ in range(check_every):
            if updates and updates % per_epoch == 0:
                order = rng.permutation(n)
            idx = order[(updates % per_epoch) * batch_size:][:batch_size]
            values, log_prob, _ = policy.evaluate_actions(obs[idx], actions[idx], action_masks=demos.masks[idx])
            policy_loss = -(weights[idx] * log_prob).mean()
            value_loss = torch.nn.functional.mse_loss(values.flatten(), returns[idx])
            optimizer.zero_grad()
            (policy_loss + 0.5 * value_loss).backward()
            optimizer.step()
            loss, value = float(policy_loss.detach()), float(value_loss.detach())
            updates += 1
        policy.set_training_mode(False)
        gap = regret()
        since_best += 1
        if gap < best:
            best, best_state, since_best = gap, copy.deepcopy(policy.state_dict()), 0
    policy.load_state_dict(best_state)
    return CloneStats(updates, loss, value, _accuracy(model, demos), best, time.perf_counter() - t0)


def _accuracy(model: MaskablePPO, demos: Demonstrations) -> float:
    with torch.no_grad():
        dist = model.policy.get_distribution(torch.as_tensor(demos.obs, device=model.policy.device),
                                             action_masks=demos.masks)
        best = dist.distribution.probs.argmax(dim=1).cpu().numpy()
    return float(np.mean(best == demos.actions))

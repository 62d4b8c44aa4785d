"""PyTorch's auto-SAC (``torch.distributed._tools``), run as its users run it, and its per-op policies installed.

torch's flow (its test ``test/distributed/_tools/test_sac_ilp.py``): over one training step ``MemTracker`` gives
each module's memory, ``RuntimeEstimator`` its forward and backward time and the modules' order, and
``SACEstimator`` each module's ops with their memory and time and the greedy trade-off of memory discarded against
recompute time (fitted by ``pwlf``); ``ilp_utils.aggregate_stats`` and ``parse_module_info`` make the module tree;
``sac_ilp.sac_milp`` (PuLP's CBC) picks the modules to checkpoint and the share of each one's activation memory to
discard under a memory budget in GiB, with its estimate of the step's peak and of the recompute time; and
``get_optimal_checkpointing_policy_per_module`` turns each share into a save-or-recompute decision per op. Each
picked module then runs under ``torch.utils.checkpoint`` with its decisions, through
``create_selective_checkpoint_contexts`` (RNG state preserved, so a recomputed dropout draws its mask again).

The budget: ``sac_milp`` takes GiB, which mean nothing across models, so a peer's ``budget`` is a fraction, as a
compile budget's is: 0.0 is the lowest memory budget the ILP can meet (found by bisection), 1.0 its estimate of the
unplanned step's peak (``get_peak_memory_runtime_baseline``: nothing checkpointed), converted to GiB in between.
Its memory model counts parameters, gradients and activations, not the optimizer's state.

Devices. On CUDA as shipped: the estimators on a fake copy of the model (``FakeTensorMode``), op times from
``RuntimeEstimator``'s benchmark (each op run on the GPU, timed with CUDA events). On a CPU they cannot run as
shipped (its roofline and its benchmark need CUDA, and the model cannot be made fake), so the same estimators run
on the real model and batch, and each op is timed as it runs by the step's clock
(``env.measure.timeline.step_clock``): the ILP gets op times measured on this CPU in place of a GPU's
(``CPU_ESTIMATES``). Either way the estimators run one step on the model, its state kept.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import json
import logging
import traceback
import weakref
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.distributed._tools.mem_tracker import MemTracker, _ModState
from torch.distributed._tools.runtime_estimator import RuntimeEstimator
from torch.distributed._tools.sac_estimator import OPS_TO_ALWAYS_SKIP, SACEstimator, SACStats
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from env.data.errors import PlanError, WorkloadError
from env.measure.timeline import step_clock
from env.runtime.chains import state_kept
from env.workloads.workload import Workload

BENCHMARK = "operator-level-benchmark"  # RuntimeEstimator's and SACEstimator's mode on CUDA: ops timed by CUDA events
CUDA_ESTIMATES = "CUDA: torch's estimators as shipped, on a fake copy of the model, ops timed by CUDA events"
CPU_ESTIMATES = "CPU: torch's estimators on the real model, each op timed by the step's clock"  # see the docstring
FLOOR_STEPS = 10  # bisection steps for the lowest budget the ILP meets: within 1/1024 of the unplanned peak
_GIB = 2**30


def missing() -> str | None:
    """Why auto-SAC cannot run here (its ILP needs PuLP, its trade-off fit pwlf), in one line; None where it can.
    Looked up without importing them, so that listing the peers costs the default run nothing."""
    for name in ("pulp", "pwlf"):
        if importlib.util.find_spec(name) is None:
            return (f"PyTorch's auto-SAC is skipped: {name} is not installed (its ILP needs PuLP, its trade-off fit "
                    "pwlf); install them with pip install -e '.[autosac]'")
    return None


class NoAutoSacPlan(WorkloadError):
    """auto-SAC has no decisions at a budget on a model: its ILP (for the model or one of its modules) has no
    solution there. A peer at that budget is not measured (``env.measure.peers.decided``)."""


@dataclasses.dataclass(frozen=True)
class AutoSacPlan:
    """What auto-SAC decided at one budget, and what it estimates of it (beside what is measured)."""

    budget: float  # the peer's fraction: 0.0 the lowest budget the ILP meets, 1.0 its unplanned peak
    memory_budget_bytes: int  # what sac_milp was given (in GiB)
    discard: dict[str, float]  # the model's module FQN -> share of its activation memory discarded (sac_milp)
    saves: dict[str, tuple[int, ...]]  # module FQN -> per op of its forward: 1 saved, 0 recomputed
    ops: dict[str, tuple[str, ...]]  # module FQN -> its forward's ops, in the estimator's order (what saves index)
    estimated_peak_bytes: int  # sac_milp's bound on the step's peak (parameters, gradients, activations)
    estimated_recompute_seconds: float  # sac_milp's recompute time
    unplanned_peak_bytes: int  # its estimate of the peak with nothing checkpointed
    estimated_on: str  # how the op times were found (CUDA's benchmark, or CPU_ESTIMATES)

    def to_json(self) -> str:
        """The decisions as JSON text: a peer carries them (``Peer.params['decided']``), so that every later
        measurement of it, in the search's passes or a quote in another process, installs what was decided once."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "AutoSacPlan":
        try:
            d = json.loads(text)
            return cls(**{**d, "saves": {k: tuple(v) for k, v in d["saves"].items()},
                          "ops": {k: tuple(v) for k, v in d["ops"].items()}})
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise PlanError(f"auto-SAC's carried decisions cannot be read ({type(e).__name__}: {e}); drop "
                            "params['decided'] to solve again") from None


@dataclasses.dataclass(frozen=True)
class _Analysis:
    """The estimators' stats of one model at one batch, solved again at every budget."""

    info: Any  # ilp_utils.ModuleInfo; sac_milp writes into its graph, so each solve parses a copy
    sac_stats: dict[str, SACStats]  # by the estimators' FQN (the root's class name first)
    unplanned_peak_bytes: int
    floor_bytes: int  # the lowest memory budget sac_milp meets
    estimated_on: str
    plans: dict[float, AutoSacPlan] = dataclasses.field(default_factory=dict)  # solved, by budget


# per model, by batch shape, precision and device: the estimators run once for each
_ANALYSES: weakref.WeakKeyDictionary[nn.Module, dict[str, "_Analysis | NoAutoSacPlan"]] = weakref.WeakKeyDictionary()


def solve(workload: Workload, budget: float) -> AutoSacPlan:
    """auto-SAC's decisions at ``budget`` (see the module docstring), from the model's stats (found once per model
    and batch; each budget solved once)."""
    if not 0.0 <= budget <= 1.0:
        raise WorkloadError(f"auto-SAC budget={budget} must be between 0.0 (its lowest peak) and 1.0 (nothing "
                            "checkpointed); pick a fraction")
    a = _analysis(workload)
    if budget not in a.plans:
        a.plans[budget] = _solved(a, budget, workload.spec)
    return a.plans[budget]


def _solved(a: _Analysis, budget: float, spec: str) -> AutoSacPlan:
    from torch.distributed._tools.ilp_utils import parse_module_info
    from torch.distributed._tools.sac_ilp import sac_milp

    memory = int(a.floor_bytes + budget * (a.unplanned_peak_bytes - a.floor_bytes))
    decisions, recompute_ms, peak = sac_milp(parse_module_info(copy.deepcopy(a.info)), memory_budget=memory / _GIB)
    if peak < 0:
        raise NoAutoSacPlan(f"auto-SAC finds no plan at budget {budget} ({memory} bytes) on workload "
                            f"'{spec}'; pick a larger budget")
    saves = {_model_fqn(f): per_op(a.sac_stats[f], r, _model_fqn(f), budget, spec) for f, r in decisions.items()}
    ops = {_model_fqn(f): tuple(a.sac_stats[f].func_names) for f in decisions}
    return AutoSacPlan(budget, memory, {_model_fqn(f): r for f, r in decisions.items()}, saves, ops, peak,
                       recompute_ms / 1e3, a.unplanned_peak_bytes, a.estimated_on)


def per_op(stats: SACStats, discard: float, module: str, budget: float, spec: str) -> tuple[int, ...]:
    """torch's per-op decisions for ``module`` at a discard ratio (``get_optimal_checkpointing_policy_per_module``),
    one per op: 1 saved, 0 recomputed. Where that ILP has no solution torch returns none (a module whose in-place
    op must be saved with its parent, told to save nothing): ``NoAutoSacPlan``."""
    from torch.distributed._tools.sac_ilp import get_optimal_checkpointing_policy_per_module

    saved = get_optimal_checkpointing_policy_per_module(stats, 1.0 - discard)
    if len(saved) != len(stats.func_names):
        raise NoAutoSacPlan(f"auto-SAC finds no per-op policy for '{module}' at budget {budget} on workload '{spec}' "
                            f"(its per-module ILP has no solution at discard ratio {discard:.2f}); pick another budget")
    return tuple(saved)


@contextlib.contextmanager
def installed(workload: Workload, plan: AutoSacPlan) -> Iterator[None]:
    """``plan``'s modules checkpointed with their per-op decisions (``block_policies.wrapped_modules``); a module
    the model lacks is one line."""
    from env.measure.block_policies import wrapped_modules

    missing = [f for f in plan.saves if f not in dict(workload.model.named_modules())]
    if missing:
        raise PlanError(f"auto-SAC's decisions name modules this model lacks ({', '.join(missing[:3])}); they were "
                        "made for another model: solve again on this one")
    modules = [workload.model.get_submodule(f) for f in plan.saves]
    fns = [op_policy(f, list(plan.ops[f]), saves) for f, saves in plan.saves.items()]
    with wrapped_modules(modules, fns):
        yield


def op_policy(module: str, ops: list[str], saves: tuple[int, ...]) -> Callable[[], tuple[Any, Any]]:
    """A ``context_fn`` whose policy saves op i of the module's forward where ``saves[i]`` (in the estimator's order,
    which skips ``OPS_TO_ALWAYS_SKIP``), counted apart in the forward and in the recompute. An op that is not the
    one the estimator saw there is refused: the decisions would fall on other ops."""
    if len(saves) != len(ops):
        raise PlanError(f"auto-SAC's policy for '{module}' has {len(saves)} decisions for {len(ops)} ops; "
                        "its ILP found no per-op policy, solve again at another budget")

    def context_fn() -> tuple[Any, Any]:
        seen: defaultdict[bool, int] = defaultdict(int)

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            if func in OPS_TO_ALWAYS_SKIP:
                return CheckpointPolicy.PREFER_RECOMPUTE
            i = seen[ctx.is_recompute]
            seen[ctx.is_recompute] += 1
            if i >= len(ops) or func._overloadpacket.__name__ != ops[i]:
                raise PlanError(f"auto-SAC's policy for '{module}': op {i} is {func} where its estimator saw "
                                f"{ops[i] if i < len(ops) else 'no op'}; the module runs other ops than when it "
                                "was estimated (another batch shape?), solve again")
            return CheckpointPolicy.MUST_SAVE if saves[i] else CheckpointPolicy.PREFER_RECOMPUTE

        # the ILP saves an in-place group with its head (dropout on CPU: empty_like, bernoulli_, div_), so the
        # head's cached output is mutated by the rest of its group, which is saved too: allowed, as it must be
        return create_selective_checkpoint_contexts(policy, allow_cache_entry_mutation=True)

    return context_fn


def _model_fqn(estimator_fqn: str) -> str:
    """The model's FQN of a module the estimators name with the root's class name first (``GPT.blocks.0``)."""
    return estimator_fqn.partition(".")[2]


# ---------------------------------------------------------------------------------------------
# torch's estimators over one step

def _analysis(workload: Workload) -> _Analysis:
    """The model's stats (found once per model, batch, precision and device). Where torch's estimators fail on the
    model (an exception inside ``torch.distributed._tools``: on transformers' Llama, ``aggregate_stats`` looks up a
    module's pre-backward snapshot that ``MemTracker`` never took; on diffusers' UNet, ``pwlf_sac_tradeoff_curve``
    divides by a module's saved memory of 0), auto-SAC has no decisions on it at any budget: ``NoAutoSacPlan``, in
    one line, and the failure is kept, not run again."""
    key = f"{workload.batch_shape}|{workload.precision}|{workload.device}"
    known = _ANALYSES.setdefault(workload.model, {})
    if key not in known:
        try:
            known[key] = _analyse(workload)
        except (WorkloadError, PlanError):
            raise
        except Exception as e:  # noqa: BLE001 - torch's estimators as shipped, failing on this model
            frame = traceback.extract_tb(e.__traceback__)[-1]
            where = f"{frame.name} ({Path(frame.filename).name}:{frame.lineno})"
            known[key] = NoAutoSacPlan(f"torch's auto-SAC cannot analyse workload '{workload.spec}': its estimators "
                                       f"raise {type(e).__name__} ({str(e).splitlines()[0][:120] if str(e) else 'no message'}) "
                                       f"in {where}; no auto-SAC peer on this model")
    found = known[key]
    if isinstance(found, NoAutoSacPlan):
        raise found
    return found


def _analyse(workload: Workload) -> _Analysis:
    from torch.distributed._tools.ilp_utils import aggregate_stats, get_peak_memory_runtime_baseline, parse_module_info

    device = workload.device
    with state_kept(workload.model), _estimated(workload) as (w, runtime, sac, note):
        tracker = _memory(w)
        _step(w, runtime)
        with sac:
            loss = w.loss()
        loss.backward()
        w.model.zero_grad(set_to_none=True)
        info = aggregate_stats(w.model, tracker, runtime, sac, device)
        stats = dict(sac.sac_mod_stats)
    unplanned, _ = get_peak_memory_runtime_baseline(parse_module_info(copy.deepcopy(info)))
    return _Analysis(info, stats, unplanned, _floor(info, unplanned), note)


@contextlib.contextmanager
def _estimated(workload: Workload) -> Iterator[tuple[Workload, RuntimeEstimator, SACEstimator, str]]:
    """The workload the estimators run on, with the estimators: on CUDA a fake copy under ``FakeTensorMode`` and
    torch's benchmark mode, as shipped; elsewhere the workload itself with each op timed as it runs."""
    if workload.device.type != "cuda":
        clock = step_clock(workload.device)[1]
        yield workload, _TimedRuntimeEstimator(clock), _TimedSACEstimator(clock), CPU_ESTIMATES
        return
    from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode
    from torch.utils._pytree import tree_map_only

    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        with FakeCopyMode(fake):
            model = copy.deepcopy(workload.model)
        inputs = tree_map_only(torch.Tensor, fake.from_tensor, workload.inputs)
        fake_workload = dataclasses.replace(workload, model=model, inputs=inputs)
        yield fake_workload, RuntimeEstimator()(BENCHMARK), SACEstimator()(BENCHMARK), CUDA_ESTIMATES


def _memory(workload: Workload) -> MemTracker:
    """``MemTracker`` over one forward and backward, as torch's test runs it (the optimizer left out: its state is
    not in the ILP's memory model, and a step would change the weights)."""
    tracker = MemTracker()
    tracker.track_external(workload.model)
    with tracker:
        workload.loss().backward()
        last = tracker.get_tracker_snapshot("current")
    workload.model.zero_grad(set_to_none=True)
    for stats in tracker.memory_tracking.values():  # as torch's test: modules whose post-backward hook did not run
        stats.snapshots.setdefault(_ModState.POST_BW, []).append(copy.deepcopy(last))
    return tracker


def _step(workload: Workload, estimator: RuntimeEstimator) -> None:
    with estimator:
        workload.loss().backward()
    workload.model.zero_grad(set_to_none=True)


def _floor(info: Any, unplanned_bytes: int) -> int:
    """The lowest memory budget ``sac_milp`` meets, by bisection between nothing and the unplanned peak (its
    infeasible solves are expected here, and not logged)."""
    from torch.distributed._tools.ilp_utils import parse_module_info
    from torch.distributed._tools.sac_ilp import logger, sac_milp

    low, high = 0, unplanned_bytes
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        for _ in range(FLOOR_STEPS):
            mid = (low + high) // 2
            if sac_milp(parse_module_info(copy.deepcopy(info)), memory_budget=mid / _GIB)[2] >= 0:
                high = mid
            else:
                low = mid
    finally:
        logger.setLevel(level)
    return high


def _timer(clock: Callable[[], int]) -> Callable[..., tuple[Any, float]]:
    """An estimator's op timer that runs the op on real tensors and reads ``clock`` (ns) around it, in ms."""
    def timed(func: Any, args: Any, kwargs: Any) -> tuple[Any, float]:
        start = clock()
        out = func(*args, **(kwargs or {}))
        return out, (clock() - start) / 1e6

    return timed


class _TimedRuntimeEstimator(RuntimeEstimator):
    """torch's ``RuntimeEstimator`` on real tensors, its ops timed by ``clock``. Its ``__enter__`` asserts a
    ``FakeTensorMode`` only to hand it to its CUDA timers; this one is its ``__enter__`` without that."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__()
        self._estimate = _timer(clock)
        self._estimate_mode_type = "timed on real tensors"

    def __enter__(self) -> "_TimedRuntimeEstimator":
        self.total_runtime = 0.0
        self.mod_runtimes = defaultdict(lambda: defaultdict(lambda: 0.0))
        tracker, fqn = self._mod_tracker, self._mod_tracker.get_known_fqn
        for order in (self.mod_fw_pre_order, self.mod_bw_pre_order, self.mod_fw_post_order, self.mod_bw_post_order):
            order.clear()
        tracker.register_user_hooks(
            pre_fw_hook=lambda mod, inp: self.mod_fw_pre_order.append(fqn(mod)),
            pre_bw_hook=lambda mod, g_out: self.mod_bw_pre_order.append(fqn(mod)),
            post_fw_hook=lambda mod, inp, out: self.mod_fw_post_order.append(fqn(mod)),
            post_bw_hook=lambda mod, g_inp: self.mod_bw_post_order.append(fqn(mod)))
        tracker.__enter__()
        TorchDispatchMode.__enter__(self)
        return self

    def __exit__(self, *args: Any) -> None:  # torch's prints the total; the rest as torch's
        TorchDispatchMode.__exit__(self, *args)
        self._mod_tracker.clear_user_hooks()
        self._mod_tracker.__exit__()


class _TimedSACEstimator(SACEstimator):
    """torch's ``SACEstimator`` on real tensors, its ops timed by ``clock``; its ``__enter__`` without the
    ``FakeTensorMode`` it asserts (only handed to ``RuntimeEstimator``'s CUDA timers)."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__()
        self._estimate_runtime = _timer(clock)

    def __enter__(self) -> "_TimedSACEstimator":
        self._mod_tracker.register_user_hooks(pre_fw_hook=self._pre_fw_hook, post_fw_hook=self._post_fw_hook)
        self._mod_tracker.__enter__()
        self._saved_tensor_hook_ctx.__enter__()
        TorchDispatchMode.__enter__(self)
        return self

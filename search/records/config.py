"""SearchConfig: everything a search run needs, and the CLI generated from it.

Each field's docstring (the ``doc`` metadata) is its ``--help`` line, as in CleanRL's ``Args``.
A run folder keeps its config as ``config.json``; ``--config FILE`` reads one back, and
explicit flags override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, get_args, get_origin

from env.data.errors import CkptSearchError, WorkloadError
from env.data.plan import ACTION_NAMES
from env.data.types import RewardMode
from env.workloads.spec import MATMUL_PRECISIONS, PRECISIONS, fold_precision


def _f(default: Any, doc: str, **kw: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


def check_actions(actions: Sequence[str]) -> None:
    """Refuse, in one line, ``--actions`` naming an action that does not exist or lacking ``keep``."""
    unknown = [a for a in actions if a not in ACTION_NAMES]
    if unknown:
        raise CkptSearchError(f"--actions {unknown[0]} is not an action; choose from {', '.join(ACTION_NAMES)}")
    if "keep" not in actions:
        raise CkptSearchError(f"--actions {' '.join(actions)} lacks 'keep': the baseline every saving is "
                              "relative to; add keep")


@dataclass
class SearchConfig:
    workload: str = _f("gpt/small", "workload spec: gpt, cnn, lstm, mlp (presets: gpt/tiny, gpt/small; options: "
                                    "gpt?n_layer=12), or path/to/file.py:factory / package.module:factory. The "
                                    "default, a 6-block GPT at d=128, searches in minutes on 2 CPU cores")
    precision: str = _f("32", "the step's precision (Lightning's names): 32, bf16-mixed (autocast bf16, fp32 "
                              "weights), 16-mixed (autocast fp16, a gradient scaler), bf16-true (bf16 weights and "
                              "optimizer state); written into the workload spec", choices=PRECISIONS)
    matmul_precision: str = _f("highest", "torch.set_float32_matmul_precision: highest, or high (TF32 on CUDA); "
                                          "written into the workload spec", choices=MATMUL_PRECISIONS)
    units: list[str] = _f(["auto"], "decision units: auto (non-overlapping modules, each run once a step, holding "
                                    ">= 95%% of the bytes saved for backward, found from one instrumented step), "
                                    "blocks (the children of the largest ModuleList/Sequential), sub-blocks (their "
                                    "children), or module FQNs / globs (e.g. 'blocks.*')", nargs="+")
    max_units: int = _f(32, "most automatic units (the exact solver takes about 1 s at 32 units x 3 actions)")
    actions: list[str] = _f(["keep", "recompute", "selective", "chain", "chunked"], "actions searched per unit "
                            "(offload needs CUDA; selective saves matmul/conv/attention outputs and recomputes the "
                            "rest; light saves the normalizations' and softmaxes' outputs too and recomputes only the "
                            "cheapest ops, one more action to profile, so not in the default; chain recomputes a run of "
                            "units that chain as one region; chunked runs a loss unit's head and loss over chunks of "
                            "tokens, where the model has one)", nargs="+")
    agents: int = _f(4, "PPO agents, one per memory budget spread from the smallest reachable peak to the baseline")
    timesteps: int = _f(2048, "environment steps per agent (one step = one unit's decision)")
    reward: RewardMode = _f(RewardMode.HYBRID, "reward source: measured (every new plan measured), model (cost model "
                                               "only), hybrid (cost model corrected by measurements; every frontier "
                                               "point measured)", choices=tuple(m.value for m in RewardMode))
    peers: str = _f("eager", "peers measured beside the search by the same Evaluator: none; eager (HF models' own "
                             "checkpointing every 1-4 layers, checkpoint_sequential, torchtitan's op and layer SAC); all "
                             "(also torch.compile's memory budgets and PyTorch's auto-SAC, where PuLP is installed)",
                    choices=("none", "eager", "all"))
    peer_budgets: list[float] = _f([round(0.1 * i, 1) for i in range(11)], "budgets (fractions) of torch.compile's "
                                   "activation_memory_budget and auto-SAC with --peers all", nargs="+")
    compile: bool = _f(False, "measure compiled training steps (--compile-scope says what is compiled); compile "
                              "time is reported apart. The profile stays eager")
    compile_scope: str = _f("units", "with --compile: units (each unit's forward compiled once per action and reused "
                                     "by every plan, the plan's checkpoints around it, as when each block is compiled "
                                     "on its own; a plan costs about an eager measurement), model (the plan applied, "
                                     "then the whole model compiled for each plan, fullgraph: a compile per plan) or "
                                     "both (searched as units, then the frontier's plans, the rules and the exact "
                                     "plans measured with the whole model compiled too, a compile each; the frontier "
                                     "takes the faster way of each plan, and each point says which)",
                            choices=("units", "model", "both"))
    max_measurements: int = _f(0, "most plans measured in one run (model/hybrid modes), rules and baseline included "
                                  "(0: 20 and one more per two units, e.g. 44 at 48 units: a frontier of more units "
                                  "has more points to measure)")
    repeats: int = _f(3, "timed training steps per measurement (median reported; repeats add samples)")
    reference_every: float = _f(30.0, "seconds after which an Evaluator measures the all-keep plan again (at most "
                                      "once per 4 plans); plans are compared on their time relative to it, so a "
                                      "machine whose speed drifts during the search ranks them as if side by side "
                                      "(0: raw times; --compile-scope model: always raw, each reference would compile)")
    warm_start: bool = _f(True, "also measure the exact solver's frontier plans, and let the agents' teacher "
                                "demonstrate any measured plan, the rules' too (off: the frontier is the agents' "
                                "own plus the rules, whose plans are never demonstrated)")
    batch_scaling: bool = _f(True, "measure frontier plans at half the batch size too (the dashboard prices memory "
                                   "from two batch sizes); built-in workloads only")
    memory_cap: list[float] = _f([], "throughput search: memory caps in MB (MiB); for each, the (plan, micro-batch) "
                                     "of the highest measured samples/s whose measured peak fits (on CUDA the default "
                                     "is the device's memory less a reserve, search.engine.throughput.caps; on CPU "
                                     "give it)", nargs="+")
    micro_batches: list[int] = _f([], "throughput search: the micro-batches to search (default: 1, 2, 4, ... up to "
                                      "the largest the lowest-memory plan fits under the largest cap, found by "
                                      "measurement)", nargs="+")
    global_batch: int = _f(0, "throughput search: samples per optimizer step; answers say how many accumulation steps "
                              "(0: none)")
    batch_dim: int = _f(-1, "throughput search: the input dimension that holds the samples, for a factory without a "
                            "batch_size parameter (0: batch-first inputs, sliced or tiled; -1: none)")
    throughput: bool = _f(False, "search (plan, micro-batch) for throughput under memory caps (implied by "
                                 "--memory-cap, --micro-batches and --global-batch)")
    throughput_timesteps: int = _f(1024, "throughput search: PPO steps per ladder micro-batch of the agent "
                                         "conditioned on the micro-batch (0: the exact solver's plans only)")
    throughput_evaluators: int = _f(0, "throughput search on CPUs: Evaluators in place of --evaluators (0: one per "
                                       "--measure-threads cores, at most 4; never fewer than --evaluators)")
    out: str = _f("runs", "folder that holds run folders; each run gets <out>/<run-id>/")
    name: str = _f("", "run id (default: <workload>-<time>)")
    address: str = _f("", "address of an existing Ray cluster to join (default: start Ray locally)")
    resume: str = _f("", "run folder to resume: nothing measured there is measured again")
    config: str = _f("", "JSON config file (a run folder's config.json repeats that run); flags override it")
    seed: int = _f(0, "seed for workload weights, batch and agents")
    device: str = _f("auto", "device to measure on: auto (cuda if available), cpu, cuda, cuda:N")
    evaluators: int = _f(1, "CPU Evaluators measuring in parallel, spread over the cluster's nodes, each with "
                            "--measure-threads threads (CPU-only clusters; 1 on a 2-core machine keeps timings steady)")
    devices: int = _f(0, "GPU Evaluators: at most this many of the cluster's GPUs, one Evaluator each (0: every GPU)")
    overlap: str = _f("auto", "agents train while plans are measured: auto (when Evaluators use GPUs, so they share no "
                              "cores with training), on, off", choices=("auto", "on", "off"))
    measure_threads: int = _f(1, "CPU threads a measurement uses (0: all cores). One keeps step times steady when "
                                 "other processes share the cores (Ray, agents in measured mode), and times a step "
                                 "by the measuring thread's CPU time, which they cannot lengthen; GPUs ignore it")
    fsdp: int = _f(0, "measure under FSDP2 with this many ranks per Evaluator (0: one device, no FSDP): each "
                      "Evaluator is a process group of N Ray actors on one node (gloo on CPU, NCCL on GPU, one GPU per "
                      "rank), the workload sharded with fully_shard on the units and the root after the plan is "
                      "applied; peaks and times are per rank (the largest rank's peak, the slowest rank's time). Chain "
                      "is not searched under FSDP: fully_shard gathers a unit's parameters only when it is called")
    step_timeout: float = _f(300.0, "seconds one training step may take before the search ends in one line naming "
                                    "where it waits (factory and first step: twice that; once a step is measured, "
                                    "20 times it, at least 30 s and at most this, per step of each call; an agent's "
                                    "round: it plus 0.25 s per PPO step; search/engine/deadlines.py)")
    chunk_timesteps: int = _f(1024, "agent steps between two rounds of measurement and progress reports")
    progress: bool = _f(True, "show the live terminal view")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @property
    def throughput_mode(self) -> bool:
        """Whether the run searches (plan, micro-batch) for throughput under memory caps."""
        return bool(self.throughput or self.memory_cap or self.micro_batches or self.global_batch)

    @property
    def measure_scope(self) -> str:
        """The ``env.measure.compiled.CompileOptions.scope`` the search measures in (``both`` searches as units)."""
        return "model" if self.compile_scope == "model" else "units"

    @property
    def whole_model_pass(self) -> bool:
        """Whether the frontier's plans are measured with the whole model compiled after the search (``both``)."""
        return self.compile and self.compile_scope == "both"

    @property
    def compiles_per_plan(self) -> bool:
        """Whether every plan measured compiles the model afresh (no reference plan is measured again then)."""
        return self.compile and self.compile_scope == "model"

    def measurement_budget(self, n_units: int) -> int:
        """``max_measurements``, or with 0 the default for a search of ``n_units``."""
        return self.max_measurements or 20 + n_units // 2

    def validate(self) -> "SearchConfig":
        try:
            self.reward = RewardMode(self.reward)
        except ValueError:
            raise CkptSearchError(f"--reward {self.reward!r} is not a reward mode; choose one of "
                                  f"{', '.join(m.value for m in RewardMode)}") from None
        try:
            self.workload, self.precision, self.matmul_precision = fold_precision(self.workload, self.precision,
                                                                                  self.matmul_precision)
        except WorkloadError as e:
            raise CkptSearchError(f"--workload {self.workload}: {e}") from None
        check_actions(self.actions)
        bad = [b for b in self.peer_budgets if not 0.0 <= b <= 1.0]
        if bad:
            raise CkptSearchError(f"--peer-budgets {bad[0]} is outside 0.0-1.0; give activation_memory_budget values "
                                  "between 0.0 (recompute all it can) and 1.0 (save all)")
        if self.devices < 0:
            raise CkptSearchError(f"--devices must be 0 (every GPU) or more, got {self.devices}")
        if self.reference_every < 0:
            raise CkptSearchError(f"--reference-every must be 0 (raw times) or more seconds, got {self.reference_every}")
        if self.fsdp < 0:
            raise CkptSearchError(f"--fsdp must be 0 (one device, no FSDP) or a number of ranks, got {self.fsdp}")
        if self.fsdp and "chain" in self.actions:  # a region runs its units' forwards without FSDP's hooks
            self.actions = [a for a in self.actions if a != "chain"]
        if self.fsdp and self.compile:
            raise CkptSearchError("--compile with --fsdp: compiled FSDP2 steps are not measured; drop --compile to "
                                  "measure under FSDP, or --fsdp to measure compiled steps")
        if not (math.isfinite(self.step_timeout) and self.step_timeout > 0):
            raise CkptSearchError(f"--step-timeout must be a positive number of seconds, got {self.step_timeout}")
        if self.max_measurements < 0:
            raise CkptSearchError(f"--max-measurements must be 0 (sized by the units) or more, got {self.max_measurements}")
        _validate_throughput(self)
        for name in ("agents", "timesteps", "repeats", "chunk_timesteps", "evaluators", "max_units"):
            if getattr(self, name) < 1:
                raise CkptSearchError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        return self


def _validate_throughput(cfg: SearchConfig) -> None:
    """The throughput search's flags, checked (``SearchConfig.validate``)."""
    bad = [c for c in cfg.memory_cap if not (math.isfinite(c) and c > 0)]
    if bad:
        raise CkptSearchError(f"--memory-cap {bad[0]} is not a positive number of MiB; give the memory one "
                              "training step may use, e.g. --memory-cap 60 120")
    if any(b < 1 for b in cfg.micro_batches):
        given = " ".join(map(str, cfg.micro_batches))
        raise CkptSearchError(f"--micro-batches {given}: every micro-batch must be at least 1 sample")
    if min(cfg.global_batch, cfg.batch_dim + 1, cfg.throughput_timesteps, cfg.throughput_evaluators) < 0:
        raise CkptSearchError(f"--global-batch {cfg.global_batch}, --batch-dim {cfg.batch_dim}, "
                              f"--throughput-timesteps {cfg.throughput_timesteps}, --throughput-evaluators "
                              f"{cfg.throughput_evaluators}: give 0 or more (--batch-dim: -1 for none)")
    if cfg.throughput_mode and cfg.fsdp:
        raise CkptSearchError("--fsdp with a throughput search (--memory-cap, --micro-batches, --throughput): "
                              "micro-batches are not measured under FSDP; run the two searches separately")
    if cfg.throughput_mode and not cfg.memory_cap and cfg.device == "cpu":
        raise CkptSearchError("a throughput search on CPU needs --memory-cap MB (the memory one training step may "
                              "use, e.g. --memory-cap 60 120); on CUDA it defaults to the device's memory")


def measured_scope(config: dict[str, Any] | None) -> str | None:
    """How a stored run (its config as a dict: ``config.json``, store meta ``config``) compiled the plans it
    measured: None (eager steps), ``units`` or ``model`` (``SearchConfig.measure_scope``)."""
    if not config or not config.get("compile"):
        return None
    return "model" if config.get("compile_scope") == "model" else "units"


def _arg_type(f: dataclasses.Field) -> Any:
    t = f.type if not isinstance(f.type, str) else eval(f.type, {"list": list, "float": float, "RewardMode": RewardMode})
    t = get_args(t)[0] if get_origin(t) is list else t
    return str if isinstance(t, type) and issubclass(t, RewardMode) else t  # choices check; validate() converts


EXIT_CODES = ("exit codes: 0 finished (or a finished run resumed: nothing to do); 2 bad input or a refusal (one "
              "line on stderr); 3 the model failed (its own error in one line, or a step past its --step-timeout deadline; "
              "the run's status is 'failed: <cause>'); "
              "130 Ctrl-C and 143 SIGTERM (the measurements are drained into the store and the frontier and report "
              "written from them; continue with --resume RUN)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m search.run",
        description="Search activation-checkpointing plans against measured peak memory and step time. "
                    "The last line printed is the run folder.",
        epilog=EXIT_CODES,
    )
    for f in dataclasses.fields(SearchConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = _arg_type(f)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = " ".join(map(str, default)) if isinstance(default, list) else default
        kw: dict[str, Any] = {"help": f"{f.metadata['doc']} (default: {shown!s})" if shown not in ("", []) else f.metadata["doc"],
                              "default": argparse.SUPPRESS}
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = kind
            for k in ("nargs", "choices"):
                if k in f.metadata:
                    kw[k] = f.metadata[k]
        p.add_argument(flag, **kw)
    return p


def given_flags(argv: Sequence[str] | None = None) -> set[str]:
    """The config fields the command line sets (a ``--resume`` honours some of them)."""
    return set(vars(build_parser().parse_args(argv)))


def parse_config(argv: Sequence[str] | None = None) -> SearchConfig:
    """Flags over ``--config FILE`` over defaults."""
    given = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    if given.get("config"):
        path = Path(given["config"])
        try:
            values = json.loads(path.read_text())
        except FileNotFoundError:
            raise CkptSearchError(f"config file '{path}' does not exist; give a run folder's config.json") from None
        except json.JSONDecodeError as e:
            raise CkptSearchError(f"config file '{path}' is not JSON ({e.msg}, line {e.lineno}); fix or regenerate it") from None
        known = {f.name for f in dataclasses.fields(SearchConfig)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise CkptSearchError(f"config file '{path}' has unknown keys {unknown}; valid keys: {sorted(known)}")
    values.update(given)
    return SearchConfig(**values).validate()

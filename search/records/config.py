"""SearchConfig: everything a search run needs. The CLI, ``config.json``, ``--config FILE``, ``--resume`` and
the dashboard's New search form all read this one dataclass.

Each field's docstring is its ``--help`` line, as in CleanRL's ``Args``, and ``tyro.cli`` reads the dataclass
into the command line: a flag per field (``--memory-cap`` for ``memory_cap``), its type, its choices (a
``Literal``) and ``--x/--no-x`` for a switch. A run folder keeps its config as ``config.json``; ``--config FILE``
reads one back through the same parser (its keys as flags, so a bad value in the file is refused as the flag
would be), and explicit flags override it. Every bad value is one line (``CkptSearchError``) naming it and the
fix: a malformed one from the parser, the rest from ``SearchConfig.validate`` (the bounds of ``AT_LEAST`` and
the rules between flags).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence, get_type_hints

import tyro

from env.data.errors import CkptSearchError, WorkloadError
from env.data.plan import ACTION_NAMES
from env.data.types import RewardMode
from env.workloads.spec import MATMUL_PRECISIONS, PRECISIONS, fold_precision


def check_actions(actions: Sequence[str]) -> None:
    """Refuse, in one line, ``--actions`` naming an action that does not exist or lacking ``keep``."""
    unknown = [a for a in actions if a not in ACTION_NAMES]
    if unknown:
        raise CkptSearchError(f"--actions {unknown[0]} is not an action; choose from {', '.join(ACTION_NAMES)}")
    if "keep" not in actions:
        raise CkptSearchError(f"--actions {' '.join(actions)} lacks 'keep': the baseline every saving is "
                              "relative to; add keep")


def _help_from_docstrings(cls: type) -> type:
    """Each field's docstring as its ``--help`` text, in one paragraph (tyro would keep the docstring's line breaks):
    the field's type annotated with ``tyro.conf.arg(help=...)``."""
    hints = get_type_hints(cls)
    for name, doc in _field_docs(cls).items():
        cls.__annotations__[name] = Annotated[hints[name], tyro.conf.arg(help=doc)]
    return cls


def _field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string right after it), its lines joined into one."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    return {a.target.id: " ".join(b.value.value.split()) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}


@_help_from_docstrings
@dataclass
class SearchConfig:
    workload: str = "gpt/small"
    """workload spec: gpt, cnn, lstm, mlp (presets: gpt/tiny, gpt/small; options: gpt?n_layer=12), or
    path/to/file.py:factory / package.module:factory. The default, a 6-block GPT at d=128, searches in minutes on 2
    CPU cores"""
    precision: Literal[PRECISIONS] = "32"
    """the step's precision (Lightning's names): 32, bf16-mixed (autocast bf16, fp32 weights), 16-mixed (autocast fp16,
    a gradient scaler), bf16-true (bf16 weights and optimizer state); written into the workload spec"""
    matmul_precision: Literal[MATMUL_PRECISIONS] = "highest"
    """torch.set_float32_matmul_precision: highest, or high (TF32 on CUDA); written into the workload spec"""
    units: list[str] = field(default_factory=lambda: ["auto"])
    """decision units: auto (non-overlapping modules, each run once a step, holding >= 95% of the bytes saved for
    backward, found from one instrumented step), blocks (the children of the largest ModuleList/Sequential),
    sub-blocks (their children), or module FQNs / globs (e.g. 'blocks.*')"""
    max_units: int = 32
    """most automatic units (the exact solver takes about 1 s at 32 units x 3 actions)"""
    actions: list[str] = field(default_factory=lambda: ["keep", "recompute", "selective", "chain", "chunked", "block"])
    """actions searched per unit (offload needs CUDA; selective saves matmul/conv/attention outputs and recomputes the
    rest; light saves the normalizations' and softmaxes' outputs too and recomputes only the cheapest ops, one more
    action to profile, so not in the default; chain recomputes a run of units that chain as one region; chunked runs a
    loss unit's head and loss over chunks of tokens, where the model has one; block recomputes a parent module whose
    units are all block, as one region, where units are a parent's: --units sub-blocks)"""
    agents: int = 4
    """PPO agents, one per memory budget spread from the smallest reachable peak to the baseline"""
    timesteps: int = 2048
    """environment steps per agent (one step = one unit's decision)"""
    reward: RewardMode = RewardMode.HYBRID
    """reward source: measured (every new plan measured), model (cost model only), hybrid (cost model corrected by
    measurements; every frontier point measured)"""
    peers: Literal["none", "eager", "all"] = "eager"
    """peers measured beside the search by the same Evaluator: none; eager (every peer that runs the model's own eager
    step, as applies to the model); all (also those that compile the step or solve an ILP, where their libraries are
    installed). Each peer kind's group is its entry in env/measure/peers.py: KINDS; the report lists those measured"""
    peer_budgets: list[float] = field(default_factory=lambda: [round(0.1 * i, 1) for i in range(11)])
    """budgets (fractions) of torch.compile's activation_memory_budget and auto-SAC with --peers all"""
    compile: bool = False
    """measure compiled training steps (--compile-scope says what is compiled); compile time is reported apart. The
    profile stays eager"""
    compile_scope: Literal["units", "model", "both"] = "units"
    """with --compile: units (each unit's forward compiled once per action and reused by every plan, the plan's
    checkpoints around it, as when each block is compiled on its own; a plan costs about an eager measurement), model
    (the plan applied, then the whole model compiled for each plan, fullgraph: a compile per plan) or both (searched
    as units, then the frontier's plans, the rules and the exact plans measured with the whole model compiled too, a
    compile each; the frontier takes the faster way of each plan, and each point says which)"""
    max_measurements: int = 0
    """most plans measured in one run (model/hybrid modes), rules and baseline included (0: 20 and one more per two
    units, e.g. 44 at 48 units: a frontier of more units has more points to measure)"""
    repeats: int = 3
    """timed training steps per measurement (median reported; repeats add samples)"""
    reference_every: float = 30.0
    """seconds after which an Evaluator measures the all-keep plan again (at most once per 4 plans); plans are compared
    on their time relative to it, so a machine whose speed drifts during the search ranks them as if side by side (0:
    raw times; --compile-scope model: always raw, each reference would compile)"""
    warm_start: bool = True
    """also measure the exact solver's frontier plans, and let the agents' teacher demonstrate any measured plan, the
    rules' too (off: the frontier is the agents' own plus the rules, whose plans are never demonstrated)"""
    batch_scaling: bool = True
    """measure frontier plans at half the batch size too (the dashboard prices memory from two batch sizes); built-in
    workloads only"""
    memory_cap: list[float] = field(default_factory=list)
    """throughput search: memory caps in MB (MiB); for each, the (plan, micro-batch) of the highest measured samples/s
    whose measured peak fits (on CUDA the default is the device's memory less a reserve,
    search.engine.throughput.caps; on CPU give it)"""
    micro_batches: list[int] = field(default_factory=list)
    """throughput search: the micro-batches to search (default: 1, 2, 4, ... up to the largest the lowest-memory plan
    fits under the largest cap, found by measurement)"""
    global_batch: int = 0
    """throughput search: samples per optimizer step; answers say how many accumulation steps (0: none)"""
    batch_dim: int = -1
    """throughput search: the input dimension that holds the samples, for a factory without a batch_size parameter (0:
    batch-first inputs, sliced or tiled; -1: none)"""
    throughput: bool = False
    """search (plan, micro-batch) for throughput under memory caps (implied by --memory-cap, --micro-batches and
    --global-batch)"""
    throughput_timesteps: int = 1024
    """throughput search: PPO steps per ladder micro-batch of the agent conditioned on the micro-batch (0: the exact
    solver's plans only)"""
    throughput_evaluators: int = 0
    """throughput search on CPUs: Evaluators in place of --evaluators (0: one per --measure-threads cores, at most 4;
    never fewer than --evaluators)"""
    out: str = "runs"
    """folder that holds run folders; each run gets <out>/<run-id>/"""
    name: str = ""
    """run id (default: <workload>-<time>)"""
    address: str = ""
    """address of an existing Ray cluster to join (default: start Ray locally)"""
    resume: str = ""
    """run folder to resume: nothing measured there is measured again"""
    config: str = ""
    """JSON config file (a run folder's config.json repeats that run); flags override it"""
    seed: int = 0
    """seed for workload weights, batch and agents"""
    device: str = "auto"
    """device to measure on: auto (cuda if available), cpu, cuda, cuda:N"""
    evaluators: int = 0
    """CPU Evaluators measuring in parallel, spread over the cluster's nodes, each with --measure-threads threads
    (CPU-only clusters; 0: one per --measure-threads cores, at most 2, and one with --compile; the agents train
    while they wait)"""
    devices: int = 0
    """GPU Evaluators: at most this many of the cluster's GPUs, one Evaluator each (0: every GPU)"""
    overlap: Literal["auto", "on", "off"] = "auto"
    """agents train while plans are measured: auto (when Evaluators use GPUs, so they share no cores with training), on,
    off"""
    measure_threads: int = 1
    """CPU threads a measurement uses (0: all cores). One keeps step times steady when other processes share the cores
    (Ray, agents in measured mode), and times a step by the measuring thread's CPU time, which they cannot lengthen;
    GPUs ignore it"""
    fsdp: int = 0
    """measure under FSDP2 with this many ranks per Evaluator (0: one device, no FSDP): each Evaluator is a process
    group of N Ray actors on one node (gloo on CPU, NCCL on GPU, one GPU per rank), the workload sharded with
    fully_shard on the units and the root after the plan is applied; peaks and times are per rank (the largest rank's
    peak, the slowest rank's time). Chain is not searched under FSDP: fully_shard gathers a unit's parameters only
    when it is called"""
    step_timeout: float = 300.0
    """seconds one training step may take before the search ends in one line naming where it waits (factory and first
    step: twice that; once a step is measured, 20 times it, at least 30 s and at most this, per step of each call; an
    agent's round: it plus 0.25 s per PPO step; search/engine/deadlines.py)"""
    chunk_timesteps: int = 1024
    """agent steps between two rounds of measurement and progress reports"""
    progress: bool = True
    """show the live terminal view"""

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
        """This config, its values checked (one line for the first bad one) and normalised: ``reward`` a
        ``RewardMode``, the precisions folded into the workload spec, ``chain`` dropped under FSDP."""
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
        _check_values(self)
        if self.fsdp:  # a chain region runs its units' forwards without FSDP's hooks; a block is not measured sharded
            self.actions = [a for a in self.actions if a not in ("chain", "block")]
        _check_combinations(self)
        return self


# The least value of each numeric flag, and what that value means where it is not the plain least count.
AT_LEAST: dict[str, tuple[int, str]] = {
    "agents": (1, ""), "timesteps": (1, ""), "repeats": (1, ""), "chunk_timesteps": (1, ""),
    "evaluators": (0, "one per --measure-threads cores, at most 2"),
    "max_units": (1, ""), "devices": (0, "every GPU"), "fsdp": (0, "one device, no FSDP"),
    "max_measurements": (0, "sized by the units"), "reference_every": (0, "raw times"), "global_batch": (0, "none"),
    "batch_dim": (-1, "none"), "throughput_timesteps": (0, "the exact solver's plans only"),
    "throughput_evaluators": (0, "one per --measure-threads cores"), "measure_threads": (0, "all cores"),
}


def _check_values(cfg: SearchConfig) -> None:
    """Each field on its own: the bounds of ``AT_LEAST``, and the lists' members."""
    for name, (least, means) in AT_LEAST.items():
        value = getattr(cfg, name)
        if value < least:
            flag = "--" + name.replace("_", "-")
            bound = f"at least {least}" if not means else f"{least} ({means}) or more"
            raise CkptSearchError(f"{flag} must be {bound}{' seconds' if name == 'reference_every' else ''}, "
                                  f"got {value}")
    if not cfg.units:
        raise CkptSearchError("--units needs at least one: auto, blocks, sub-blocks, or module FQNs / globs")
    check_actions(cfg.actions)
    bad = [b for b in cfg.peer_budgets if not 0.0 <= b <= 1.0]
    if bad:
        raise CkptSearchError(f"--peer-budgets {bad[0]} is outside 0.0-1.0; give activation_memory_budget values "
                              "between 0.0 (recompute all it can) and 1.0 (save all)")
    if not (math.isfinite(cfg.step_timeout) and cfg.step_timeout > 0):
        raise CkptSearchError(f"--step-timeout must be a positive number of seconds, got {cfg.step_timeout}")
    bad = [c for c in cfg.memory_cap if not (math.isfinite(c) and c > 0)]
    if bad:
        raise CkptSearchError(f"--memory-cap {bad[0]} is not a positive number of MiB; give the memory one "
                              "training step may use, e.g. --memory-cap 60 120")
    if any(b < 1 for b in cfg.micro_batches):
        given = " ".join(map(str, cfg.micro_batches))
        raise CkptSearchError(f"--micro-batches {given}: every micro-batch must be at least 1 sample")


def _check_combinations(cfg: SearchConfig) -> None:
    """The flags that cannot go together."""
    if cfg.fsdp and cfg.compile:
        raise CkptSearchError("--compile with --fsdp: compiled FSDP2 steps are not measured; drop --compile to "
                              "measure under FSDP, or --fsdp to measure compiled steps")
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


PROG = "python -m search.run"
EXIT_CODES = ("exit codes: 0 finished (or a finished run resumed: nothing to do); 2 bad input or a refusal (one "
              "line on stderr); 3 the model failed (its own error in one line, or a step past its --step-timeout "
              "deadline; the run's status is 'failed: <cause>'); 130 Ctrl-C and 143 SIGTERM (the measurements are "
              "drained into the store and the frontier and report written from them; continue with --resume RUN)")
DESCRIPTION = ("Search activation-checkpointing plans against measured peak memory and step time. The last line "
               "printed is the run folder. " + EXIT_CODES)
FIELDS = tuple(f.name for f in dataclasses.fields(SearchConfig))


def parse_config(argv: Sequence[str] | None = None) -> SearchConfig:
    """Flags (``argv``, or the process's own) over ``--config FILE`` over defaults, checked
    (``SearchConfig.validate``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg = _parse(argv)
    if cfg.config:
        from_file = flags(_read_config(Path(cfg.config)))
        _parse(from_file, f"config file '{cfg.config}': ")  # its own bad values, named as the file's
        cfg = _parse(from_file + argv)  # a flag given twice: the last one holds
    return cfg.validate()


def given_flags(argv: Sequence[str] | None = None) -> set[str]:
    """The config fields the command line sets (a ``--resume`` honours some of them)."""
    given = set()
    for token in sys.argv[1:] if argv is None else argv:
        name = token.partition("=")[0][2:].replace("-", "_") if token.startswith("--") else ""
        name = name[3:] if name.startswith("no_") and name[3:] in FIELDS else name
        if name in FIELDS:
            given.add(name)
    return given


def flags(values: dict[str, Any]) -> list[str]:
    """The command-line flags that set ``values`` (field name -> value), in the order given."""
    out: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(_token, value)]
        else:
            out += [flag, _token(value)]
    return out


def changed_flags(cfg: SearchConfig) -> list[str]:
    """The flags that give ``cfg`` from the defaults: those of the fields it changes, in the fields' order."""
    default = SearchConfig()
    return flags({k: getattr(cfg, k) for k in FIELDS if getattr(cfg, k) != getattr(default, k)})


def field_doc(name: str) -> str:
    """A field's docstring: its ``--help`` line (the dashboard's form shows it beside the flag's widget)."""
    return _field_docs(SearchConfig)[name]


def _token(value: Any) -> str:
    """A value as a flag's argument: a float in its shortest form that reads back as the same float."""
    if isinstance(value, float) and float(f"{value:g}") == value:
        return f"{value:g}"
    return str(value)


def _parse(args: list[str], where: str = "") -> SearchConfig:
    """``tyro.cli`` on ``args``; a value it refuses is one line (its own box, folded), ``--help`` prints and exits."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return tyro.cli(SearchConfig, args=args, prog=PROG, description=DESCRIPTION,
                            config=(tyro.conf.EnumChoicesFromValues,))
    except SystemExit as e:
        if not e.code:
            raise
        raise CkptSearchError(f"{where}{_problem(err.getvalue())}; see {PROG} --help for each flag's values") from None


def _problem(box: str) -> str:
    """The problem tyro's error box states, on one line: its text after the title, up to the first rule (the
    flag's help and the pointer to --help follow it)."""
    lines = [line.strip(" \u2502\u256d\u256e\u2570\u256f") for line in box.strip().splitlines()[1:]]
    is_rule = [bool(line) and set(line) <= set("-\u2500") for line in lines]
    start = next((i for i, rule in enumerate(is_rule) if not rule), len(lines))
    end = next((i for i in range(start, len(lines)) if is_rule[i]), len(lines))
    return " ".join(" ".join(lines[start:end]).split()).rstrip(".") or "the command line was refused"


def _read_config(path: Path) -> dict[str, Any]:
    """A config file's values (a run folder's ``config.json``), its keys checked against the fields."""
    try:
        values = json.loads(path.read_text())
    except FileNotFoundError:
        raise CkptSearchError(f"config file '{path}' does not exist; give a run folder's config.json") from None
    except json.JSONDecodeError as e:
        raise CkptSearchError(f"config file '{path}' is not JSON ({e.msg}, line {e.lineno}); fix or regenerate it") from None
    if not isinstance(values, dict):
        raise CkptSearchError(f"config file '{path}' holds no JSON object of flags; give a run folder's config.json")
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise CkptSearchError(f"config file '{path}' has unknown keys {unknown}; valid keys: {sorted(FIELDS)}")
    return values

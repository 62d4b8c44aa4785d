"""Plans under FSDP2: two gloo ranks on this CPU, real ``fully_shard``, real Ray groups.

The rank-level checks run in two processes started once for the module (``torch.multiprocessing``):
gradients of planned and unplanned sharded models, the plan installed before and after sharding, and
per-rank peaks and profiles. The search-level checks run ``bench/fsdp.py --quick``, whose two-rank search
(``python -m search.run --fsdp 2``) has a rank killed mid-run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from env.data.errors import CkptSearchError, MeasurementError, PlanError
from env.data.measured import MeasuredPlan
from env.data.ranks import binding_profile, merge_ranks, rank_clock, split_rank_clock
from search.records import meta
from search.records.store import RunStore
from tests.fsdp_ranks import GRAD_CASES, STEP_SEED, UNIFORM, rank_checks
from tests.profiles import synthetic_profile

ROOT = Path(__file__).resolve().parent.parent


def _record(peak: int, samples: list[float], live: int = 100, oom: bool = False, digest: str = "d") -> MeasuredPlan:
    return MeasuredPlan(workload="gpt/tiny", batch_shape="idx:2x16", digest=digest, actions=["keep"], sources=["s"],
                        peak_bytes=peak, live_before_bytes=live, step_seconds_samples=samples, clock="thread-cpu",
                        device="cpu (1 threads)", torch_version="t", oom=oom, measurement_ids=["g-1:1"])


# -- records of ranks (torch-free) -------------------------------------------------------------------------------
def test_a_group_measurement_is_the_largest_ranks_peak_and_the_slowest_ranks_steps():
    m = merge_ranks([_record(900, [0.10, 0.30, 0.20], live=40), _record(1000, [0.20, 0.10, 0.25], live=50)])
    assert (m.peak_bytes, m.live_before_bytes) == (1000, 50)
    assert m.step_seconds_samples == [0.20, 0.30, 0.25] and m.step_seconds == 0.25
    assert m.clock == "thread-cpu, slowest of 2 ranks" and m.device == "cpu (1 threads), FSDP2 x2 ranks"
    assert split_rank_clock(m.clock) == ("thread-cpu", 2) and split_rank_clock("wall") == ("wall", None)
    assert merge_ranks([_record(5, [0.1]), _record(7, [], oom=True)]).oom  # one rank out of memory: the plan is
    with pytest.raises(MeasurementError, match="ranks measured different things"):
        merge_ranks([_record(1, [0.1]), _record(1, [0.1], digest="other")])


def test_the_search_prices_plans_with_the_rank_whose_baseline_peak_is_largest():
    profiles = []
    for peak in (700, 900, 800):
        p = synthetic_profile(3, 3, seed=peak)
        profiles.append(p.model_copy(update={"baseline": _record(peak, [0.1 * peak / 700])}))
    rank, prof = binding_profile(profiles)
    assert rank == 1 and prof.costs == profiles[1].costs
    assert prof.baseline.peak_bytes == 900 and prof.baseline.clock == rank_clock("thread-cpu", 3)
    assert prof.baseline.step_seconds_samples == [pytest.approx(0.1 * 900 / 700)]


def test_fsdp_where_it_cannot_run_is_one_line():
    from search.engine.fsdp.group import group_count

    two_cores = [{"Alive": True, "NodeID": "a", "Resources": {"CPU": 2.0}}]
    assert group_count(2, "cpu", 0, 1, 1, two_cores) == (1, False)
    for args, words in [((3, "cpu", 0, 1, 1, two_cores), "--fsdp 3 needs 3 CPU cores on one node"),
                        ((2, "cpu", 0, 1, 2, two_cores), "needs 4 CPU cores"),
                        ((2, "cuda", 0, 1, 1, [{"Alive": True, "NodeID": "a", "Resources": {"CPU": 8, "GPU": 1}}]),
                         "needs 2 GPUs on one node")]:
        with pytest.raises(CkptSearchError) as e:
            group_count(*args)
        assert words in str(e.value) and "\n" not in str(e.value) and "--fsdp" in str(e.value)
    gpus = [{"Alive": True, "NodeID": n, "Resources": {"GPU": g}} for n, g in (("a", 4), ("b", 3), ("c", 1))]
    assert group_count(2, "auto", 0, 1, 1, gpus) == (3, True)  # two groups on a, one on b
    assert group_count(2, "auto", 4, 1, 1, gpus) == (2, True)  # --devices 4: four GPUs, two groups


def test_fsdp_with_compile_or_a_negative_count_is_refused_in_one_line():
    from search.records.config import parse_config

    for argv, words in [(["--fsdp", "2", "--compile"], "--compile with --fsdp"), (["--fsdp", "-1"], "--fsdp must be")]:
        with pytest.raises(CkptSearchError) as e:
            parse_config(argv)
        assert words in str(e.value) and "\n" not in str(e.value)
    assert parse_config([]).fsdp == 0


# -- two ranks in this machine -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    import torch.multiprocessing as mp

    from env.measure.fsdp import free_port

    out = str(tmp_path_factory.mktemp("ranks") / "rank")
    mp.spawn(rank_checks, args=(2, free_port(), out), nprocs=2)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]


def _one_device_step(seed: int = STEP_SEED) -> tuple[torch.Tensor, dict]:
    from env.measure.timeline import train_step
    from env.workloads.workload import load_workload

    w = load_workload("gpt/tiny", seed=0)
    torch.manual_seed(0)
    train_step(w, w.optimizer)  # the step shard_workload takes: the same weights after it
    w.model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = w.loss()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in w.model.named_parameters()}


@pytest.mark.slow
def test_a_plan_under_fsdp2_gives_the_unplanned_gradients_applied_before_or_after_sharding(two_ranks):
    """Every rank steps on the same batch, so the averaged gradients are one device's; dropout is on, and another
    seed gives another loss, so the replayed masks are what makes them equal."""
    ref_loss, ref_grads = _one_device_step()
    assert not torch.equal(_one_device_step(STEP_SEED + 1)[0], ref_loss)
    for rank in two_ranks:
        assert all(before == after for before, after in rank["fingerprints"])  # a plan fits either
        for case in GRAD_CASES:
            loss, grads = rank["grads"][case]
            assert torch.equal(loss, ref_loss), case
            assert grads.keys() == ref_grads.keys()
            for name, g in grads.items():
                assert torch.allclose(g, ref_grads[name], rtol=1e-5, atol=1e-7), f"{case}: grad of {name}"


@pytest.mark.slow
def test_a_chained_plan_under_fsdp2_is_refused_in_one_line_applied_before_or_after_sharding(two_ranks):
    for rank in two_ranks:
        for line in rank["chain_refusals"]:
            assert "sharded with FSDP2" in line and "recompute these units one by one" in line and "\n" not in line


@pytest.mark.slow
def test_the_gate_under_fsdp2_passes_sound_plans_and_names_a_broken_unit_alike_on_every_rank(two_ranks):
    """Each rank checks on its shard, with the gradients gathered whole and the error agreed: the same verdicts."""
    first, second = (rank["gate"] for rank in two_ranks)
    assert first == second
    for case, check in first.items():
        if "numpy_noise" in case:
            assert not check["passed"] and check["culprits"] == ["blocks.1"], check
            assert any("numpy" in cause for cause in check["causes"]), check
        else:
            assert check["passed"] and check["error"] <= check["tolerance"], (case, check)


@pytest.mark.slow
def test_a_group_measures_a_plan_at_another_micro_batch_on_every_rank_and_refuses_a_peer(ray_session) -> None:
    """The price page's batch scaling asks a group as it asks an Evaluator (``measure_at``): the plan on every rank
    at that batch size, merged (the slowest rank's steps); a peer, which FSDP never measures, is one line."""
    from env.measure.peers import checkpoint_sequential_peer
    from search.engine import ray_session as rs
    from search.engine.evaluator_pool import EvaluatorPool
    from search.records.config import SearchConfig

    cfg = SearchConfig(workload="gpt/tiny", actions=["keep", "recompute"], repeats=1, device="cpu",
                       fsdp=2).validate()
    pool = EvaluatorPool(cfg)
    keep = ["keep"] * len(pool.units)
    got = rs.get(pool.first.measure_at.remote(keep, 1, source="batch-scaling"))
    m = got["record"]
    assert got["micro_batch"] == 1 and not m.oom and m.step_seconds_samples and m.sources == ["batch-scaling"]
    assert m.clock == "thread-cpu, slowest of 2 ranks" and m.batch_shape == "0:1x16,1:1x16"  # both ranks' inputs
    assert len(m.measurement_ids) == 1 and m.workload == "gpt/tiny?batch_size=1"
    with pytest.raises(CkptSearchError) as e:
        rs.get(pool.first.measure_at.remote(checkpoint_sequential_peer(2, "blocks"), 1))
    assert "no peer is measured under FSDP" in str(e.value) and "\n" not in str(e.value)


def test_a_search_under_fsdp_does_not_search_chain():
    from search.records.config import parse_config

    assert "chain" in parse_config([]).actions and "chain" not in parse_config(["--fsdp", "2"]).actions


@pytest.mark.slow
def test_per_rank_peaks_repeat_lie_below_one_device_and_the_profile_holds_on_each_rank(two_ranks):
    from env.cost.cost_model import CostModel
    from env.data.model_profile import ModelProfile
    from env.measure.measurement import measure
    from env.runtime.apply import plan_for
    from env.units.find import find_units
    from env.workloads.workload import load_workload

    w = load_workload("gpt/tiny", seed=0)
    units = find_units(w.model)
    one = {a: measure(w, plan_for(w.model, units, [a] * len(units)), units, repeats=1).peak_bytes for a in UNIFORM}
    for rank in two_ranks:
        for a in UNIFORM:
            first, again = rank["peaks"][a]
            assert first == again, f"{a}: a rank's peak is the same every time"
            assert first < one[a], f"{a}: a rank holds a shard, one device the whole model"
        prof = ModelProfile.model_validate(rank["profile"])
        cm = CostModel(prof)
        for a in UNIFORM:
            predicted = cm.predict([cm.action_index(a)] * len(units)).peak_bytes
            assert abs(predicted - rank["peaks"][a][0]) <= 0.05 * rank["peaks"][a][0], a
    assert two_ranks[0]["peaks"]["recompute"][0] < two_ranks[0]["peaks"]["keep"][0]


def test_applying_a_plan_to_a_sharded_model_needs_the_plan_of_that_model():
    """The fingerprint sees through fully_shard's class, not past another model: refused in one line."""
    from env.data.plan import Plan

    from search.training.apply import apply_plan
    from env.workloads.workload import load_workload

    w = load_workload("gpt/tiny", seed=0)
    with pytest.raises(PlanError) as e:
        apply_plan(w.model, Plan(fingerprint="0" * 16, actions={"blocks.0": "recompute"}))
    assert "another model" in str(e.value) and "\n" not in str(e.value)


# -- the search ----------------------------------------------------------------------------------------------------
def _run(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "search.run", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _every_measurement_once(store_path: Path) -> list[MeasuredPlan]:
    with RunStore(store_path, readonly=True) as s:
        records = s.measured()
    ids = [i for m in records for i in m.measurement_ids]
    assert len(ids) == len(set(ids)), "a measurement was recorded twice"
    return records


@dataclass
class KilledRun:
    run: Path
    first: dict  # the group as it started (EvaluatorInfo)
    bench: Path  # bench/fsdp.py's result file


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> KilledRun:
    """``bench/fsdp.py --quick`` (a one-device search of gpt/tiny, then a two-rank one), whose rank 1 is killed
    once the two-rank search has measured three plans: the bench, the search end to end and the group's restart,
    from one run (each costs minutes on two cores)."""
    out = tmp_path_factory.mktemp("fsdp_runs")
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "fsdp.py"), "--quick", "--keep", str(out),
                             "--out", str(out / "fsdp.json")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    store_path = out / "fsdp_0" / "run" / "store.sqlite"
    deadline = time.time() + 600
    while time.time() < deadline and _measured(store_path) < 3 and proc.poll() is None:
        time.sleep(0.5)
    with RunStore(store_path, readonly=True) as s:
        first = s.read(meta.EVALUATORS)[0]
    os.kill(first["rank_pids"][1], signal.SIGKILL)  # rank 1 of the group, mid-run
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return KilledRun(out / "fsdp_0" / "run", first, out / "fsdp.json")


@pytest.mark.slow
def test_a_two_rank_search_measures_per_rank_peaks_below_one_device(killed_run):
    from dashboard.data import load_run
    from env.measure.measurement import measure
    from env.runtime.apply import plan_for
    from env.workloads.workload import load_workload

    run = killed_run.run
    front = json.loads((run / "frontier.json").read_text())
    assert front["fsdp_ranks"] == 2 and front["points"]
    assert front["clock"] == "thread-cpu, slowest of 2 ranks" and "FSDP2 x2 ranks" in front["device"]
    w = load_workload("gpt/tiny", seed=0)
    for p in front["points"]:  # the same plan on one device holds the whole model
        one = measure(w, plan_for(w.model, front["units"], [p["plan"][u] for u in front["units"]]), front["units"],
                      repeats=1)
        assert p["peak_bytes"] < one.peak_bytes
    report = (run / "report.md").read_text()
    assert "## FSDP" in report and "FSDP2 with 2 ranks per Evaluator (gloo)" in report
    with RunStore(run / "store.sqlite", readonly=True) as s:
        assert s.read(meta.STATUS) == "finished"
        # lm_loss's head is tied to the root's wte: it is sharded in the root's group
        assert s.read(meta.FSDP)["ranks"] == 2 and set(s.read(meta.FSDP)["sharded"]) == {"", *front["units"]} - {"lm_loss"}
        assert s.read(meta.PROFILE).baseline.clock == "thread-cpu, slowest of 2 ranks"
        rules = [s.get(d).measurement for d in s.read(meta.RULES).values()]
    assert all(m.clock == front["clock"] for m in _every_measurement_once(run / "store.sqlite"))
    # the correctness gate checked every plan shown, under FSDP, on the sharded step
    assert all(p["checked"] and p["gradient_error"] is not None for p in front["points"]), front["points"]
    assert "plans shown were checked on the workload" in report
    assert load_run(run).fsdp_ranks == 2  # what the dashboard shows of the run
    by_peak = sorted(rules, key=lambda m: m.peak_bytes)
    assert by_peak[0].peak_bytes < by_peak[-1].peak_bytes  # plans save memory per rank too


@pytest.mark.slow
def test_a_rank_killed_mid_run_restarts_the_group_and_every_measurement_is_recorded_once(killed_run):
    report = (killed_run.run / "report.md").read_text()
    # the event names the measurement the rank died in where it died in one (``EvaluatorRestarts._died``)
    died = re.search(r"evaluator_0 died (in the measurement of .+? )?\(RankDiedError: rank 1 of 2 died", report)
    assert died is not None, report
    with RunStore(killed_run.run / "store.sqlite", readonly=True) as s:
        again = s.read(meta.EVALUATORS)[0]
    first = killed_run.first
    assert again["restarts"] == 1 and again["alive"] and set(again["rank_pids"]).isdisjoint(first["rank_pids"])
    records = _every_measurement_once(killed_run.run / "store.sqlite")
    assert len({i.split(":")[0] for m in records for i in m.measurement_ids}) == 2  # both groups measured


def _measured(store_path: Path) -> int:
    if not store_path.exists():
        return 0
    try:
        with RunStore(store_path, readonly=True) as s:
            return s.count(measured_only=True)
    except CkptSearchError:
        return 0


@pytest.mark.slow
def test_a_workload_that_cannot_be_sharded_is_one_line(tmp_path):
    proc = _run(["--workload", "tests/data/broken_models.py:tied_blocks", "--fsdp", "2", "--no-progress",
                 "--out", str(tmp_path), "--name", "tied"])
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 2
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot be trained sharded with FSDP2" in errors[0] and "shared" in errors[0]
    assert "run it without --fsdp" in errors[0]


@pytest.mark.slow
def test_bench_fsdp_quick(killed_run):
    """``bench/fsdp.py --quick``: gpt/tiny on one device and on two ranks; the numbers every machine gives."""
    result = json.loads(killed_run.bench.read_text())
    assert result["ranks"] == 2 and result["machine"]["torch_version"] == torch.__version__
    (w,) = result["workloads"]
    one, ranks = w["one_device"], w["fsdp_2_ranks"]
    assert ranks["clock"] == "thread-cpu, slowest of 2 ranks" and one["clock"] == "thread-cpu"
    # a rank holds half the parameters, gradients and AdamW state: less before the step, a smaller share of its peak
    assert ranks["held_before_step_bytes"] < one["held_before_step_bytes"]
    assert ranks["held_share_of_peak"] < one["held_share_of_peak"]
    assert ranks["baseline_peak_bytes"] < one["baseline_peak_bytes"]
    assert ranks["lowest_peak_bytes"] < ranks["baseline_peak_bytes"]
    assert w["caps"] and w["caps_where_the_pick_differs"] == sum(c["differs"] for c in w["caps"])
    for c in w["caps"]:
        assert c["fsdp_peak_bytes"] <= c["cap_bytes"] and c["activation_budget_bytes"] < c["cap_bytes"]
        seen = c["one_device_pick_under_fsdp"]
        assert seen is None or seen["fits_cap"] == (seen["peak_bytes"] <= c["cap_bytes"])

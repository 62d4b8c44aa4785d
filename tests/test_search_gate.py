"""The correctness gate in a real search (Ray, SQLite): on a model whose unit ``blocks.1`` draws noise from numpy's
generator, no plan shown or exported recomputes it, none the search proposed after checking its rules is measured,
frontier.json says each shown plan was checked and its error, and report.md names the unit and the cause."""

from __future__ import annotations

import json

import pytest

from env.data.plan import Plan
from search.records import meta
from search.records.store import RunStore

ARGS = ["--workload", "tests/broken_models.py:numpy_noise?batch_size=256", "--units", "blocks.*", "--agents", "1",
        "--timesteps", "128", "--chunk-timesteps", "128", "--max-measurements", "10", "--repeats", "2",
        "--no-progress", "--no-batch-scaling", "--peers", "none"]


@pytest.mark.slow
def test_a_plan_that_changes_the_gradients_is_never_shown(tmp_path, ray_session):
    from search.run import main

    assert main([*ARGS, "--out", str(tmp_path), "--name", "g"]) == 0
    run_dir = tmp_path / "g"
    front = json.loads((run_dir / "frontier.json").read_text())
    assert front["points"] and all(p["checked"] and p["gradient_error"] <= 1e-3 for p in front["points"])
    assert all(p["plan"]["blocks.1"] == "keep" for p in front["points"])
    for path in (run_dir / "plans").glob("*.json"):
        assert Plan.load(path).actions["blocks.1"] == "keep"
    refused = front["refused"]  # recompute-all is the lowest-peak plan: it reached the frontier, and the gate
    assert refused and all(r["culprits"] == ["blocks.1"] for r in refused)
    report = (run_dir / "report.md").read_text()
    assert "## Correctness gate" in report and "'blocks.1'" in report and "numpy's global generator" in report
    with RunStore(run_dir, readonly=True) as s:
        checks = s.read(meta.GATE)
        assert {c.digest for c in checks.values() if not c.passed} == {r["digest"] for r in refused}
        assert s.read(meta.PHASE_SECONDS)["correctness gate"] > 0
        # the rule recomputing every unit was checked right after the rules: of the exact solver's and the agents'
        # plans (proposed after it) those that recompute blocks.1 are never measured, and some were proposed
        k = s.read(meta.UNITS).index("blocks.1")
        assert checks[s.read(meta.RULES)["all"]].culprits == ["blocks.1"]
        # (a plan a rule proposed too counts: the rules not measured are only proposed, and the exact solver's
        # frontier on 4 units is mostly rules' plans, e.g. segments_4; those the rules measured before the gate are
        # left out)
        measured_rules = {f"rule:{name}" for name in s.read(meta.RULES)}  # RULES_MEASURED and the profile's checks
        later = [p for p in s.plans() if any(not src.startswith("rule:") for src in p.proposers)
                 and not measured_rules & set(p.proposers)]
        assert any(p.actions[k] != "keep" for p in later)
        assert all(p.measurement is None for p in later if p.actions[k] != "keep")

"""The search checks its profile with the rules' measurements (``search.engine.phases.rules``): the plans
``check_profile`` would measure on one Evaluator are rules measured on every Evaluator, named as rules, and
their peaks refuse a profile off by more than the tolerance, in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agents.baselines import baseline_rules
from env.cost.cost_model import CostModel
from env.data.errors import MeasurementError
from env.data.plan import Action
from env.measure.measurement import measure
from env.measure.profiler import profile
from env.units.find import find_units
from env.workloads.workload import load_workload
from search.engine.ledger import Ledger, SearchSetup
from search.engine.phases.rules import check_profile_peaks, profile_checks
from search.records.config import SearchConfig
from search.records.store import STORE_NAME, RunStore
from tests.test_workloads import one_line_error


def test_the_rules_measurements_check_the_profile_and_refuse_a_doctored_one(tmp_path) -> None:
    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    prof = profile(w, units, [Action.KEEP, Action.RECOMPUTE, Action.SELECTIVE, Action.CHAIN], repeats=1,
                   check=False)
    with RunStore(tmp_path / STORE_NAME) as store:
        ctx = SimpleNamespace(ledger=Ledger(SearchSetup.from_profile(prof), store), cfg=SearchConfig())
        codec = ctx.ledger.codec
        rules = baseline_rules(codec.n_units, list(codec.actions), links=prof.chain_links)
        checks = profile_checks(ctx, rules)  # type: ignore[arg-type]
        # each checking plan under the rule that is the same plan; the one no rule is under its own name
        assert checks == {"none": tuple(rules["none"]), "all": tuple(rules["all"]),
                          "all_selective": tuple(rules["all_selective"]), "all_chained": checks["all_chained"],
                          "segments_2": tuple(rules["segments_2"])}
        assert "all_chained" not in rules and set(codec.names(checks["all_chained"])) == {"recompute", "chain"}
        measured = {name: measure(w, codec.plan(idx), units, repeats=1) for name, idx in checks.items()}
        check_profile_peaks(ctx, measured)  # type: ignore[arg-type]  # on CPU the profile is exact on them
        # a compiled search measures its rules compiled: its eager profile checked itself
        assert profile_checks(SimpleNamespace(ledger=ctx.ledger, cfg=SearchConfig(compile=True)), rules) == {}  # type: ignore[arg-type]
        keep = prof.costs[Action.KEEP]
        scaled = keep[1].model_copy(update={"fwd": keep[1].fwd.model_copy(
            update={"delta_bytes": 3 * keep[1].fwd.delta_bytes, "rise_bytes": 3 * keep[1].fwd.rise_bytes})})
        doctored = prof.model_copy(update={"costs": {**prof.costs, Action.KEEP: [*keep[:1], scaled, *keep[2:]]}})
        assert CostModel(doctored).predict(list(checks["none"])).peak_bytes > 1.05 * measured["none"].peak_bytes
        off = SimpleNamespace(ledger=Ledger(SearchSetup.from_profile(doctored), store), cfg=SearchConfig())
        with pytest.raises(MeasurementError) as e:
            check_profile_peaks(off, measured)  # type: ignore[arg-type]
    one_line_error(e, "profile of gpt/tiny on cpu predicts", "for plan 'none'", "MiB was measured")

"""Record tests/data/gpt_tiny_cpu_trace.json: one profiled step of gpt/tiny (every unit kept).

    python tests/data/record_trace.py

The file holds the step's allocation events and unit marks as ``env.measure.trace.ProfilerEvent`` rows,
with what was measured beside it (live bytes before the step, the measured peak of the same plan),
so that tests of ``env.measure.trace`` read a real trace without running a model.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from env.data.plan import Action  # noqa: E402
from env.measure.measurement import live_bytes, measure  # noqa: E402
from env.measure.timeline import UnitMarkers, profiler_events, train_step  # noqa: E402
from env.measure.trace import save_events  # noqa: E402
from env.runtime.apply import apply_actions, plan_for  # noqa: E402
from env.units.find import find_units  # noqa: E402
from env.workloads.workload import load_workload  # noqa: E402

OUT = Path(__file__).with_name("gpt_tiny_cpu_trace.json")


def main() -> None:
    torch.set_num_threads(1)
    w = load_workload("gpt/tiny")
    units = find_units(w.model)
    plan = plan_for(w.model, units, [Action.KEEP] * len(units))
    measured = measure(w, plan, units, repeats=1)  # makes the workload's optimizer and its state
    optimizer = w.meta["_optimizer"]
    with apply_actions(w.model, plan, units):
        train_step(w, optimizer)
        before = live_bytes(w, optimizer)
        with UnitMarkers(w.model, units) as markers:
            events = profiler_events(w, optimizer, markers)
    t0 = min(e.start_ns for e in events)  # ns from the step's first event: shorter numbers, same order
    events = [dataclasses.replace(e, start_ns=e.start_ns - t0) for e in events]
    save_events(OUT, events, workload=w.spec, units=units, torch_version=torch.__version__,
                live_before_bytes=before, measured_peak_bytes=measured.peak_bytes)
    print(f"{OUT}: {len(events)} events")


if __name__ == "__main__":
    main()

"""The "Price of memory" page: what each frontier plan costs to train with (``dashboard.pricing``).

It says which numbers are measured (each plan's peak and step time at the batch sizes the
search ran it at) and which are read off the fitted lines (a micro-batch outside those sizes:
marked extrapolated, its bar hatched).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import figures, pricing
from dashboard.data import RunData
from env.data.errors import CkptSearchError
from env.data.types import MIB

NumberColumn = st.column_config.NumberColumn


def _cluster() -> pricing.Cluster:
    c = st.columns(5)
    return pricing.Cluster(
        gpu_memory_gb=c[0].number_input("GPU memory (GB)", min_value=0.001, value=80.0, step=1.0, format="%g",
                                        key="gpu_gb"),
        price_per_gpu_hour=c[1].number_input("price per GPU-hour ($)", min_value=0.0, value=2.5, step=0.1,
                                             format="%.2f", key="gpu_price"),
        global_batch=int(c[2].number_input("global batch", min_value=1, value=1024, key="global_batch")),
        steps=int(c[3].number_input("training steps", min_value=1, value=10000, key="train_steps")),
        max_gpus=int(c[4].number_input("GPUs available", min_value=1, value=64, key="max_gpus")))


def _measured(batches: tuple[int, ...]) -> str:
    return ", ".join(str(b) for b in batches)


def pricing_page(run: RunData) -> None:
    st.markdown("For each frontier plan: the largest micro-batch that fits one GPU, the data-parallel GPUs and "
                "gradient-accumulation steps that reach the global batch, the wall time and the cost. **Measured**: "
                "each plan's peak and step time at the batch sizes in *measured at*. **Fitted**: straight lines "
                "through them (peak = a + b × batch, time = c + d × batch) give every other micro-batch; one outside "
                "the measured sizes is **extrapolated** (hatched bar, ticked in the table). Communication time is not "
                "counted.")
    cluster = _cluster()
    if not run.batch_scaling:
        st.info("This run has no batch-scaling measurements (frontier plans at 2+ batch sizes); "
                "run the search with --batch-scaling to price memory.")
        return
    try:
        table, left_out = pricing.priced_and_left_out(run.frontier, run.batch_scaling, cluster)
    except CkptSearchError as e:
        st.error(str(e))
        return
    if table.empty:
        st.info("No frontier plan has measurements at 2+ batch sizes yet.")
    elif not table.fits.any():
        st.warning(f"No plan fits a {cluster.gpu_memory_gb:g} GB GPU even at a micro-batch of 1 (the smallest needs "
                   f"{(table.fixed_bytes + table.bytes_per_sample).min() / 1e9:.3g} GB by its fit); raise the GPU memory.")
    else:
        _explain_fit(table, cluster)
        st.plotly_chart(figures.price_figure(table), key="price_chart")
        _price_table(table)
    for line in left_out:
        st.caption(f"Not priced: {line}")


def _explain_fit(table: pd.DataFrame, cluster: pricing.Cluster) -> None:
    fits = table.loc[table.fits]
    if len(fits) and (fits.gpus == 1).all() and (fits.accumulation == 1).all():
        st.info(f"At {cluster.gpu_memory_gb:g} GB every plan fits the global batch of {cluster.global_batch} on one GPU, "
                "so memory buys nothing here and the plans differ only in step time. Lower the GPU memory or raise the "
                "global batch to see what memory costs.")
    far = fits.loc[fits.extrapolated]
    if len(far):
        beyond = max(r.micro_batch / max(r.measured_batches) for r in far.itertuples())
        st.warning(f"{len(far)} of {len(fits)} plans run a micro-batch outside the batch sizes they were measured at "
                   f"(up to {beyond:.0f}x the largest): their peak and step time there are extrapolated from the fits, "
                   "and their cost is only as good as a straight line that far out.")


def _price_table(table: pd.DataFrame) -> None:
    table = table.copy()
    for c in ("micro_batch", "accumulation", "gpus"):  # blank, not 0, where not even one sample fits
        table[c] = table[c].where(table.fits).astype("Int64")
    shown = pd.DataFrame({
        "plan": table.summary, "fits one GPU": table.fits, "micro-batch": table.micro_batch,
        "measured at": [_measured(b) for b in table.measured_batches], "extrapolated": table.extrapolated,
        "x largest measured": [m / max(b) if f else None for m, b, f in zip(table.micro_batch, table.measured_batches,
                                                                             table.fits)],
        "accumulation": table.accumulation, "GPUs": table.gpus, "step (s)": table.step_seconds,
        "wall (h)": table.wall_hours, "cost ($)": table.cost, "KiB per sample": table.bytes_per_sample / 1024,
        "fixed (MiB)": table.fixed_bytes / MIB, "plan id": table.digest})
    st.dataframe(shown, hide_index=True, width="stretch", column_config={
        "x largest measured": NumberColumn(format="%.1fx"), "step (s)": NumberColumn(format="%.3f"), "wall (h)": NumberColumn(format="%.2f"),
        "cost ($)": NumberColumn(format="%.2f"), "KiB per sample": NumberColumn(format="%.1f"),
        "fixed (MiB)": NumberColumn(format="%.2f")})

"""The "Price of memory" page: what each frontier plan costs to train with (``dashboard.pricing``).

It says which numbers are measured (each plan's peak and step time at the batch sizes the
search ran it at) and which are read off the fitted lines (a micro-batch outside those sizes:
marked extrapolated, its bar hatched).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import figures, fmt, pricing
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
    _device_line(run)
    try:
        table, left_out = pricing.priced_and_left_out(run.frontier, run.batch_scaling, cluster, run.baseline_digest,
                                                      run.timing_noise)
    except CkptSearchError as e:
        st.error(fmt.plain(str(e)))
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


def _device_line(run: RunData) -> None:
    """Where the step times came from; CPU times priced as GPU-hours said plainly."""
    where = f"Step times measured on **{run.device or 'an unrecorded device'}** by the {run.clock} clock."
    if run.device.lower().startswith("cpu"):
        st.warning(where + " These are CPU times: priced here as GPU-hours they are not what a GPU would take or "
                   "cost. Read the plans' order and the micro-batches, not the dollars, or run the search on the GPU "
                   "you mean to rent.")
    else:
        st.caption(where)


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
                   f"(up to {beyond:.1f}x the largest; hatched): their step time there is read off a straight line.")
    capped = fits.loc[fits.capped]
    if len(capped):
        st.info(f"{len(capped)} plans are priced at most {pricing.MAX_EXTRAPOLATION:g}x the largest micro-batch "
                "measured, though their fit says a larger one fits (column *fit allows*; *capped* ticked): no price "
                "is read further out "
                "than measured. Measure those micro-batches (python -m search.run --memory-cap) to price them.")


def _price_table(table: pd.DataFrame) -> None:
    """The priced plans; those that do not fit one GPU even at a micro-batch of 1 are named below it, not
    shown as empty cells."""
    unfit = table.loc[~table.fits]
    table = table.loc[table.fits]
    shown = pd.DataFrame({
        "plan": table.summary, "micro-batch": table.micro_batch,
        "measured at": [_measured(b) for b in table.measured_batches], "extrapolated": table.extrapolated,
        "x largest measured": [m / max(b) for m, b in zip(table.micro_batch, table.measured_batches)],
        "fit allows": table.fit_largest, "capped": table.capped,
        "accumulation": table.accumulation, "GPUs": table.gpus, "step (s)": table.step_seconds,
        "wall (h)": table.wall_hours, "cost ($)": table.cost, "MiB per sample": table.bytes_per_sample / MIB,
        "fixed (MiB)": table.fixed_bytes / MIB, "plan id": table.digest})
    st.dataframe(shown, hide_index=True, width="stretch", column_config={
        "x largest measured": NumberColumn(format="%.1fx"), "step (s)": NumberColumn(format="%.3f"), "wall (h)": NumberColumn(format="%.2f"),
        "cost ($)": NumberColumn(format="%.2f"), "MiB per sample": NumberColumn(format="%.3f"),
        "fixed (MiB)": NumberColumn(format="%.2f")})
    if len(unfit):
        st.caption("Not even a micro-batch of 1 fits one GPU: " + ", ".join(unfit.summary) + ".")

"""The ckpt-search dashboard: ``streamlit run dashboard/app.py -- --runs DIR`` (or ``ckpt-dashboard``).

Pages (tabs): Frontier, Plan, Price of memory, Live, New search, Throughput; only the open one runs. The
sidebar picks a run folder under ``--runs`` (newest first, broken ones last). The URL holds the run, the
page, the selected plan and the budget (``?run=...&page=Plan&plan=...&budget=...``), so a view can be
shared. Reads run folders read-only; never imports Ray.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run dashboard/app.py` puts only dashboard/ on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from dashboard import fmt, selection, throughput, views  # noqa: E402
from dashboard.data import RunData, RunDataError, RunNotReady, list_runs, load_run, log_error, stamp  # noqa: E402
from dashboard.launch import RUNS_ENV  # noqa: E402
from dashboard.new_search import LaunchPolicy  # noqa: E402
from dashboard.new_search_view import PENDING_RUN, new_search_page  # noqa: E402
from dashboard.price_view import pricing_page  # noqa: E402

PAGES = ["Frontier", "Plan", "Price of memory", "Live", "New search", "Throughput"]
PAGE = "page"  # the open tab's key, and its query parameter
URL_READ = "_url_read"  # the session has applied the URL's run, plan and budget once


def app_args() -> argparse.Namespace:
    """The app's own arguments (after ``--`` on the streamlit command line)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--runs", default=os.environ.get(RUNS_ENV, "runs"))
    p.add_argument("--allow-launch", action="store_true")
    p.add_argument("--workloads-dir", default=None)
    args, _ = p.parse_known_args(sys.argv[1:])
    return args


def launch_policy(args: argparse.Namespace) -> LaunchPolicy:
    """Starting searches: on for a loopback-bound server, else only as the operator allowed."""
    return LaunchPolicy.for_server(st.get_option("server.address"), args.allow_launch, args.workloads_dir)


@st.cache_data(show_spinner=False, max_entries=16)
def cached_run(path: str, key: tuple[float, ...]) -> RunData:
    """load_run, read again whenever the store or frontier file changes (``key`` is their mtimes)."""
    return load_run(path)


def pick_run(root: Path) -> Path | None:
    runs = list_runs(root)
    st.sidebar.markdown(f"Runs under `{root}`")
    if not runs:
        return None
    ids = [r.run_id for r in runs]
    if "run_choice" not in st.session_state and st.query_params.get("run") in ids:  # a shared link
        st.session_state["run_choice"] = st.query_params["run"]
    if st.session_state.get(PENDING_RUN) in ids:  # a search just started from the form: show its live page
        st.session_state["run_choice"] = st.session_state.pop(PENDING_RUN)
        st.session_state[PAGE] = "Live"
    if st.session_state.get("run_choice") not in ids:
        st.session_state["run_choice"] = ids[0]
    info = {r.run_id: r for r in runs}
    st.sidebar.selectbox("run", ids, key="run_choice",
                         format_func=lambda i: f"{i} · {info[i].workload or '?'} · {info[i].status}")
    st.query_params["run"] = st.session_state["run_choice"]
    return info[st.session_state["run_choice"]].path


@st.fragment(run_every=views.LIVE_EVERY_S)
def wait_for_results(run_dir: Path) -> None:
    """A run without a store yet: check again every few seconds, show the run once it has one."""
    if (run_dir / "store.sqlite").is_file() or log_error(run_dir, last_only=True):
        st.rerun()
    st.caption("waiting for the search to write its store ...")


def live_tab(run: RunData) -> None:
    if run.status != "running":
        views.live_panel(run)
        return

    @st.fragment(run_every=views.LIVE_EVERY_S)
    def refresh() -> None:
        fresh = cached_run(str(run.path), stamp(run.path))
        views.live_panel(fresh)
        if fresh.status != "running":
            st.rerun()
    refresh()
    if run.status == "stopped":
        st.warning(f"The search process of this run is gone (killed, or its machine restarted); continue it with "
                   f"`python -m search.run --resume {run.path}`.")


def run_caption(run: RunData) -> str:
    baseline = (f"baseline {fmt.size(run.baseline_peak_bytes)}, {fmt.duration(run.baseline_seconds)} a step"
                if run.baseline_peak_bytes == run.baseline_peak_bytes else "baseline not measured yet")
    return f"**{run.run_id}** · {run.workload} · {run.status.partition(':')[0]} · {len(run.units)} units · {baseline}"


def show_run(run_dir: Path, root: Path, policy: LaunchPolicy) -> None:
    try:
        run = cached_run(str(run_dir), stamp(run_dir))
    except RunNotReady as e:
        failed = log_error(run_dir, last_only=True)
        if failed:  # the search stopped before it wrote a store
            st.error(fmt.plain(f"The search of run '{run_dir.name}' failed: {failed}"))
        else:
            st.info(fmt.plain(str(e)))
            wait_for_results(run_dir)
        return
    except RunDataError as e:
        st.error(fmt.plain(str(e)))
        return
    st.session_state["_run"] = run
    selection.reset_for(st.session_state, run)
    if not st.session_state.get(URL_READ):  # a shared link's plan or budget, once per session
        st.session_state[URL_READ] = True
        selection.from_url(st.session_state, run, st.query_params.get("plan"), st.query_params.get("budget"))
    selection.to_url(st.session_state, st.query_params)
    st.caption(run_caption(run))
    if run.error:
        st.error(fmt.plain(f"The search failed: {run.error}"))
    tabs = st.tabs(PAGES, default="Live" if run.status == "running" else "Frontier", key=PAGE, bind="query-params")
    pages = (lambda: views.frontier_page(run), lambda: views.plan_page(run), lambda: pricing_page(run),
             lambda: live_tab(run), lambda: new_search_page(root, policy), lambda: throughput.throughput_page(run.path))
    for tab, draw in zip(tabs, pages):
        if tab.open:  # only the page shown computes
            with tab:
                draw()


def main() -> None:
    st.set_page_config(page_title="ckpt-search", layout="wide")
    st.title("Checkpoint plans: memory vs time")
    args = app_args()
    root, policy = Path(args.runs), launch_policy(args)
    run_dir = pick_run(root)
    if run_dir is None:
        st.info(f"No runs under '{root}' yet. Start one below, or run "
                f"`python -m search.run --out {root}`, then reload.")
        new_search_page(root, policy)
        return
    show_run(run_dir, root, policy)


main()

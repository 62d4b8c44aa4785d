"""The "New search" page: a form that starts ``python -m search.run`` in the background (``new_search``).

The workload is checked before anything starts; a bad one is refused in one line and no run
folder is made. A started run becomes the sidebar's run on the next rerun (``PENDING_RUN``:
the sidebar's widget already exists when the form is submitted, so it cannot be set now).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import fmt
from dashboard.new_search import LaunchPolicy, start_search
from env.data.errors import CkptSearchError

PENDING_RUN = "pending_run"  # run folder name the sidebar switches to on the next run of the script
STARTED = "started"


def new_search_page(runs_root: Path, policy: LaunchPolicy) -> None:
    if not policy.enabled:
        st.info(policy.reason)
        return
    with st.form("new_search"):
        st.markdown(f"Starts `python -m search.run` in the background; its run folder goes under `{runs_root}`.")
        workload = st.text_input("workload", value="gpt/tiny",
                                 help="a built-in (gpt, cnn, lstm, mlp; presets gpt/tiny, gpt/small; options "
                                      "gpt?n_layer=12) or path/to/file.py:factory, relative to where the dashboard runs")
        c = st.columns(2)
        agents = int(c[0].number_input("agents", min_value=1, value=2))
        timesteps = int(c[1].number_input("timesteps per agent", min_value=1, value=512))
        submitted = st.form_submit_button("Start search")
    if submitted:
        try:
            started = start_search(workload, agents, timesteps, runs_root, policy=policy)
        except CkptSearchError as e:
            st.error(fmt.plain(str(e)))
            return
        st.session_state[PENDING_RUN] = started.run_dir.name
        st.session_state[STARTED] = f"started pid {started.pid}: {' '.join(started.command)}"
        st.rerun()
    if STARTED in st.session_state:
        st.caption(st.session_state[STARTED])

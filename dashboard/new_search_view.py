"""The "New search" page: starts ``python -m search.run`` in the background (``new_search``), and stops it.

The command is shown, exactly as it will run, before anything starts; an input the CLI would refuse
is refused here in its one line, and no run folder is made. A started run becomes the sidebar's run
on the next rerun (``PENDING_RUN``: the sidebar's widget already exists when the button is pressed,
so it cannot be set now). Each search this dashboard started and that still runs has a Stop button.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import streamlit as st

from dashboard import fmt
from dashboard.new_search import LaunchPolicy, Options, is_running, search_command, start_search, stop_search
from env.data.errors import CkptSearchError
from env.workloads.spec import PRECISIONS
from search.records.config import field_doc
from search.records.runs import run_id

PENDING_RUN = "pending_run"  # run folder name the sidebar switches to on the next run of the script
STARTED = "started"  # "started pid N: command" of the last search started here
LAUNCHED_PIDS = "launched_pids"  # pid -> run folder name, of the searches this session started
DEVICES = ["auto", "cpu", "cuda"]


def _memory_caps(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise CkptSearchError(f"memory caps '{text}' are not numbers of MiB; give them as e.g. 60 120, or leave "
                              "the box empty for a frontier search") from None


def _help(name: str) -> str:
    """The flag's own ``--help`` line (``SearchConfig``'s field docstring), naming the flag."""
    return f"{field_doc(name)} (--{name.replace('_', '-')})"


def _form() -> tuple[str, Options]:
    workload = st.text_input("workload", value="gpt/tiny", help=_help("workload") + " (a file: relative to where "
                             "the dashboard runs)")
    c = st.columns(3)
    agents = int(c[0].number_input("agents", min_value=1, value=2, help=_help("agents")))
    timesteps = int(c[1].number_input("timesteps per agent", min_value=1, value=512, help=_help("timesteps")))
    evaluators = int(c[2].number_input("CPU evaluators", min_value=0, value=0, help=_help("evaluators")))
    c = st.columns(3)
    caps = c[0].text_input("memory caps (MiB, optional)", value="", help=_help("memory_cap"))
    device = c[1].selectbox("device", DEVICES, help=_help("device"))
    precision = c[2].selectbox("precision", PRECISIONS, key="precision", help=_help("precision"))
    return workload, Options(agents, timesteps, tuple(_memory_caps(caps)) if caps.strip() else (), device, evaluators,
                             precision)


def new_search_page(runs_root: Path, policy: LaunchPolicy) -> None:
    if not policy.enabled:
        st.info(policy.reason)
        return
    st.markdown(f"Starts `python -m search.run` in the background; its run folder goes under `{runs_root}`.")
    try:
        workload, options = _form()
        policy.check(workload)
        name = st.session_state.setdefault(f"run_name:{workload}", run_id(workload))  # the name shown is the one run
        command = search_command(workload, options.agents, options.timesteps, runs_root.resolve(), name, options)
    except CkptSearchError as e:
        st.error(fmt.plain(str(e)))
        st.button("Start search", disabled=True)
        _launched()
        return
    st.caption("The command it runs:")
    st.code(shlex.join(command), language="bash", wrap_lines=True)
    if st.button("Start search", type="primary"):
        try:
            started = start_search(workload, options.agents, options.timesteps, runs_root, name, policy, options)
        except CkptSearchError as e:
            st.error(fmt.plain(str(e)))
            return
        st.session_state[PENDING_RUN] = started.run_dir.name
        st.session_state[STARTED] = f"started pid {started.pid}: {shlex.join(started.command)}"
        st.session_state.setdefault(LAUNCHED_PIDS, {})[started.pid] = started.run_dir.name
        del st.session_state[f"run_name:{workload}"]  # the next search gets a name of its own
        st.rerun()
    _launched()


def _launched() -> None:
    """The searches this session started: a Stop button for each that still runs."""
    if STARTED in st.session_state:
        st.caption(st.session_state[STARTED])
    for pid, name in list(st.session_state.get(LAUNCHED_PIDS, {}).items()):
        if not is_running(pid):
            continue
        if st.button(f"Stop search {name} (pid {pid})", key=f"stop_{pid}"):
            with st.spinner(f"stopping {name} ..."):
                st.success(f"Search {name}: {stop_search(pid)}.")

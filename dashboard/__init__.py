"""Streamlit dashboard of ckpt-search runs: data loading, figures, price of memory, pages.

``streamlit run dashboard/app.py -- --runs DIR`` or ``ckpt-dashboard --runs DIR``. Reads run
folders read-only (search.records.store.RunStore, frontier.json) and never imports Ray.
"""

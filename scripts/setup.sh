#!/usr/bin/env bash
# Create .venv with ckpt-search and everything its tests need. torch is pinned to the tested
# CPU build through constraints.txt; GPU users install their own torch first and drop "-c".
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,hf]' 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import torch, gymnasium, stable_baselines3, ray, streamlit" \
    || { echo "setup failed: the virtual environment is incomplete; see pip's output above"; exit 1; }

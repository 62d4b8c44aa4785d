#!/usr/bin/env bash
# Create .venv with ckpt-search and everything its tests need, each at the version of the lock
# (constraints.txt, written by scripts/lock.sh), the CPU build of torch included. GPU users: install your
# own torch build into .venv first and run CKPT_OWN_TORCH=1 bash scripts/setup.sh, which keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
lock=constraints.txt
if [ "${CKPT_OWN_TORCH:-0}" = 1 ]; then
    lock=$(mktemp)
    trap 'rm -f "$lock"' EXIT
    grep -v '^torch==' constraints.txt > "$lock"
fi
.venv/bin/pip install -q --disable-pip-version-check -c "$lock" -e '.[test,hf,autosac,bench]' 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import torch, gymnasium, stable_baselines3, ray, streamlit" \
    || { echo "setup failed: the virtual environment is incomplete; see pip's output above"; exit 1; }

#!/usr/bin/env bash
# Creates .venv with everything the project, its tests and its CLI need (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU wheel of torch 2.13.0 lies on disk on the project's machines; install it first so the
# project's own range (>=2.11,<2.15) is already satisfied and no multi-GB CUDA build is fetched.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[operator,trainer,plot,dev]"
python scripts/fetch_k8s_tools.py .tools

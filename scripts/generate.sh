#!/usr/bin/env bash
# Regenerates every generated file (CRDs, examples' planner comments, golden plans, doc tables);
# `--check` changes nothing and fails naming each stale file; `--calibration` also refits the reports.
set -euo pipefail
cd "$(dirname "$0")/.."
# The golden plans are computed by tests/support/golden_plans.py, imported from the repository root.
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python scripts/generate.py "$@"

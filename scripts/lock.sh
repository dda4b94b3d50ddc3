#!/usr/bin/env bash
# Writes requirements.lock: every package the project and its extras install, at one version each, for
# Linux x86-64 and Python 3.11 (what CI and the project's machines run). scripts/bootstrap.sh installs
# through it as constraints, so a fresh machine tests exactly what the last lock was tested with;
# pyproject.toml keeps the ranges users install from. Re-run after changing a dependency in pyproject.toml:
# uv keeps every pin the lock already holds that still fits and resolves only what changed
# (`--upgrade` takes the newest the ranges allow instead).
#
# torch is locked to 2.13.0+cpu, the CPU wheel that lies on the project's machines (pip's find-links):
# PyPI's torch 2.13.0 is a CUDA build of several GB.
set -euo pipefail
cd "$(dirname "$0")/.."
links=()
for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true); do
  if [ -d "$dir" ]; then links+=(--find-links "$dir"); fi
done
.venv/bin/python -m uv pip compile pyproject.toml \
  --extra operator --extra trainer --extra plot --extra demo --extra dev \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  "${links[@]}" -c scripts/lock-pins.txt --no-header --annotation-style line \
  -o requirements.lock "$@"

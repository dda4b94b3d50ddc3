"""Suite-wide hooks: heavy modules first under pytest-xdist, and every skipped check named at the end."""

from __future__ import annotations

import os
from collections import Counter

import pytest

# Markers of the tests that take the most time per test (processes of their own).
HEAVY = ("distributed", "integration")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, the modules with gloo ranks, then those with the operator, then the rest.

    Workers take whole modules (`--dist loadfile`) in collection order: a long module picked up last would
    keep one worker busy while the others idle. Order inside a module is kept, and every worker sorts its
    (identical) collection the same way, as xdist requires.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    weight: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        marks = {mark.name for mark in item.iter_markers()}
        heavy = max((len(HEAVY) - i for i, name in enumerate(HEAVY) if name in marks), default=0)
        weight[module] = max(weight.get(module, 0), heavy)
    items.sort(key=lambda item: -weight[item.nodeid.split("::", 1)[0]])


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

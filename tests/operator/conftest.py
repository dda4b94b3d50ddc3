"""Fixtures for the operator tests: an emulated cluster and a kubeconfig pointing the operator at it.

Every test that uses the cluster also checks, at teardown, that each API call the operator made is
granted by blackwell_operator.permissions.PERMISSIONS (the source of the chart's RBAC).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from blackwell_operator.permissions import granted
from blackwell_operator.settings import operator_environment
from tests.operator.harness import Cluster, api_calls, emulated_cluster, from_operator, write_kubeconfig

OPERATOR_CALLS: set[tuple[str, str, str]] = set()  # union over the session, for test_permissions


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with emulated_cluster(nodes=2) as emulated:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", emulated.url)))
        monkeypatch.setenv("BTJ_METRICS_BIND", "off")
        yield emulated
        calls = api_calls(r for r in emulated.k.requests if from_operator(r))
        OPERATOR_CALLS.update(calls)
        # The opt-in grants (permissions.OPT_IN) count only where the test turned their setting on.
        opt_in = operator_environment().check_image_pull_secrets
        missing = sorted(call for call in calls if not granted(*call, opt_in=opt_in))
        assert not missing, f"the operator made calls PERMISSIONS does not grant: {missing}"

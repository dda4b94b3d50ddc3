"""Every API call the real operator makes is allowed by the chart's default-shaped RBAC, and no call leaves
the namespaces it watches: the rendered Roles and bindings evaluated by Kubernetes' RBAC rule
(tests/support/rbac.py) against the requests of the scenario that walks every code path calling the API."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.operator.harness import NAMESPACE, Cluster, from_operator, verb_of
from tests.operator.test_metrics_and_rbac import (
    test_every_call_is_granted_and_every_grant_is_used as scenario,
)
from tests.support.helm import find_helm, render
from tests.support.rbac import Request, allowed, operator_account

pytestmark = pytest.mark.integration


async def test_the_operators_calls_are_allowed_by_the_chart_in_its_namespaces_only(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helm = find_helm()
    if helm is None:
        pytest.skip("helm not found on PATH or in .tools/helm/ (run scripts/bootstrap.sh)")
    await scenario(cluster, tmp_path, monkeypatch)  # its own asserts: calls == PERMISSIONS
    # With operator.freeCapacity the operator also lists the pods on nodes in every namespace (the most it
    # calls); without it (the chart's default) it makes no such call (BTJ_FREE_CAPACITY=false).
    objects = render(helm, sets=(f"operator.watchNamespaces={{{NAMESPACE}}}", "operator.freeCapacity=true"))
    account = operator_account(objects)
    requests = set()
    for r in cluster.k.requests:
        verb = verb_of(r)
        if not from_operator(r) or r.resource is None or not r.resource.plural or verb is None:
            continue
        plural = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        requests.add(Request(r.resource.group or "", plural, verb, r.namespace, r.name))
    assert len(requests) > 20
    denied = sorted(str(q) for q in requests if not allowed(objects, account, q))
    assert not denied, f"the chart's RBAC refuses calls the operator makes: {denied}"
    assert Request("", "pods", "list", None, None) in requests  # the free GPUs were read
    elsewhere = {q.namespace for q in requests} - {NAMESPACE, None}
    assert not elsewhere, f"calls outside the watched namespace: {elsewhere}"
    # Cluster-scoped requests are reads only.
    assert {q.verb for q in requests if q.namespace is None} <= {"get", "list", "watch"}

"""The chart's side of issue 36: the ServiceAccounts trainer pods may run as reach the operator, the operator
knows its own, and the operator's namespace is not one it serves unless asked. The real helm binary."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.admission.accounts import TRAINING_ACCOUNT_LABEL
from blackwell_operator.settings import operator_environment
from tests.support.helm import CHART, NAMESPACE, SERVED, TEAM, by_kind, render, run_helm


def operator_env(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (deployment,) = by_kind(objects, "Deployment")
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("sets", "rendered", "parsed"),
    [
        ((), '["default"]', ("default",)),
        (
            ("operator.allowedServiceAccounts={default,hyperpod-ns-team-a/training-s3}",),
            '["default","hyperpod-ns-team-a/training-s3"]',
            ("default", "hyperpod-ns-team-a/training-s3"),
        ),
        # Empty is no account (every one needs the label), not "unset" (which the operator reads as default).
        (("operator.allowedServiceAccounts=null",), "[]", ()),
    ],
    ids=["default", "listed", "none"],
)
def test_the_allow_list_reaches_the_operator_as_it_reads_it(
    helm: str, monkeypatch: pytest.MonkeyPatch, sets: tuple[str, ...], rendered: str, parsed: tuple[str, ...]
) -> None:
    env = operator_env(render(helm, sets=sets))
    assert env["BTJ_ALLOWED_SERVICE_ACCOUNTS"]["value"] == rendered
    monkeypatch.setenv("BTJ_ALLOWED_SERVICE_ACCOUNTS", rendered)
    assert operator_environment().allowed_service_accounts == parsed


def test_the_operator_knows_its_own_account_from_its_pod(helm: str) -> None:
    objects = render(helm)
    env = operator_env(objects)
    assert env["BTJ_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert (
        env["BTJ_OPERATOR_SERVICE_ACCOUNT"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.serviceAccountName"
    )


def test_a_bad_allow_list_entry_is_refused_by_the_schema(helm: str) -> None:
    result = run_helm(
        helm,
        "template",
        "btj",
        str(CHART),
        "--set",
        SERVED,
        "--set",
        "operator.allowedServiceAccounts={Team/A}",
    )
    assert result.returncode != 0 and "allowedServiceAccounts" in result.stderr, result.stderr


def test_the_operators_namespace_is_served_only_when_asked(helm: str) -> None:
    own = render(
        helm, sets=(f"operator.watchNamespaces={{{TEAM},{NAMESPACE}}}", "operator.serveOwnNamespace=true")
    )
    (deployment,) = by_kind(own, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={NAMESPACE}" in args and f"--namespace={TEAM}" in args
    wide = render(helm, sets=("operator.clusterWide=true", "operator.serveOwnNamespace=true"))
    (deployment,) = by_kind(wide, "Deployment")
    assert (
        "--namespace=!kube-system,!kube-public,!kube-node-lease"
        in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def _notes(helm: str, *sets: str) -> str:
    args = ["install", "btj", str(CHART), "--dry-run=client", "--namespace", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split("NOTES:", 1)[1].split())


def test_notes_say_whom_the_operator_serves_and_which_accounts_pods_may_use(helm: str) -> None:
    text = _notes(helm, SERVED)
    assert f"It watches, and has rights in, only: {TEAM}." in text
    assert f"Its own namespace {NAMESPACE} serves no BlackwellTrainingJobs" in text
    assert "Trainer pods may run as: default (operator.allowedServiceAccounts)" in text
    assert f"kubectl -n <namespace> label serviceaccount <name> {TRAINING_ACCOUNT_LABEL}=true" in text
    assert "never the operator's own (btj-btj-operator)" in text
    wide = _notes(helm, "operator.clusterWide=true")
    assert f"every namespace but kube-system, kube-public, kube-node-lease, {NAMESPACE}," in wide

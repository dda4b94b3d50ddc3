"""Which ServiceAccount a BTJ's pods may run as (issue 36): never the operator's own, else one an admin
labelled for training or the chart's allow-list names; refused with the field and the fix. The real operator
under KopfRunner against the KMock API server."""

from __future__ import annotations

import pytest

import blackwell_operator.handlers.pass_inputs as pass_inputs
from blackwell_operator.admission.accounts import TRAINING_ACCOUNT_LABEL, AccountPolicy, marked
from blackwell_operator.lifecycle.references import SERVICE_ACCOUNT_NOT_ALLOWED
from blackwell_operator.settings import operator_environment
from tests.operator.harness import NAMESPACE, Cluster, btj, running_operator, wait_for

pytestmark = pytest.mark.integration

OPERATOR = "btj-operator"


@pytest.fixture(autouse=True)
def _operator_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    # As the chart sets them from the downward API: the operator runs in the jobs' namespace here (the case
    # the chart's default now avoids), as OPERATOR. The resync loop looks again within a second.
    monkeypatch.setenv("BTJ_OPERATOR_NAMESPACE", NAMESPACE)
    monkeypatch.setenv("BTJ_OPERATOR_SERVICE_ACCOUNT", OPERATOR)
    monkeypatch.setenv("BTJ_CHILD_RETRY_INTERVAL_S", "1")


def _invalid_naming(cluster: Cluster, name: str) -> str:
    planned = cluster.condition(name, "Planned")
    assert planned is not None and (planned["status"], planned["reason"]) == ("False", "InvalidSpec")
    assert cluster.status(name)["phase"] == "Invalid"
    assert cluster.job(name) is None and cluster.config_map(f"{name}-plan") is None, "no child"
    return str(planned["message"])


async def test_the_operators_own_account_is_refused_whatever_marks_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Labelled and allow-listed too: no admin's mark makes the operator's account a trainer's.
    monkeypatch.setenv("BTJ_ALLOWED_SERVICE_ACCOUNTS", f'["{OPERATOR}"]')
    await cluster.add_service_account(OPERATOR)
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("as-operator", serviceAccountName=OPERATOR))
        await wait_for(lambda: cluster.status("as-operator").get("phase") == "Invalid", what="phase Invalid")
        await wait_for(lambda: cluster.events("as-operator"), what="its Event")
    assert runner.exception is None
    message = _invalid_naming(cluster, "as-operator")
    assert message.startswith(
        f"spec.serviceAccountName: ServiceAccount {OPERATOR}, the operator's own account in namespace "
        f"{NAMESPACE}; trainer pods never run with the operator's rights"
    ), message
    assert (
        f"Fix: name a ServiceAccount made for training (kubectl -n {NAMESPACE} create serviceaccount"
        in message
    )
    assert f"label serviceaccount training {TRAINING_ACCOUNT_LABEL}=true" in message
    assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in cluster.events("as-operator"))


async def test_a_btj_naming_no_account_is_refused_where_the_default_is_the_operators(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BTJ_OPERATOR_SERVICE_ACCOUNT", "default")
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("unnamed"))
        await wait_for(lambda: cluster.status("unnamed").get("phase") == "Invalid", what="phase Invalid")
    assert runner.exception is None
    message = _invalid_naming(cluster, "unnamed")
    assert message.startswith(
        "spec.serviceAccountName: unset, so the pods would run as ServiceAccount default, the operator's own"
    ), message


async def test_the_preflight_refuses_the_operators_account_where_admission_did_not(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last line: were admission's check skipped (a path that creates without it), the preflight before
    # the child refuses the account all the same.
    monkeypatch.setattr(pass_inputs, "refuse_operators_account", lambda *_: None)
    monkeypatch.setenv("BTJ_ALLOWED_SERVICE_ACCOUNTS", f'["{OPERATOR}"]')
    await cluster.add_service_account(OPERATOR)
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("last-line", serviceAccountName=OPERATOR))
        created = await wait_for(lambda: cluster.condition("last-line", "ChildCreated"), what="ChildCreated")
    assert runner.exception is None
    assert (created["status"], created["reason"]) == ("False", SERVICE_ACCOUNT_NOT_ALLOWED)
    assert created["message"].startswith(
        f"spec.serviceAccountName: ServiceAccount {OPERATOR}, the operator's own"
    )
    assert cluster.job("last-line") is None and cluster.config_map("last-line-plan") is None


async def test_an_unlabelled_account_is_refused_until_an_admin_labels_it(cluster: Cluster) -> None:
    await cluster.add_service_account("training-s3", allowed=False)
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("s3", serviceAccountName="training-s3"))
        created = await wait_for(lambda: cluster.condition("s3", "ChildCreated"), what="ChildCreated")
        assert (created["status"], created["reason"]) == ("False", SERVICE_ACCOUNT_NOT_ALLOWED)
        message = created["message"]
        assert message.startswith(
            f"spec.serviceAccountName: ServiceAccount training-s3 of namespace {NAMESPACE} is not allowed "
            "for training"
        ), message
        assert (
            f"Fix: an admin labels it (kubectl -n {NAMESPACE} label serviceaccount training-s3 "
            f"{TRAINING_ACCOUNT_LABEL}=true) or adds {NAMESPACE}/training-s3 to the chart's "
            "operator.allowedServiceAccounts"
        ) in message
        status = cluster.status("s3")
        assert status["phase"] == "Pending" and "Waiting for its ServiceAccount" in status["message"]
        assert cluster.job("s3") is None and cluster.config_map("s3-plan") is None
        # Kopf posts Events after the handler returns, so the Warning may land after the condition.
        warnings = await wait_for(
            lambda: [e for e in cluster.events("s3") if e["reason"] == SERVICE_ACCOUNT_NOT_ALLOWED],
            what="the ServiceAccountNotAllowed Event",
        )
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"

        # An admin marks it: the resync loop finds the label and the job is created.
        await cluster.label_service_account("training-s3", {TRAINING_ACCOUNT_LABEL: "true"})
        await wait_for(lambda: cluster.job("s3"), what="the PyTorchJob, once the account is labelled")
        await wait_for(
            lambda: (cluster.condition("s3", "ChildCreated") or {}).get("status") == "True",
            what="ChildCreated True",
        )
    assert runner.exception is None
    assert cluster.creates("pytorchjobs") == 1


async def test_a_labelled_account_is_accepted(cluster: Cluster) -> None:
    await cluster.add_service_account("training-s3")  # labelled, as an admin does
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("s3", serviceAccountName="training-s3"))
        job = await wait_for(lambda: cluster.job("s3"), what="the PyTorchJob")
    assert runner.exception is None
    assert (
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["serviceAccountName"]
        == "training-s3"
    )


async def test_an_account_the_allow_list_names_is_accepted_unlabelled(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BTJ_ALLOWED_SERVICE_ACCOUNTS", f'["default", "{NAMESPACE}/training-s3"]')
    await cluster.add_service_account("training-s3", allowed=False)
    await cluster.add_service_account("other", allowed=False)
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("listed", serviceAccountName="training-s3"))
        await cluster.apply(btj("unlisted", serviceAccountName="other"))
        await wait_for(lambda: cluster.job("listed"), what="the listed account's PyTorchJob")
        created = await wait_for(lambda: cluster.condition("unlisted", "ChildCreated"), what="ChildCreated")
    assert runner.exception is None
    assert created["reason"] == SERVICE_ACCOUNT_NOT_ALLOWED and cluster.job("unlisted") is None


async def test_with_an_empty_allow_list_the_default_account_needs_the_label(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BTJ_ALLOWED_SERVICE_ACCOUNTS", "[]")
    await cluster.add_service_account("default", allowed=False)
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("plain"))
        created = await wait_for(lambda: cluster.condition("plain", "ChildCreated"), what="ChildCreated")
        assert created["reason"] == SERVICE_ACCOUNT_NOT_ALLOWED
        assert created["message"].startswith(
            "spec.serviceAccountName: unset, so the pods would run as ServiceAccount default of namespace "
            f"{NAMESPACE} is not allowed"
        ), created["message"]
        await cluster.label_service_account("default", {TRAINING_ACCOUNT_LABEL: "true"})
        await wait_for(lambda: cluster.job("plain"), what="the PyTorchJob, once default is labelled")
    assert runner.exception is None


async def test_a_waiting_child_is_not_changed_to_an_account_no_admin_allowed(cluster: Cluster) -> None:
    # A child that has not started would take a new pod template in place; its pods would then run as the
    # new account. The change is held, the child keeps the account it was made with.
    await cluster.add_service_account("training-s3")
    await cluster.add_service_account("other", allowed=False)
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("edit", serviceAccountName="training-s3"))
        await wait_for(lambda: cluster.job("edit"), what="the PyTorchJob")
        await cluster.patch_spec("edit", {"serviceAccountName": "other"})
        applied = await wait_for(
            lambda: (
                (cluster.condition("edit", "SpecApplied") or {}).get("reason") == SERVICE_ACCOUNT_NOT_ALLOWED
                and cluster.condition("edit", "SpecApplied")
            ),
            what="SpecApplied False",
        )
    assert runner.exception is None
    assert applied["status"] == "False" and applied["message"].startswith(
        "spec.serviceAccountName: ServiceAccount other of namespace"
    )
    job = cluster.job("edit")
    assert (
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["serviceAccountName"]
        == "training-s3"
    )


def test_the_policy_reads_names_and_namespaced_names(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = AccountPolicy(operator=("btj-system", OPERATOR), allowed=("default", "team-a/training-s3"))
    assert policy.is_operators("btj-system", OPERATOR) and not policy.is_operators("team-a", OPERATOR)
    assert policy.listed("team-b", "default") and policy.listed("team-a", "training-s3")
    assert not policy.listed("team-b", "training-s3")
    assert marked({"metadata": {"labels": {TRAINING_ACCOUNT_LABEL: "true"}}})
    assert not marked({"metadata": {"labels": {TRAINING_ACCOUNT_LABEL: "yes"}}}) and not marked({})
    monkeypatch.setenv("BTJ_ALLOWED_SERVICE_ACCOUNTS", "[]")
    assert operator_environment().allowed_service_accounts == (), "an empty list is no account, not unset"
    monkeypatch.setenv("BTJ_ALLOWED_SERVICE_ACCOUNTS", "training-s3")
    with pytest.raises(ValueError, match="BTJ_ALLOWED_SERVICE_ACCOUNTS='training-s3': not a JSON list"):
        operator_environment()

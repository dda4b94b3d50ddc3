"""What the pods name must exist: a missing ServiceAccount holds the create and says why; a missing Secret
warns (opt-in). The real operator under KopfRunner against the KMock API server."""

from __future__ import annotations

import pytest

from blackwell_operator.lifecycle.references import (
    CHECKPOINT_PATH_IN_USE,
    SERVICE_ACCOUNT_MISSING,
    SERVICE_ACCOUNT_NOT_ALLOWED,
    pull_secrets_condition,
    service_account_missing,
    would_create,
)
from blackwell_operator.testing.emulator import (
    HYPERPOD_RESOURCE,
    TRAINING_RUNTIME_RESOURCE,
    TRAINJOB_RESOURCE,
)
from tests.operator.harness import NAMESPACE, Cluster, btj, from_operator, running_operator, verb_of, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _quick_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    # The resync loop's longest backoff: one second, so that a fix is picked up within the test.
    monkeypatch.setenv("BTJ_CHILD_RETRY_INTERVAL_S", "1")


def reads(cluster: Cluster, plural: str, name: str) -> int:
    """The operator's GETs of one named object."""
    return sum(
        1
        for r in cluster.k.requests
        if from_operator(r)
        and verb_of(r) == "get"
        and r.resource is not None
        and r.resource.plural == plural
        and r.name == name
    )


async def test_a_missing_service_account_holds_the_create_until_it_exists(cluster: Cluster) -> None:
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("s3", serviceAccountName="training-s3"))
        created = await wait_for(lambda: cluster.condition("s3", "ChildCreated"), what="ChildCreated")
        assert (created["status"], created["reason"]) == ("False", SERVICE_ACCOUNT_MISSING)
        assert created["message"].startswith(
            f"spec.serviceAccountName: ServiceAccount training-s3 does not exist in namespace {NAMESPACE}"
        )
        assert (
            f"Fix: create it (kubectl -n {NAMESPACE} create serviceaccount training-s3" in created["message"]
        )
        status = cluster.status("s3")
        assert status["phase"] == "Pending" and "Waiting for its ServiceAccount" in status["message"]
        assert status["plan"], "the plan is there to read while it waits"
        # The resync loop looks again with its backoff; nothing is made meanwhile, one Event says why.
        await wait_for(lambda: reads(cluster, "serviceaccounts", "training-s3") >= 3, what="two more looks")
        assert cluster.job("s3") is None and cluster.config_map("s3-plan") is None
        assert cluster.creates("pytorchjobs") == 0 and cluster.creates("configmaps") == 0
        warnings = [e for e in cluster.events("s3") if e["reason"] == SERVICE_ACCOUNT_MISSING]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
        assert "spec.serviceAccountName" in warnings[0]["message"]

        await cluster.add_service_account("training-s3")
        job = await wait_for(lambda: cluster.job("s3"), what="the PyTorchJob, once the account exists")
        await wait_for(
            lambda: (cluster.condition("s3", "ChildCreated") or {}).get("status") == "True",
            what="ChildCreated True",
        )
    assert runner.exception is None
    assert (
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["serviceAccountName"]
        == "training-s3"
    )
    assert cluster.config_map("s3-plan") is not None
    assert cluster.creates("pytorchjobs") == 1


def checkpointed(name: str, path: str) -> dict[str, object]:
    """A BTJ that saves its checkpoints to `path` on the shared volume."""
    training = {"sequenceLength": 8192, "steps": 1000, "checkpoint": {"path": path}}
    volumes = [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}]
    return btj(name, training=training, volumes=volumes)


async def test_a_second_btj_with_the_same_checkpoint_path_is_refused_naming_the_first(
    cluster: Cluster,
) -> None:
    async with running_operator(cluster) as runner:
        await cluster.apply(checkpointed("first", "/fsx/ckpt/llama"))
        await wait_for(lambda: cluster.job("first"), what="the first job's PyTorchJob")
        # The same folder, written another way: two jobs would resume each other's checkpoints.
        await cluster.apply(checkpointed("second", "/fsx/ckpt/llama/"))
        created = await wait_for(lambda: cluster.condition("second", "ChildCreated"), what="ChildCreated")
        assert (created["status"], created["reason"]) == ("False", CHECKPOINT_PATH_IN_USE)
        assert created["message"].startswith(
            "spec.training.checkpoint.path: /fsx/ckpt/llama is the checkpoint folder of BlackwellTrainingJob "
            f"first in namespace {NAMESPACE}"
        )
        assert "spec.training.checkpoint.startFrom: /fsx/ckpt/llama" in created["message"]
        status = cluster.status("second")
        assert status["phase"] == "Pending" and "Waiting for its checkpoint folder" in status["message"]
        # The resync loop looks again; nothing of the second job is made meanwhile, one Event says why.
        looked = reads_of_btjs(cluster)
        await wait_for(lambda: reads_of_btjs(cluster) >= looked + 2, what="two more looks")
        assert cluster.job("second") is None and cluster.config_map("second-plan") is None
        assert cluster.creates("pytorchjobs") == 1 and cluster.creates("configmaps") == 1
        warnings = [e for e in cluster.events("second") if e["reason"] == CHECKPOINT_PATH_IN_USE]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
        # A third job of its own folder is not held up.
        await cluster.apply(checkpointed("third", "/fsx/ckpt/other"))
        await wait_for(lambda: cluster.job("third"), what="the third job's PyTorchJob")
        assert cluster.condition("first", "ChildCreated")["status"] == "True"  # type: ignore[index]

        # The folder is free once the first job is gone: the second is created then.
        await cluster.delete_btj("first")
        await wait_for(
            lambda: cluster.job("second"), what="the second job's PyTorchJob, once the folder is free"
        )
        await wait_for(
            lambda: (cluster.condition("second", "ChildCreated") or {}).get("status") == "True",
            what="ChildCreated True",
        )
    assert runner.exception is None


def reads_of_btjs(cluster: Cluster) -> int:
    """The operator's LISTs of the namespace's BTJs (the checkpoint-folder check's read)."""
    return sum(
        1
        for r in cluster.k.requests
        if from_operator(r)
        and verb_of(r) == "list"
        and r.resource is not None
        and r.resource.plural == "blackwelltrainingjobs"
        and r.name is None
    )


@pytest.mark.parametrize(
    ("backend", "resource"), [("HyperPodPyTorchJob", HYPERPOD_RESOURCE), ("TrainJob", TRAINJOB_RESOURCE)]
)
async def test_no_kind_of_child_is_half_made_without_its_account(
    cluster: Cluster, backend: str, resource: str
) -> None:
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("other", backend=backend, serviceAccountName="training-s3"))
        created = await wait_for(lambda: cluster.condition("other", "ChildCreated"), what="ChildCreated")
        assert created["reason"] == SERVICE_ACCOUNT_MISSING
        # Neither the job nor what it references (the plan ConfigMap, a TrainJob's TrainingRuntime).
        assert cluster.job("other", resource) is None and cluster.config_map("other-plan") is None
        assert cluster.job("other", TRAINING_RUNTIME_RESOURCE) is None
        await cluster.add_service_account("training-s3")
        await wait_for(lambda: cluster.job("other", resource), what=f"the {backend}")
    assert runner.exception is None


async def test_a_refused_read_of_a_listed_account_is_advisory(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chart without the grant (403), for an account the allow-list names: whether it exists is advisory,
    # the job is created as before.
    monkeypatch.setenv("BTJ_ALLOWED_SERVICE_ACCOUNTS", f'["{NAMESPACE}/training-s3"]')
    cluster.k.inject_fault("get", "serviceaccounts", 403, times=100)
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("nocheck", serviceAccountName="training-s3"))
        await wait_for(lambda: cluster.job("nocheck"), what="the PyTorchJob")
        created = await wait_for(lambda: cluster.condition("nocheck", "ChildCreated"), what="ChildCreated")
    assert runner.exception is None and created["status"] == "True"
    assert not [e for e in cluster.events("nocheck") if e["reason"] == SERVICE_ACCOUNT_MISSING]


async def test_a_refused_read_of_an_unlisted_account_holds_the_child(cluster: Cluster) -> None:
    # Whether an admin labelled it cannot be told: the account decides the pods' rights, so it fails closed.
    await cluster.add_service_account("training-s3")
    cluster.k.inject_fault("get", "serviceaccounts", 403, times=100)
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("nocheck", serviceAccountName="training-s3"))
        created = await wait_for(lambda: cluster.condition("nocheck", "ChildCreated"), what="ChildCreated")
    assert runner.exception is None
    assert (created["status"], created["reason"]) == ("False", SERVICE_ACCOUNT_NOT_ALLOWED)
    assert created["message"].startswith(
        f"spec.serviceAccountName: ServiceAccount training-s3 of namespace {NAMESPACE} could not be read"
    )
    assert "Fix: grant the operator get on serviceaccounts" in created["message"]
    assert cluster.job("nocheck") is None and cluster.config_map("nocheck-plan") is None


async def test_no_service_account_named_is_no_read(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("plain"))
        await wait_for(lambda: cluster.job("plain"), what="the PyTorchJob")
    assert not any(
        r.resource is not None and r.resource.plural == "serviceaccounts" for r in cluster.k.requests
    )


async def test_missing_pull_secrets_warn_and_the_job_is_created(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BTJ_CHECK_IMAGE_PULL_SECRETS", "true")
    await cluster.add_secret("regcred")
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("pull", imagePullSecrets=[{"name": "regcred"}, {"name": "ecr-pull"}]))
        await wait_for(lambda: cluster.job("pull"), what="the PyTorchJob, made all the same")
        found = await wait_for(
            lambda: cluster.condition("pull", "ImagePullSecretsFound"), what="the condition"
        )
        assert (found["status"], found["reason"]) == ("False", "ImagePullSecretMissing")
        assert found["message"].startswith(
            f"spec.imagePullSecrets[1].name: Secret ecr-pull does not exist in namespace {NAMESPACE}"
        )
        await wait_for(
            lambda: [e for e in cluster.events("pull") if e["reason"] == "ImagePullSecretMissing"],
            what="a Warning Event",
        )
        # Fixed: the spec names only the Secret that exists.
        await cluster.patch_spec("pull", {"imagePullSecrets": [{"name": "regcred"}]})
        await wait_for(
            lambda: (cluster.condition("pull", "ImagePullSecretsFound") or {}).get("status") == "True",
            what="ImagePullSecretsFound True",
        )
    assert runner.exception is None
    assert (cluster.condition("pull", "ChildCreated") or {}).get("status") == "True"
    assert cluster.k.live_objects("v1/secrets", NAMESPACE)[0]["data"], "read, never changed"


async def test_pull_secrets_are_not_read_unless_the_check_is_on(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("pull", imagePullSecrets=[{"name": "regcred"}]))
        await wait_for(lambda: cluster.job("pull"), what="the PyTorchJob")
    assert not any(r.resource is not None and r.resource.plural == "secrets" for r in cluster.k.requests)
    assert cluster.condition("pull", "ImagePullSecretsFound") is None


def test_only_a_create_waits_for_the_account() -> None:
    assert would_create({}, 1, child_exists=False), "the first child"
    assert not would_create({"phase": "Running"}, 1, child_exists=True), "a running job keeps running"
    finished = {"phase": "Succeeded", "observedGeneration": 1, "child": {"uid": "u1"}}
    assert not would_create(finished, 1, child_exists=False), "a finished job is never run again"
    assert not would_create(finished, 2, child_exists=False), "edited before its end was recorded: not run"
    gone = {"type": "ChildCreated", "status": "False", "reason": "ChildDeleted", "observedGeneration": 1}
    recorded = {
        **finished,
        "conditions": [{**gone, "message": "", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
    }
    assert would_create(recorded, 2, child_exists=False), "a spec edited after its end runs anew"
    assert would_create({"phase": "Running", "observedGeneration": 1}, 1, child_exists=False), "re-created"


def test_the_messages_name_the_field_and_the_fix() -> None:
    message = service_account_missing("sa", "ns")
    assert message.startswith("spec.serviceAccountName: ServiceAccount sa does not exist in namespace ns")
    assert "Fix: create it" in message and "or change spec.serviceAccountName" in message
    missing = pull_secrets_condition(["a", "b", "c"], ["b", "c"], "ns")
    assert (missing.status, missing.reason) == ("False", "ImagePullSecretMissing")
    assert missing.message.startswith(
        "spec.imagePullSecrets[1].name: Secret b does not exist in namespace ns (also missing: c)"
    )
    found = pull_secrets_condition([], [], "ns")
    assert (found.status, found.reason) == ("True", "Found")

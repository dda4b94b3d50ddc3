"""Specs the CRD forbids, reaching the operator where the CRD is not enforced: phase Invalid, no child."""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.harness import Cluster, btj, running_operator, wait_for

pytestmark = pytest.mark.integration

B200 = {"instanceType": "ml.p6-b200.48xlarge"}


def _with_spec(name: str, spec: Any) -> dict[str, Any]:
    manifest = btj(name)
    manifest["spec"] = spec
    return manifest


# name, manifest, the field the reason names first. The emulated API server does not enforce our CRD
# (as a cluster with an older CRD installed would not): the operator is the last line.
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "nodes-string": (btj("nodes-string", cluster={**B200, "nodes": "2"}), "spec.cluster.nodes"),
    "nodes-true": (btj("nodes-true", cluster={**B200, "nodes": True}), "spec.cluster.nodes"),
    "dry-run-string": (btj("dry-run-string", dryRun="false"), "spec.dryRun"),
    "beyond-int64": (btj("beyond-int64", maxRetries=2**64), "spec.maxRetries"),
    "toleration-cel": (
        btj("toleration-cel", tolerations=[{"operator": "Exists", "value": "x"}]),
        "spec.tolerations[0]",
    ),
    "name-with-dot": (btj("name.with.dot"), "metadata.name"),
    # A list-map key of the wrong type: once a TypeError retried for ever with no status.
    "env-name-list": (btj("env-name-list", env=[{"name": ["A"], "value": "1"}]), "spec.env[0].name"),
    "volume-name-map": (
        btj("volume-name-map", volumes=[{"name": {"a": 1}, "claimName": "c", "mountPath": "/x"}]),
        "spec.volumes[0].name",
    ),
    # The operator's own variables and the trainer's checks (blackwell_trainer.plan.env_vars, issue 36).
    "env-operators-variable": (
        btj("env-operators-variable", env=[{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "x"}]),
        "spec.env[0].name",
    ),
    "env-metrics-address": (
        btj("env-metrics-address", env=[{"name": "BTJ_METRICS_ADDRESS", "value": "localhost"}]),
        "spec.env[0].value",
    ),
    "spec-string": (_with_spec("spec-string", "train llama"), "spec"),
    "spec-list": (_with_spec("spec-list", [1, 2]), "spec"),
    "spec-number": (_with_spec("spec-number", 7), "spec"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_spec_the_crd_forbids_is_invalid_with_no_child(cluster: Cluster, case: str) -> None:
    manifest, field = CASES[case]
    name = manifest["metadata"]["name"]
    async with running_operator(cluster) as runner:
        await cluster.apply(manifest)
        await wait_for(lambda: cluster.status(name).get("phase") == "Invalid", what="phase Invalid")
        await wait_for(
            lambda: any(e["reason"] == "InvalidSpec" for e in cluster.events(name)), what="a Warning Event"
        )
    assert runner.exception is None
    planned = cluster.condition(name, "Planned")
    assert planned["status"] == "False" and planned["reason"] == "InvalidSpec"
    assert planned["message"].startswith(field + ":"), planned["message"]
    assert "\n" not in planned["message"]
    assert cluster.status(name)["message"] == planned["message"]
    assert cluster.job(name) is None and cluster.config_map(f"{name}-plan") is None, "no child"


# Issue 26: fields the BTJ copies into the pods, which the child job's API accepts and only the pods'
# creation refuses (docs/reference/pod-validation.md): the operator refuses them before any child,
# naming the field. name, spec fields, the field path the reason starts with, a word of the reason.
POD_CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "toleration-seconds-no-schedule": (
        {"tolerations": [{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30}]},
        "spec.tolerations",
        "NoExecute",
    ),
    "env-name-with-equals": ({"env": [{"name": "A=B", "value": "1"}]}, "spec.env", "'='"),
    "image-with-spaces": ({"image": " trainer:1 "}, "spec.image", "whitespace"),
    "toleration-value-with-space": (
        {"tolerations": [{"key": "gpu", "value": "a b"}]},
        "spec.tolerations",
        "label value",
    ),
}


@pytest.mark.parametrize("case", sorted(POD_CASES))
async def test_a_field_the_pods_would_refuse_is_invalid_naming_it(cluster: Cluster, case: str) -> None:
    fields, field, word = POD_CASES[case]
    name = f"pod-{case}"
    async with running_operator(cluster) as runner:
        await cluster.apply(btj(name, **fields))
        await wait_for(lambda: cluster.status(name).get("phase") == "Invalid", what="phase Invalid")
    assert runner.exception is None
    message = cluster.condition(name, "Planned")["message"]
    assert message.startswith(field) and word in message, message
    assert cluster.job(name) is None and cluster.config_map(f"{name}-plan") is None, "no child"


# A value no status or Event may repeat: status and Events are read by more people than wrote the spec, and
# spec.env is where credentials end up.
SECRET = "hunter2-0451-secret"
ECHOES: dict[str, dict[str, Any]] = {
    "env-value-object": btj("env-value-object", env=[{"name": "TOKEN", "value": {"password": SECRET}}]),
    "env-value-list": btj("env-value-list", env=[{"name": "TOKEN", "value": [SECRET]}]),
    "metrics-address": btj("metrics-address", env=[{"name": "BTJ_METRICS_ADDRESS", "value": SECRET}]),
    "image-object": btj("image-object", image={"auth": SECRET}),
    "backend-enum": btj("backend-enum", backend=SECRET),
    "label-value": btj("label-value", podLabels={"team": f"{SECRET}!"}),
    # Issue 36 item 5, more hostile values: a huge string, a secret where a name or a number is expected,
    # one nested deep, and values refused past the schema (by the planner, by the catalogs).
    "image-huge": btj("image-huge", image=f"registry.example/{SECRET}/" + "a" * 200_000 + ":1"),
    "annotation-huge": btj("annotation-huge", podAnnotations={"note": SECRET * 20_000}),
    "preset-unknown": btj("preset-unknown", model={"preset": SECRET}),
    "nodes-secret": btj("nodes-secret", cluster={**B200, "nodes": SECRET}),
    "instance-type-secret": btj("instance-type-secret", cluster={"instanceType": SECRET, "nodes": 2}),
    "toleration-value-object": btj(
        "toleration-value-object", tolerations=[{"key": "k", "operator": "Equal", "value": {"v": [SECRET]}}]
    ),
    "queue-name": btj("queue-name", queueName=f"{SECRET} !"),
    "checkpoint-path": btj(
        "checkpoint-path",
        training={"sequenceLength": 8192, "steps": 1000, "checkpoint": {"path": f"relative/{SECRET}"}},
    ),
    "weights-uri": btj("weights-uri", model={"preset": "llama3.1-8b", "weights": {"uri": f"ftp://{SECRET}"}}),
    "account-name": btj("account-name", serviceAccountName=f"{SECRET}_NOT_A_NAME"),
    # A refusal of a whole section (spec.model) that reasons about a string written inside it.
    "weights-alone": btj(
        "weights-alone",
        model={"weights": {"uri": f"/fsx/{SECRET}/llama"}},
        volumes=[{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
    ),
}


@pytest.mark.parametrize("case", sorted(ECHOES))
async def test_no_spec_value_reaches_status_or_events(cluster: Cluster, case: str) -> None:
    manifest = ECHOES[case]
    name = manifest["metadata"]["name"]
    async with running_operator(cluster) as runner:
        await cluster.apply(manifest)
        await wait_for(lambda: cluster.status(name).get("phase") == "Invalid", what="phase Invalid")
        await wait_for(lambda: cluster.events(name), what="its Event")
    assert runner.exception is None
    status, events = cluster.status(name), cluster.events(name)
    assert SECRET not in repr(status) and SECRET not in repr(events), (status, events)
    # The field and its type stay: what to fix is still said.
    assert status["message"].startswith("spec."), status["message"]


async def test_a_valid_job_s_values_stay_in_its_pods(cluster: Cluster) -> None:
    # A job that plans and runs: its env and annotation values go to the pods that need them, and to no
    # status field or Event on the way (its plan, its conditions, the child's creation).
    manifest = btj(
        "valid-secret",
        env=[{"name": "WANDB_API_KEY", "value": SECRET}],
        podAnnotations={"team.example/token": SECRET},
    )
    async with running_operator(cluster) as runner:
        await cluster.apply(manifest)
        await wait_for(lambda: cluster.condition("valid-secret", "ChildCreated"), what="ChildCreated")
        await wait_for(lambda: cluster.events("valid-secret"), what="its Events")
        await cluster.settle("valid-secret")
    assert runner.exception is None
    status, events = cluster.status("valid-secret"), cluster.events("valid-secret")
    assert SECRET not in repr(status) and SECRET not in repr(events), (status, events)
    assert SECRET in repr(cluster.job("valid-secret")), "the pods still get it"

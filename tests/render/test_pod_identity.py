"""The trainer pods' service account, pull secrets, labels and annotations: admitted, refused, rendered."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from blackwell_operator.models import BlackwellTrainingJob, BlackwellTrainingJobSpec
from blackwell_operator.models.pod import (
    MAX_ANNOTATION_VALUE,
    MAX_KEY,
    MAX_POD_ANNOTATIONS,
    RESERVED_LABELS,
    RESERVED_PREFIX,
    TOTAL_ANNOTATION_LIMIT,
)
from blackwell_operator.models.spec import API_GROUP, DEFAULT_IMAGE
from blackwell_operator.render import render_children
from blackwell_operator.render.crd import generate_crd
from blackwell_operator.render.labels import own_labels
from blackwell_operator.render.pod import PLAN_HASH_ANNOTATION
from tests.support.k8s_schema import (
    PYTORCHJOB_CRDS,
    SCHEMA_MISSING,
    admit,
    btj_schema_and_validator,
    crd_open_api_schema,
    kubernetes_errors,
    load_crd,
    schema_errors,
    strict_validator,
)
from tests.support.plans import plan_for

SCHEMA, VALIDATOR = btj_schema_and_validator(generate_crd())
NAMESPACE = "hyperpod-ns-team-a"
IDENTITY: dict[str, Any] = {
    "serviceAccountName": "training-s3",
    "imagePullSecrets": [{"name": "regcred"}, {"name": "ecr.team-a"}],
    "podLabels": {"team": "a", "cost-center.example.com/id": "ml-42", "empty": ""},
    "podAnnotations": {"fluentbit.io/parser": "json", "note": "free text: any characters, even / and ="},
}


def manifest(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": "job", "namespace": NAMESPACE},
        "spec": {"model": {"preset": "llama3.1-8b"}, **spec},
    }


def model_error(obj: dict[str, Any]) -> str | None:
    try:
        BlackwellTrainingJob.model_validate(obj)
    except ValidationError as exc:
        return str(exc)
    return None


def test_a_spec_with_every_field_is_admitted_and_parsed() -> None:
    obj = manifest(**IDENTITY)
    assert admit(SCHEMA, VALIDATOR, obj) == []
    spec = BlackwellTrainingJob.model_validate(obj).spec
    assert spec.service_account_name == "training-s3"
    assert [secret.name for secret in spec.image_pull_secrets] == ["regcred", "ecr.team-a"]


LONG_PREFIX = "a" * 254 + "/x"
BAD: dict[str, tuple[dict[str, Any], str, str]] = {
    # case: (spec fields, what the API server says, what the models say)
    "service-account-upper": ({"serviceAccountName": "Training"}, "serviceAccountName", "ServiceAccount"),
    "service-account-long": ({"serviceAccountName": "a" * 254}, "serviceAccountName", "at most 253"),
    "pull-secret-name": ({"imagePullSecrets": [{"name": "reg_cred"}]}, "imagePullSecrets", "Secret name"),
    "pull-secret-twice": (
        {"imagePullSecrets": [{"name": "regcred"}, {"name": "regcred"}]},
        "duplicate entry",
        "listed twice",
    ),
    "pull-secret-no-name": ({"imagePullSecrets": [{}]}, "'name' is a required property", "name"),
    "label-key-space": ({"podLabels": {"my team": "a"}}, "podLabels keys", "qualified name"),
    "label-key-prefix-upper": ({"podLabels": {"Example.com/team": "a"}}, "podLabels keys", "qualified name"),
    "label-key-name-64": ({"podLabels": {"a" * 64: "x"}}, "podLabels keys", "qualified name"),
    "label-key-prefix-254": ({"podLabels": {LONG_PREFIX: "x"}}, "podLabels keys", "qualified name"),
    "label-key-empty-name": ({"podLabels": {"example.com/": "x"}}, "podLabels keys", "qualified name"),
    "label-value-space": ({"podLabels": {"team": "team a"}}, "podLabels.team", "not a label value"),
    "label-value-64": ({"podLabels": {"team": "a" * 64}}, "podLabels.team", "not a label value"),
    "label-value-number": ({"podLabels": {"team": 1}}, "podLabels.team", "valid string"),
    "label-reserved-job-name": (
        {"podLabels": {f"{API_GROUP}/job-name": "other"}},
        "must not set",
        "the operator sets",
    ),
    "label-reserved-managed-by": (
        {"podLabels": {"app.kubernetes.io/managed-by": "me"}},
        "must not set",
        "the operator sets",
    ),
    "annotation-reserved-default-container": (
        {"podAnnotations": {"kubectl.kubernetes.io/default-container": "sidecar"}},
        "must not set",
        "the operator sets",
    ),
    "annotation-reserved-plan-hash": (
        {"podAnnotations": {PLAN_HASH_ANNOTATION: "0"}},
        "must not set",
        "the operator sets",
    ),
    "annotation-key-slashes": ({"podAnnotations": {"a/b/c": "x"}}, "podAnnotations keys", "qualified name"),
    "annotation-value-long": (
        {"podAnnotations": {"big": "x" * (MAX_ANNOTATION_VALUE + 1)}},
        "podAnnotations.big",
        "more than 8192",
    ),
    "annotation-too-many": (
        {"podAnnotations": {f"k{i}": "v" for i in range(MAX_POD_ANNOTATIONS + 1)}},
        "podAnnotations",
        "at most 24",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_values_are_refused_by_the_crd_and_the_models_alike(case: str) -> None:
    fields, server_says, models_say = BAD[case]
    obj = manifest(**fields)
    errors = admit(SCHEMA, VALIDATOR, obj)
    assert any(server_says in error for error in errors), errors
    problem = model_error(obj)
    assert problem is not None and models_say in problem, problem


def test_refusals_name_the_field_and_the_fix_in_one_line() -> None:
    from blackwell_operator.cli.manifest import format_validation_error

    with pytest.raises(ValidationError) as caught:
        BlackwellTrainingJob.model_validate(manifest(podLabels={"team": "team a"}))
    (line,) = format_validation_error(caught.value).splitlines()
    assert line.startswith("spec.podLabels: ") and "Fix:" in line and "podAnnotations" in line


KEY_ALPHABET = st.sampled_from([*"abAZ09", "-", "_", ".", "/", " "])
KEYS = st.one_of(
    st.text(KEY_ALPHABET, min_size=0, max_size=12),
    st.builds("{}/{}".format, st.text(KEY_ALPHABET, max_size=6), st.text(KEY_ALPHABET, max_size=8)),
    st.sampled_from(
        [LONG_PREFIX, "a" * 253 + "/x", "a" * 63, "a" * 64, f"{RESERVED_PREFIX}x", *RESERVED_LABELS]
    ),
)
VALUES = st.one_of(st.text(KEY_ALPHABET, max_size=8), st.sampled_from(["a" * 63, "a" * 64, ""]))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.dictionaries(KEYS, VALUES, max_size=3), st.sampled_from(["podLabels", "podAnnotations"]))
def test_the_models_and_the_crd_agree_on_every_key_and_value(metadata: dict[str, str], field: str) -> None:
    obj = manifest(**{field: metadata})
    assert (admit(SCHEMA, VALIDATOR, obj) == []) == (model_error(obj) is None), metadata


def test_the_annotation_bounds_keep_a_pod_under_the_api_servers_limit() -> None:
    worst_user_share = MAX_POD_ANNOTATIONS * (MAX_KEY + MAX_ANNOTATION_VALUE)
    _, job = render_children("job", NAMESPACE, spec_of(), plan_for(spec_of(), "job"))
    own = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"]
    assert worst_user_share + sum(len(k) + len(v) for k, v in own.items()) < TOTAL_ANNOTATION_LIMIT


def test_the_reserved_keys_cover_every_label_the_operator_sets() -> None:
    assert f"{API_GROUP}/" == RESERVED_PREFIX
    for key in own_labels("job"):
        assert key.startswith(RESERVED_PREFIX) or key in RESERVED_LABELS, key


# ----- rendering -----


def spec_of(**fields: Any) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate({"model": {"preset": "llama3.1-8b"}, **fields})


def templates(job: dict[str, Any]) -> list[dict[str, Any]]:
    if job["kind"] == "TrainingRuntime":
        return [
            replicated["template"]["spec"]["template"]
            for replicated in job["spec"]["template"]["spec"]["replicatedJobs"]
        ]
    if job["kind"] == "PyTorchJob":
        return [replica["template"] for replica in job["spec"]["pytorchReplicaSpecs"].values()]
    return [replica["template"] for replica in job["spec"]["replicaSpecs"]]


@pytest.mark.parametrize("backend", ["PyTorchJob", "HyperPodPyTorchJob", "TrainJob"])
def test_every_backend_renders_the_identity_on_its_pods(backend: str) -> None:
    spec = spec_of(backend=backend, **IDENTITY)
    *_, job = children = render_children(
        "job", NAMESPACE, spec, plan_for(spec, "job"), labels={"team": "from-btj"}
    )
    # A TrainJob's pod template lives in its TrainingRuntime.
    holder = children[1] if backend == "TrainJob" else job
    assert templates(holder)
    for template in templates(holder):
        pod = template["spec"]
        assert pod["serviceAccountName"] == "training-s3"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "ecr.team-a"}]
        labels, annotations = template["metadata"]["labels"], template["metadata"]["annotations"]
        assert labels["team"] == "a", "the spec's pod label wins over the BTJ's propagated one"
        assert labels["cost-center.example.com/id"] == "ml-42" and labels[f"{API_GROUP}/job-name"] == "job"
        assert annotations["fluentbit.io/parser"] == "json" and PLAN_HASH_ANNOTATION in annotations
        assert annotations["kubectl.kubernetes.io/default-container"] in ("pytorch", "node")
        pod_object = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", **template["metadata"]}}
        assert kubernetes_errors({**pod_object, "spec": pod}) is None
    assert "fluentbit.io/parser" not in job["metadata"].get("annotations", {}), "pods only, not the job"
    assert "cost-center.example.com/id" not in job["metadata"]["labels"]


def test_without_the_fields_the_pods_are_as_before() -> None:
    _, job = render_children("job", NAMESPACE, spec_of(), plan_for(spec_of(), "job"))
    (template,) = templates(job)
    assert "serviceAccountName" not in template["spec"] and "imagePullSecrets" not in template["spec"]
    assert sorted(template["metadata"]["annotations"]) == [
        "kubectl.kubernetes.io/default-container",
        PLAN_HASH_ANNOTATION,
    ]


@pytest.mark.parametrize("name", sorted(PYTORCHJOB_CRDS))
def test_the_pytorchjob_with_the_identity_validates_against_the_real_crd(name: str) -> None:
    path = PYTORCHJOB_CRDS[name]
    if not path.is_file():
        pytest.skip(f"{path} {SCHEMA_MISSING}")
    validator: jsonschema.Draft4Validator = strict_validator(
        crd_open_api_schema(load_crd(path), "v1"), api_version="kubeflow.org/v1", kind="PyTorchJob"
    )
    spec = spec_of(**IDENTITY)
    _, job = render_children("job", NAMESPACE, spec, plan_for(spec, "job"))
    assert schema_errors(validator, job) == []


def image_of(job: dict[str, Any]) -> str:
    (template,) = templates(job)
    return str(template["spec"]["containers"][0]["image"])


def test_a_spec_without_an_image_gets_the_operators_default() -> None:
    spec = spec_of()
    assert spec.image is None
    plan = plan_for(spec, "job")
    assert image_of(render_children("job", NAMESPACE, spec, plan)[1]) == DEFAULT_IMAGE
    mine = "123456789012.dkr.ecr.us-west-2.amazonaws.com/blackwell-trainer:0.1.0"
    assert image_of(render_children("job", NAMESPACE, spec, plan, default_image=mine)[1]) == mine
    pinned = spec_of(image="registry.example.com/trainer:dev")
    assert (
        image_of(render_children("job", NAMESPACE, pinned, plan, default_image=mine)[1])
        == "registry.example.com/trainer:dev"
    ), "the spec's image wins"

"""spec.volumes: claims mounted into both backends' pods, and where checkpoints and shards may live."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from blackwell_operator.errors import SpecError
from blackwell_operator.models import BlackwellTrainingJob, BlackwellTrainingJobSpec
from blackwell_operator.models.spec import OPERATOR_VOLUMES
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.storage import check_storage
from blackwell_operator.render import render_children
from blackwell_operator.render.crd import generate_crd
from tests.support.crd_manifests import bad_manifests
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

NAMESPACE = "hyperpod-ns-team-a"
SCHEMA, VALIDATOR = btj_schema_and_validator(generate_crd())
FSX = {"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}
DATASETS = {
    "name": "datasets",
    "claimName": "fsx-claim",
    "mountPath": "/datasets",
    "readOnly": True,
    "subPath": "tokenized/fineweb",
}


def spec_of(**overrides: Any) -> dict[str, Any]:
    return {"model": {"preset": "llama3.1-8b"}, "cluster": {"nodes": 2}, **overrides}


def job_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": "job", "namespace": NAMESPACE},
        "spec": spec,
    }


def rendered_pod_specs(spec: BlackwellTrainingJobSpec) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The child job and every pod spec of its templates."""
    _, job = render_children("job", NAMESPACE, spec, plan_for(spec, "job"))
    if job["kind"] == "PyTorchJob":
        templates = [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    else:
        templates = [r["template"] for r in job["spec"]["replicaSpecs"]]
    return job, [template["spec"] for template in templates]


BACKENDS = ["PyTorchJob", "HyperPodPyTorchJob"]
CHECKPOINTED = {
    "training": {"checkpoint": {"path": "/fsx/checkpoints/job"}},
    "volumes": [FSX, DATASETS],
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_claims_are_mounted_into_every_trainer_container(backend: str) -> None:
    spec = BlackwellTrainingJobSpec.model_validate(spec_of(backend=backend, **CHECKPOINTED))
    _, pods = rendered_pod_specs(spec)
    assert pods
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["fsx"] == {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}
        assert volumes["datasets"]["persistentVolumeClaim"] == {"claimName": "fsx-claim", "readOnly": True}
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["fsx"] == {"name": "fsx", "mountPath": "/fsx"}
        assert mounts["datasets"] == {
            "name": "datasets",
            "mountPath": "/datasets",
            "readOnly": True,
            "subPath": "tokenized/fineweb",
        }
        # The operator's own volumes come first, then the user's in spec order.
        assert [v["name"] for v in pod["volumes"]] == [*OPERATOR_VOLUMES, "fsx", "datasets"]


def test_operator_volumes_are_the_reserved_ones() -> None:
    # models/spec.py reserves these names and paths; they must be what render/pod.py mounts.
    _, pods = rendered_pod_specs(BlackwellTrainingJobSpec.model_validate(spec_of()))
    (container,) = pods[0]["containers"]
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]} == OPERATOR_VOLUMES
    assert [v["name"] for v in pods[0]["volumes"]] == list(OPERATOR_VOLUMES)


@pytest.mark.parametrize("crd", sorted(PYTORCHJOB_CRDS))
def test_pytorchjob_with_claims_validates_against_the_crd(crd: str) -> None:
    path = PYTORCHJOB_CRDS[crd]
    if not path.is_file():
        pytest.skip(f"{path} {SCHEMA_MISSING}")
    validator = strict_validator(
        crd_open_api_schema(load_crd(path), "v1"), api_version="kubeflow.org/v1", kind="PyTorchJob"
    )
    job, _ = rendered_pod_specs(BlackwellTrainingJobSpec.model_validate(spec_of(**CHECKPOINTED)))
    assert schema_errors(validator, job) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_pods_with_claims_are_valid_kubernetes_pods(backend: str) -> None:
    spec = BlackwellTrainingJobSpec.model_validate(spec_of(backend=backend, **CHECKPOINTED))
    _, pods = rendered_pod_specs(spec)
    for pod_spec in pods:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job-worker-0"}, "spec": pod_spec}
        assert kubernetes_errors(pod) is None


def test_no_volumes_renders_as_before() -> None:
    spec = BlackwellTrainingJobSpec.model_validate(spec_of())
    assert spec.volumes == []
    assert "volumes" not in spec.model_dump(by_alias=True, exclude_defaults=True)


def weighted(uri: str) -> dict[str, Any]:
    return {"preset": "llama3.1-8b", "weights": {"uri": uri}}


# (spec overrides, the field check_storage names or None when the spec is fine)
STORAGE_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "multi-node-on-fsx": (spec_of(**CHECKPOINTED), None),
    "multi-node-at-the-mount-root": (
        spec_of(training={"checkpoint": {"path": "/fsx"}}, volumes=[FSX]),
        None,
    ),
    "multi-node-no-volume": (
        spec_of(training={"checkpoint": {"path": "/fsx/ckpt"}}),
        "spec.training.checkpoint.path",
    ),
    "multi-node-read-only": (
        spec_of(training={"checkpoint": {"path": "/fsx/ckpt"}}, volumes=[{**FSX, "readOnly": True}]),
        "spec.training.checkpoint.path",
    ),
    "multi-node-local-nvme": (
        spec_of(training={"checkpoint": {"path": "/local/ckpt"}}, volumes=[FSX]),
        "spec.training.checkpoint.path",
    ),
    "multi-node-prefix-is-not-a-folder": (
        spec_of(training={"checkpoint": {"path": "/fsxdata/ckpt"}}, volumes=[FSX]),
        "spec.training.checkpoint.path",
    ),
    "multi-node-dot-dot-leaves-the-mount": (
        spec_of(training={"checkpoint": {"path": "/fsx/../tmp/ckpt"}}, volumes=[FSX]),
        "spec.training.checkpoint.path",
    ),
    "multi-node-s3-checkpoint": (
        spec_of(training={"checkpoint": {"path": "s3://bucket/ckpt"}}, volumes=[FSX]),
        "spec.training.checkpoint.path",
    ),
    "no-checkpoint": (spec_of(training={"checkpoint": {"path": ""}}), None),
    "single-node-local-nvme": (
        spec_of(cluster={"nodes": 1}, training={"checkpoint": {"path": "/local/ckpt"}}),
        None,
    ),
    "single-node-on-fsx": (
        spec_of(cluster={"nodes": 1}, training={"checkpoint": {"path": "/fsx/ckpt"}}, volumes=[FSX]),
        None,
    ),
    "single-node-in-container": (
        spec_of(cluster={"nodes": 1}, training={"checkpoint": {"path": "/checkpoints"}}),
        "spec.training.checkpoint.path",
    ),
    "single-node-shared-memory": (
        spec_of(cluster={"nodes": 1}, training={"checkpoint": {"path": "/dev/shm/ckpt"}}),
        "spec.training.checkpoint.path",
    ),
    "multi-node-s3-shards": (
        spec_of(training={"dataset": {"kind": "shards", "uri": "s3://bucket/tokens/"}}),
        None,
    ),
    "multi-node-shards-on-a-read-only-volume": (
        spec_of(training={"dataset": {"kind": "shards", "uri": "/datasets/a"}}, volumes=[DATASETS]),
        None,
    ),
    "multi-node-shards-in-container": (
        spec_of(training={"dataset": {"kind": "shards", "uri": "/data/tokens"}}, volumes=[FSX]),
        "spec.training.dataset.uri",
    ),
    "multi-node-shards-on-local-nvme": (
        spec_of(training={"dataset": {"kind": "shards", "uri": "/local/tokens"}}),
        "spec.training.dataset.uri",
    ),
    "single-node-shards-in-container": (
        spec_of(cluster={"nodes": 1}, training={"dataset": {"kind": "shards", "uri": "/data/tokens"}}),
        None,
    ),
    "weights-on-s3": (spec_of(model=weighted("s3://bucket/models/llama")), None),
    "weights-on-a-read-only-volume": (
        spec_of(model=weighted("/datasets/models/llama"), volumes=[DATASETS]),
        None,
    ),
    "weights-in-container": (
        spec_of(model=weighted("/models/llama"), volumes=[FSX]),
        "spec.model.weights.uri",
    ),
    "weights-on-local-nvme-multi-node": (
        spec_of(model=weighted("/local/models/llama")),
        "spec.model.weights.uri",
    ),
    # /local is the pod's own emptyDir (docs/security.md): empty at start, so nothing is staged there.
    "weights-on-local-nvme-single-node": (
        spec_of(cluster={"nodes": 1}, model=weighted("/local/models/llama")),
        "spec.model.weights.uri",
    ),
    "output-on-local-nvme-single-node": (
        spec_of(cluster={"nodes": 1}, training={"output": {"uri": "/local/exports"}}),
        "spec.training.output.uri",
    ),
    "output-on-fsx": (spec_of(training={"output": {"uri": "/fsx/exports/job"}}, volumes=[FSX]), None),
    "output-on-s3": (spec_of(training={"output": {"uri": "s3://bucket/exports/job/"}}), None),
    "output-on-a-read-only-volume": (
        spec_of(training={"output": {"uri": "/datasets/exports"}}, volumes=[DATASETS]),
        "spec.training.output.uri",
    ),
    "output-in-container": (
        spec_of(cluster={"nodes": 1}, training={"output": {"uri": "/exports/job"}}),
        "spec.training.output.uri",
    ),
    "output-over-the-weights": (
        spec_of(
            model=weighted("/fsx/models/llama"),
            training={"output": {"uri": "/fsx/models/llama"}},
            volumes=[FSX],
        ),
        "spec.training.output.uri",
    ),
}


@pytest.mark.parametrize("case", sorted(STORAGE_CASES))
def test_storage_rules(case: str) -> None:
    raw, field = STORAGE_CASES[case]
    spec = BlackwellTrainingJobSpec.model_validate(raw)
    if field is None:
        check_storage(spec)
        return
    with pytest.raises(SpecError) as caught:
        check_storage(spec)
    assert caught.value.field == field
    assert caught.value.fix and "\n" not in caught.value.message


@pytest.mark.parametrize("case", sorted(STORAGE_CASES))
def test_admission_agrees_with_the_storage_rules(case: str) -> None:
    raw, field = STORAGE_CASES[case]
    errors = admit(SCHEMA, VALIDATOR, job_of(copy.deepcopy(raw)))
    if field is None:
        assert errors == []
    else:
        assert any(f"{field} must" in error for error in errors), errors


def test_plan_job_checks_storage_first() -> None:
    raw, field = STORAGE_CASES["multi-node-no-volume"]
    with pytest.raises(SpecError) as caught:
        plan_job(BlackwellTrainingJobSpec.model_validate(raw))
    assert caught.value.field == field and caught.value.reason == "InvalidSpec"


PLANNER_REJECTS = {
    case: (obj, expected)
    for case, (obj, expected, models_reject) in bad_manifests().items()
    if not models_reject and expected.startswith("spec.training.")
}


def test_storage_bad_manifests_were_found() -> None:
    assert len(PLANNER_REJECTS) >= 3


@pytest.mark.parametrize("case", sorted(PLANNER_REJECTS))
def test_bad_storage_manifests_are_refused_by_the_planner_naming_the_field(case: str) -> None:
    obj, expected = PLANNER_REJECTS[case]
    assert obj is not None
    job = BlackwellTrainingJob.model_validate(obj)
    with pytest.raises(SpecError) as caught:
        plan_job(job.spec, job_name=job.metadata.name)
    assert expected.startswith(caught.value.field)


# Volume lists the models and the CRD must judge alike (the models' messages name the field).
VOLUME_CASES: dict[str, tuple[list[dict[str, Any]], str | None]] = {
    "one": ([FSX], None),
    "two-side-by-side": ([FSX, DATASETS], None),
    "one-claim-twice-by-sub-path": (
        [{**FSX, "subPath": "checkpoints"}, {**DATASETS, "name": "data"}],
        None,
    ),
    "dot-names-are-fine": ([{**FSX, "mountPath": "/.cache/a..b"}], None),
    "duplicate-name": ([FSX, {**DATASETS, "name": "fsx"}], "spec.volumes"),
    "duplicate-mount-path": ([FSX, {**DATASETS, "mountPath": "/fsx"}], "spec.volumes"),
    "nested-mount-path": ([FSX, {**DATASETS, "mountPath": "/fsx/datasets"}], "spec.volumes"),
    "nested-the-other-way": (
        [{**FSX, "mountPath": "/fsx/ckpt"}, {**DATASETS, "mountPath": "/fsx"}],
        "spec.volumes",
    ),
    "reserved-name": ([{**FSX, "name": "plan"}], "spec.volumes[0].name"),
    "name-not-a-label": ([{**FSX, "name": "FSx_1"}], "spec.volumes[0].name"),
    "claim-not-a-name": ([{**FSX, "claimName": "fsx claim"}], "spec.volumes[0].claimName"),
    "relative-mount-path": ([{**FSX, "mountPath": "fsx"}], "spec.volumes[0].mountPath"),
    "trailing-slash": ([{**FSX, "mountPath": "/fsx/"}], "spec.volumes[0].mountPath"),
    "dot-dot": ([{**FSX, "mountPath": "/fsx/../etc"}], "spec.volumes[0].mountPath"),
    "root": ([{**FSX, "mountPath": "/"}], "spec.volumes[0].mountPath"),
    "plan-dir": ([{**FSX, "mountPath": "/etc/btj"}], "spec.volumes[0].mountPath"),
    "above-the-plan-dir": ([{**FSX, "mountPath": "/etc"}], "spec.volumes[0].mountPath"),
    "inside-shared-memory": ([{**FSX, "mountPath": "/dev/shm/x"}], "spec.volumes[0].mountPath"),
    "absolute-sub-path": ([{**FSX, "subPath": "/ckpt"}], "spec.volumes[0].subPath"),
    "sub-path-escapes": ([{**FSX, "subPath": "a/../../b"}], "spec.volumes[0].subPath"),
    "missing-claim": ([{"name": "fsx", "mountPath": "/fsx"}], "spec.volumes[0].claimName"),
    "too-many": ([{**FSX, "name": f"v{i}", "mountPath": f"/v{i}"} for i in range(17)], "spec.volumes"),
}


# Cases pydantic's own messages cover (a required field, the list bound): no Fix line of ours.
PYDANTIC_MESSAGES = {"missing-claim", "too-many"}


def _model_error(volumes: list[dict[str, Any]]) -> str | None:
    from blackwell_operator.models.validation import format_validation_error

    try:
        BlackwellTrainingJobSpec.model_validate(spec_of(volumes=volumes))
    except ValidationError as exc:
        return format_validation_error(exc, prefix="spec.")
    return None


@pytest.mark.parametrize("case", sorted(VOLUME_CASES))
def test_models_and_crd_judge_volumes_alike(case: str) -> None:
    volumes, field = VOLUME_CASES[case]
    message = _model_error(volumes)
    admitted = admit(SCHEMA, VALIDATOR, job_of(spec_of(volumes=copy.deepcopy(volumes)))) == []
    if field is None:
        assert message is None and admitted
    else:
        assert message is not None and message.startswith(f"{field}: "), message
        assert len(message.splitlines()) == 1
        assert "Fix:" in message or case in PYDANTIC_MESSAGES, message
        assert not admitted


_register_commands()


def test_btj_render_names_the_field_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\nmetadata: {name: x}\n"
        "spec: {model: {preset: llama3.1-8b}, cluster: {nodes: 2}, "
        "training: {checkpoint: {path: /fsx/ckpt}}}\n"
    )
    result = CliRunner().invoke(app, ["render", str(path)])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: spec.training.checkpoint.path: /fsx/ckpt") and "Fix:" in line
    assert "claimName: fsx-claim" in line


def test_btj_render_mounts_the_example_claim() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3.1-8b-kueue.yaml"
    result = CliRunner().invoke(app, ["render", str(example)])
    assert result.exit_code == 0, result.output
    assert "claimName: fsx-claim" in result.stdout and "mountPath: /fsx" in result.stdout

"""The TrainJob backend: TrainJob and TrainingRuntime against the real Kubeflow Trainer v2.3.0 CRDs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.render import render_children
from blackwell_operator.render.trainjob import RUNTIME_HASH_ANNOTATION
from tests.render.test_children import CASES, NAMESPACE, pod_from_template
from tests.support.k8s_schema import (
    SCHEMA_MISSING,
    SHARED_SCHEMAS,
    Schema,
    admit,
    crd_open_api_schema,
    kubernetes_errors,
    load_crd,
    strict_validator,
)
from tests.support.plans import plan_for

TRAINER_CRDS = {
    "TrainJob": SHARED_SCHEMAS / "kubeflow-trainer-v2.3.0.trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": SHARED_SCHEMAS / "kubeflow-trainer-v2.3.0.trainer.kubeflow.org_trainingruntimes.yaml",
}
UPSTREAM_RUNTIME = SHARED_SCHEMAS / "kubeflow-trainer-v2.3.0.runtime.torch-distributed.yaml"


def _crd(kind: str) -> tuple[Schema, Any]:
    path = TRAINER_CRDS[kind]
    if not path.is_file():
        pytest.skip(f"{path} {SCHEMA_MISSING}")
    open_api = crd_open_api_schema(load_crd(path), "v1alpha1")
    return open_api, strict_validator(open_api, api_version="trainer.kubeflow.org/v1alpha1", kind=kind)


@pytest.fixture(scope="module")
def trainjob_crd() -> tuple[Schema, Any]:
    return _crd("TrainJob")


@pytest.fixture(scope="module")
def runtime_crd() -> tuple[Schema, Any]:
    return _crd("TrainingRuntime")


def as_trainjob(spec: BlackwellTrainingJobSpec) -> BlackwellTrainingJobSpec:
    return spec.model_copy(update={"backend": "TrainJob", "auto_resume": False})


def render(name: str, spec: BlackwellTrainingJobSpec) -> list[dict[str, Any]]:
    return render_children(name, NAMESPACE, spec, plan_for(spec, name))


def spec_of(**overrides: Any) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate(
        {"model": {"preset": "llama3.1-8b"}, "backend": "TrainJob", **overrides}
    )


def pod_template(runtime: dict[str, Any]) -> dict[str, Any]:
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    template: dict[str, Any] = job["template"]["spec"]["template"]
    return template


@pytest.mark.parametrize("case", sorted(CASES))
def test_trainjob_and_runtime_are_admitted_by_the_v2_3_crds(
    case: str, trainjob_crd: tuple[Schema, Any], runtime_crd: tuple[Schema, Any]
) -> None:
    name, spec = CASES[case]
    config_map, runtime, job = render(name, as_trainjob(spec))
    assert admit(*trainjob_crd, job) == []
    assert admit(*runtime_crd, runtime) == []
    assert kubernetes_errors(config_map) is None
    assert kubernetes_errors(pod_from_template(job, pod_template(runtime))) is None


def test_the_crds_reject_what_the_api_server_would(
    trainjob_crd: tuple[Schema, Any], runtime_crd: tuple[Schema, Any]
) -> None:
    _, runtime, job = render("job", spec_of())
    bad_job = copy.deepcopy(job)
    bad_job["metadata"]["name"] = "1job"
    bad_job["spec"]["trainer"]["numProcPerNode"] = "eight"
    errors = " | ".join(admit(*trainjob_crd, bad_job))
    assert "'eight'" in errors
    bad_job["spec"]["trainer"]["numProcPerNode"] = 8
    assert "RFC 1035" in " | ".join(admit(*trainjob_crd, bad_job))
    # runtimeRef and trainer are immutable: a node-count change of a created TrainJob is refused.
    grown = copy.deepcopy(job)
    grown["spec"]["trainer"]["numNodes"] = 4
    assert any("immutable" in e for e in admit(*trainjob_crd, grown, old=job))
    bad_runtime = copy.deepcopy(runtime)
    pod_template(bad_runtime)["spec"]["containers"][0]["imagee"] = "x"
    assert "imagee" in " | ".join(admit(*runtime_crd, bad_runtime))


def upstream_runtime() -> dict[str, Any]:
    """The upstream torch-distributed runtime (a Helm template: its template lines are dropped)."""
    if not UPSTREAM_RUNTIME.is_file():
        pytest.skip(f"{UPSTREAM_RUNTIME} {SCHEMA_MISSING}")
    text = "\n".join(line for line in Path(UPSTREAM_RUNTIME).read_text().splitlines() if "{{" not in line)
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def test_the_runtime_has_the_shape_of_upstream_torch_distributed() -> None:
    reference = upstream_runtime()
    _, runtime, _ = render("job", spec_of())
    (ours,), (theirs,) = (
        runtime["spec"]["template"]["spec"]["replicatedJobs"],
        reference["spec"]["template"]["spec"]["replicatedJobs"],
    )
    # Trainer v2 finds the trainer's pods by this job name and ancestor label, and injects torchrun's
    # PET_* variables into the container named like the upstream one.
    assert ours["name"] == theirs["name"] == "node"
    assert ours["template"]["metadata"]["labels"] == theirs["template"]["metadata"]["labels"]
    upstream_container = theirs["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
    assert pod_template(runtime)["spec"]["containers"][0]["name"] == upstream_container
    assert set(runtime["spec"]["mlPolicy"]) == set(reference["spec"]["mlPolicy"]) == {"numNodes", "torch"}
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"


def test_the_trainer_pod_carries_what_the_pytorchjob_worker_carries() -> None:
    """Node health selection, GPU/EFA/hugepage requests, /dev/shm, NCCL/EFA env, the plan ConfigMap,
    volumes, tolerations and the termination grace: the same as the PyTorchJob's Worker."""
    overrides: dict[str, Any] = {
        "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 4},
        "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
        "training": {"checkpoint": {"path": "/fsx/ckpt"}},
        "tolerations": [{"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}],
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
    }
    _, runtime, _ = render("job", spec_of(**overrides))
    _, pytorchjob = render("job", spec_of(**overrides, backend="PyTorchJob"))
    ours = pod_template(runtime)
    theirs = pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert ours["metadata"]["labels"] == theirs["metadata"]["labels"]
    pod, reference = ours["spec"], theirs["spec"]
    for key in ("nodeSelector", "affinity", "volumes", "tolerations", "terminationGracePeriodSeconds"):
        assert pod[key] == reference[key], key
    container, worker = pod["containers"][0], reference["containers"][0]
    for key in ("image", "command", "env", "resources", "volumeMounts", "terminationMessagePolicy"):
        assert container[key] == worker[key], key
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == 16
    assert container["command"][:2] == ["torchrun", "--nproc-per-node=8"]
    # Trainer v2 adds its own rendezvous port (29400); ours is the metrics port only.
    assert [p["name"] for p in container["ports"]] == ["metrics"]
    assert pod["restartPolicy"] == "Never"


def test_nodes_processes_retries_queue_and_ttl_land_where_trainer_v2_reads_them() -> None:
    spec = spec_of(
        cluster={"nodes": 8},
        maxRetries=5,
        ttlSecondsAfterFinished=600,
        queueName="hyperpod-ns-team-a-localqueue",
        priorityClass="training-priority",
    )
    _, runtime, job = render("big", spec)
    assert job["spec"]["trainer"] == {"numNodes": 8, "numProcPerNode": 8}
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "big",
    }
    assert runtime["spec"]["mlPolicy"]["numNodes"] == 8
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["failurePolicy"] == {"maxRestarts": 5, "restartStrategy": "Recreate"}
    assert jobset["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 0
    assert jobset["ttlSecondsAfterFinished"] == 600
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "hyperpod-ns-team-a-localqueue"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "training-priority"
    assert "suspend" not in job["spec"]  # Kueue owns it
    assert "ttlSecondsAfterFinished" not in render("small", spec_of())[1]["spec"]["template"]["spec"]


def test_a_runtime_change_alone_changes_the_trainjob_s_render_hash() -> None:
    _, runtime, job = render("job", spec_of())
    _, new_runtime, new_job = render("job", spec_of(image="registry.example/trainer:2"))
    assert job["spec"] == new_job["spec"]
    assert (
        job["metadata"]["annotations"][RUNTIME_HASH_ANNOTATION]
        != (new_job["metadata"]["annotations"][RUNTIME_HASH_ANNOTATION])
    )
    hash_key = "training.blackwell.dev/render-sha256"
    assert job["metadata"]["annotations"][hash_key] != new_job["metadata"]["annotations"][hash_key]
    assert (
        runtime["metadata"]["annotations"][RUNTIME_HASH_ANNOTATION.replace("runtime", "render")]
        != (new_runtime["metadata"]["annotations"][hash_key])
    )

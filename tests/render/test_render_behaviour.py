"""What render_children promises: determinism, overridable env, Kueue and auto-resume, EFA, labels, shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from blackwell_operator.models import BlackwellTrainingJobSpec
from blackwell_operator.render import dump_documents, render_children, strip_tracking_labels
from blackwell_operator.render.environment import DEFAULT_ENV
from tests.support.plans import plan_for

NAMESPACE = "hyperpod-ns-team-a"


def spec_of(**overrides: Any) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate({"model": {"preset": "llama3.1-8b"}, **overrides})


def render(spec: BlackwellTrainingJobSpec, name: str = "job", labels: dict[str, str] | None = None) -> Any:
    return render_children(name, NAMESPACE, spec, plan_for(spec, name), labels=labels)


def worker_template(job: dict[str, Any]) -> dict[str, Any]:
    if job["kind"] == "PyTorchJob":
        template: dict[str, Any] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    else:
        template = job["spec"]["replicaSpecs"][0]["template"]
    return template


def container(job: dict[str, Any]) -> dict[str, Any]:
    (only,) = worker_template(job)["spec"]["containers"]
    return dict(only)


def env(job: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(job)["env"]}


def test_rendering_is_byte_identical_across_calls() -> None:
    spec = spec_of(env=[{"name": "B", "value": "2"}, {"name": "A", "value": "1"}], queueName="q")
    labels = {"z": "1", "a": "2"}
    first = dump_documents(render(spec, labels=labels))
    second = dump_documents(
        render(spec_of(**spec.model_dump(by_alias=True)), labels=dict(reversed(labels.items())))
    )
    assert first == second


def test_config_map_then_job_without_owner_references() -> None:
    config_map, job = render(spec_of(cluster={"nodes": 2}))
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == "job-plan"
    assert job["kind"] == "PyTorchJob" and job["metadata"]["name"] == "job"
    assert job["apiVersion"] == "kubeflow.org/v1"
    for obj in (config_map, job):
        assert obj["metadata"]["namespace"] == NAMESPACE
        assert "ownerReferences" not in obj["metadata"]


def test_config_map_carries_the_plan_json_exactly_and_the_job_it_is_for() -> None:
    spec = spec_of()
    config_map, job = render(spec)
    assert set(config_map["data"]) == {"plan.json", "job.json"}
    assert config_map["data"]["plan.json"] == plan_for(spec, "job").to_json()
    assert json.loads(config_map["data"]["plan.json"])["jobName"] == "job"
    # The trainer's checkpoints record whose they are: the BTJ's namespace, name and uid (docs/trainer.md).
    owned = render_children("job", NAMESPACE, spec, plan_for(spec, "job"), uid="uid-1")
    assert json.loads(owned[0]["data"]["job.json"]) == {"namespace": NAMESPACE, "name": "job", "uid": "uid-1"}
    assert json.loads(config_map["data"]["job.json"])["uid"] == ""  # offline (btj render): none
    # job.json is no part of the pods' plan hash: a job made before it is not re-rendered by it.
    assert owned[-1] == job


def test_worker_only_elastic_pytorchjob() -> None:
    _, job = render(spec_of(cluster={"nodes": 4}, maxRetries=5))
    spec = job["spec"]
    assert list(spec["pytorchReplicaSpecs"]) == ["Worker"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4 and worker["restartPolicy"] == "OnFailure"
    assert spec["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "rdzvConf": [{"key": "read_timeout", "value": "600"}],
        "minReplicas": 4,
        "maxReplicas": 4,
        "maxRestarts": 5,
    }
    assert spec["nprocPerNode"] == "8"
    assert spec["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 5}


def test_workers_wait_ten_minutes_for_the_rendezvous_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # The training operator joins rdzvConf into PET_RDZV_CONF as key=value pairs; torchrun's own argument
    # parsing must turn it into a c10d read_timeout that outlasts a slow worker-0 (its default is 60 s).
    from torch.distributed.run import config_from_args, parse_args

    _, job = render(spec_of(cluster={"nodes": 2}))
    pairs = ",".join(f"{c['key']}={c['value']}" for c in job["spec"]["elasticPolicy"]["rdzvConf"])
    monkeypatch.setenv("PET_RDZV_CONF", pairs)
    args = parse_args(["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", "x.py"])
    config, _, _ = config_from_args(args)
    assert int(config.rdzv_configs["read_timeout"]) == 600


def test_trainer_command_and_plan_mount() -> None:
    _, job = render(spec_of(cluster={"gpusPerNode": 4}))
    pytorch = container(job)
    assert pytorch["name"] == "pytorch"
    assert pytorch["command"] == [
        "torchrun",
        "--nproc-per-node=4",
        "-m",
        "blackwell_trainer",
        "--plan",
        "/etc/btj/plan.json",
    ]
    assert job["spec"]["nprocPerNode"] == "4"
    # A failed worker's reason reaches the pod's status (the trainer's one-line error, else the log's tail).
    assert pytorch["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "plan", "mountPath": "/etc/btj", "readOnly": True} in pytorch["volumeMounts"]
    volumes = {v["name"]: v for v in worker_template(job)["spec"]["volumes"]}
    assert volumes["plan"]["configMap"]["name"] == "job-plan"
    # The pod's own tmpfs and node-local scratch, never a path of the node (docs/security.md).
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory"}
    assert set(volumes["local"]["emptyDir"]) == {"sizeLimit"}  # bounded: docs/security.md, "Node disk"
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in pytorch["ports"]


@pytest.mark.parametrize(
    ("instance", "efa"),
    [("ml.p5.48xlarge", 32), ("ml.p5e.48xlarge", 32), ("ml.p5en.48xlarge", 16), ("ml.p6-b200.48xlarge", 8)],
)
def test_gpu_and_efa_requests_equal_limits(instance: str, efa: int) -> None:
    _, job = render(spec_of(cluster={"instanceType": instance}))
    resources = container(job)["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["requests"]["vpc.amazonaws.com/efa"] == efa
    assert resources["requests"]["nvidia.com/gpu"] == 8
    assert resources["requests"]["hugepages-2Mi"] == "5120Mi"
    # The label keys spelled out on purpose (what HyperPod puts on its nodes), not from nodelabels.
    assert worker_template(job)["spec"]["nodeSelector"] == {
        "node.kubernetes.io/instance-type": instance,
        "sagemaker.amazonaws.com/node-health-status": "Schedulable",
    }


def test_placement_prefers_healthy_nodes_and_spreads_workers() -> None:
    _, job = render(
        spec_of(
            tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
        )
    )
    pod = worker_template(job)
    affinity = pod["spec"]["affinity"]
    preferred = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert preferred["preference"]["matchExpressions"][0] == {
        "key": "sagemaker.amazonaws.com/deep-health-check-status",
        "operator": "In",
        "values": ["Passed"],
    }
    (anti,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == {"training.blackwell.dev/job-name": "job"}
    assert pod["metadata"]["labels"]["training.blackwell.dev/job-name"] == "job"  # the selector matches
    assert pod["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ]


def test_env_defaults_are_sorted_and_user_values_win() -> None:
    _, job = render(
        spec_of(env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "HF_HOME", "value": "/local/hf"}])
    )
    names = [item["name"] for item in container(job)["env"]]
    assert names == sorted(names)
    values = env(job)
    assert values["NCCL_DEBUG"] == "INFO"
    assert values["HF_HOME"] == "/local/hf"
    assert values["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert values["FI_PROVIDER"] == "efa"
    assert set(DEFAULT_ENV) <= set(values)
    # The S3 shard cache lives on the node's NVMe mount, not the container's root disk.
    assert values["BTJ_CACHE_DIR"].startswith("/local/")
    assert {"name": "local", "mountPath": "/local"} in container(job)["volumeMounts"]


def test_torchrun_leaves_the_sigterm_checkpoint_the_pods_grace_period() -> None:
    _, job = render(spec_of())
    grace = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # torchrun SIGKILLs its ranks this long after forwarding SIGTERM: well past its 30 s default, and
    # inside the kubelet's grace period so torchrun itself still exits cleanly.
    shutdown = int(env(job)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"])
    assert 30 < shutdown < grace


def test_kueue_labels_only_when_a_queue_is_named_and_never_suspend() -> None:
    _, plain = render(spec_of())
    _, queued = render(spec_of(queueName="hyperpod-ns-team-a-localqueue", priorityClass="training-priority"))
    assert not any(key.startswith("kueue.x-k8s.io/") for key in plain["metadata"]["labels"])
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "hyperpod-ns-team-a-localqueue"
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "training-priority"
    for job in (plain, queued):
        assert "suspend" not in job["spec"]["runPolicy"]
    assert "kueue.x-k8s.io/queue-name" not in worker_template(queued)["metadata"]["labels"]


def test_auto_resume_annotations() -> None:
    _, off = render(spec_of())
    _, on = render(spec_of(autoResume=True, maxRetries=7))
    assert "sagemaker.amazonaws.com/enable-job-auto-resume" not in off["metadata"]["annotations"]
    annotations = on["metadata"]["annotations"]
    assert annotations["sagemaker.amazonaws.com/enable-job-auto-resume"] == "true"
    assert annotations["sagemaker.amazonaws.com/job-max-retry-count"] == "7"


def test_argo_cd_tracking_labels_are_stripped_and_ours_win() -> None:
    parent = {
        "app.kubernetes.io/instance": "training-jobs",
        "argocd.argoproj.io/instance": "training-jobs",
        "argocd.argoproj.io/sync-wave": "5",
        "team": "a",
        "app.kubernetes.io/name": "user-says-otherwise",
    }
    config_map, job = render(spec_of(), labels=parent)
    for labels in (
        config_map["metadata"]["labels"],
        job["metadata"]["labels"],
        worker_template(job)["metadata"]["labels"],
    ):
        assert "app.kubernetes.io/instance" not in labels
        assert not any(key.startswith("argocd.argoproj.io/") for key in labels)
        assert labels["team"] == "a"
        assert labels["app.kubernetes.io/name"] == "blackwell-trainer"
        assert labels["app.kubernetes.io/managed-by"] == "blackwell-operator"
        assert labels["app.kubernetes.io/part-of"] == "blackwell-training"
        assert labels["training.blackwell.dev/job-name"] == "job"
    assert strip_tracking_labels(None) == {}


def test_hyperpod_pytorchjob_shape() -> None:
    spec = spec_of(
        backend="HyperPodPyTorchJob",
        cluster={"instanceType": "ml.p5en.48xlarge", "nodes": 3},
        maxRetries=4,
        queueName="q",
    )
    config_map, job = render(spec)
    assert job["apiVersion"] == "sagemaker.amazonaws.com/v1" and job["kind"] == "HyperPodPyTorchJob"
    assert config_map["kind"] == "ConfigMap"
    hp = job["spec"]
    assert hp["nprocPerNode"] == "8"
    assert isinstance(hp["replicaSpecs"], list)
    (replica,) = hp["replicaSpecs"]
    assert replica["name"] == "pods" and replica["replicas"] == 3
    assert hp["runPolicy"]["jobMaxRetryCount"] == 4
    assert set(hp["runPolicy"]["restartPolicy"]) == {
        "numRestartBeforeFullJobRestart",
        "evalPeriodSeconds",
        "maxFullJobRestarts",
    }
    assert "suspend" not in hp["runPolicy"]
    command = container(job)["command"]
    assert command[:2] == ["hyperpodrun", "--nproc-per-node=8"]
    assert "--nnodes=3" in command
    assert command[-4:] == ["-m", "blackwell_trainer", "--plan", "/etc/btj/plan.json"]
    assert container(job)["resources"]["limits"]["vpc.amazonaws.com/efa"] == 16
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    # The same pod placement as the Kubeflow child.
    _, kubeflow = render(spec_of(cluster={"instanceType": "ml.p5en.48xlarge", "nodes": 3}))
    assert worker_template(job)["spec"]["affinity"] == worker_template(kubeflow)["spec"]["affinity"]
    assert worker_template(job)["spec"]["volumes"] == worker_template(kubeflow)["spec"]["volumes"]


def test_render_hash_changes_with_the_spec_and_only_then() -> None:
    _, first = render(spec_of())
    _, again = render(spec_of())
    _, changed = render(spec_of(env=[{"name": "X", "value": "1"}]))
    key = "training.blackwell.dev/render-sha256"
    assert first["metadata"]["annotations"][key] == again["metadata"]["annotations"][key]
    assert first["metadata"]["annotations"][key] != changed["metadata"]["annotations"][key]


def test_render_is_pure() -> None:
    spec = spec_of(env=[{"name": "A", "value": "1"}])
    before = spec.model_dump()
    plan = plan_for(spec, "job")
    plan_before = plan.to_json()
    render_children("job", NAMESPACE, spec, plan, labels={"a": "b"})
    assert spec.model_dump() == before and plan.to_json() == plan_before


@pytest.mark.parametrize("backend", ["PyTorchJob", "HyperPodPyTorchJob"])
def test_ttl_after_finished_reaches_the_run_policy_only_when_set(backend: str) -> None:
    _, kept = render(spec_of(backend=backend))
    _, ttl = render(spec_of(backend=backend, ttlSecondsAfterFinished=3600))
    assert "ttlSecondsAfterFinished" not in kept["spec"]["runPolicy"]
    assert ttl["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 3600


@pytest.mark.parametrize("backend", ["PyTorchJob", "HyperPodPyTorchJob", "TrainJob"])
def test_the_render_hash_leaves_the_btj_s_own_labels_out_and_each_object_records_their_keys(
    backend: str,
) -> None:
    from blackwell_operator.render.children import shape_hash
    from blackwell_operator.render.labels import PROPAGATED_ANNOTATION, RENDER_HASH_ANNOTATION

    spec = spec_of(backend=backend)
    plan = plan_for(spec, "job")
    bare = render_children("job", NAMESPACE, spec, plan)
    team_a = render_children(
        "job", NAMESPACE, spec, plan, labels={"team": "a", "app.kubernetes.io/instance": "x"}
    )
    team_b = render_children("job", NAMESPACE, spec, plan, labels={"team": "b", "cost-center": "7"})
    for plain, a, b in zip(bare, team_a, team_b, strict=True):
        # A label edit is no new render: the same hash, and without labels the hash of all it carries.
        digests = {o["metadata"]["annotations"][RENDER_HASH_ANNOTATION] for o in (plain, a, b)}
        assert digests == {shape_hash(plain)}
        assert a["metadata"]["labels"]["team"] == "a" and b["metadata"]["labels"]["cost-center"] == "7"
        assert PROPAGATED_ANNOTATION not in plain["metadata"]["annotations"]
        assert a["metadata"]["annotations"][PROPAGATED_ANNOTATION] == "team"  # Argo CD's is not copied
        assert b["metadata"]["annotations"][PROPAGATED_ANNOTATION] == "cost-center,team"

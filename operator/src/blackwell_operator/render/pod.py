"""The worker pod template shared by PyTorchJob and HyperPodPyTorchJob: placement, resources, volumes."""

from __future__ import annotations

from typing import Any

from blackwell_operator.models.spec import (
    DEFAULT_IMAGE,
    OPERATOR_VOLUMES,
    BlackwellTrainingJobSpec,
    Toleration,
    Volume,
)
from blackwell_operator.nodelabels import (
    DEEP_HEALTH_LABEL,
    DEEP_HEALTH_PASSED,
    GPU_RESOURCE,
    HOSTNAME_TOPOLOGY,
    INSTANCE_TYPE_LABEL,
    NODE_HEALTH_LABEL,
    SCHEDULABLE,
)
from blackwell_operator.render.environment import LOCAL_DIR, PLAN_DIR, container_env, plan_env
from blackwell_operator.render.hardware import HUGEPAGES_2MI, efa_interfaces, memory_request
from blackwell_operator.render.labels import JOB_NAME_LABEL, PLAN_HASH_ANNOTATION, topology_annotations
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import Plan

CONTAINER_NAME = "pytorch"  # the Kubeflow webhook requires exactly one container with this name
# Kubeflow Trainer v2 injects the torchrun environment (PET_*) only into the container named `node`.
TRAINJOB_CONTAINER_NAME = "node"
TRAINER_CONTAINER_NAMES = frozenset({CONTAINER_NAME, TRAINJOB_CONTAINER_NAME})
METRICS_PORT_NAME = "metrics"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
EPHEMERAL_STORAGE = "ephemeral-storage"

# The trainer image's user (trainer_image/Dockerfile `USER`); the pods run as it whatever the image says, so a
# custom image runs as non-root too. Numeric, so the kubelet can check runAsNonRoot (docs/security.md).
TRAINER_UID = 1000
TRAINER_GID = 1000
# Time for the trainer's SIGTERM checkpoint (preemption, Kueue eviction, auto-resume) before SIGKILL.
TERMINATION_GRACE_SECONDS = 300


def plan_config_map_name(name: str) -> str:
    """The ConfigMap carrying a job's plan file."""
    return f"{name}-plan"


def toleration(item: Toleration) -> dict[str, Any]:
    """A Kubernetes toleration from the spec's, without unset keys."""
    wire = item.model_dump(by_alias=True, exclude_none=True)
    return {
        key: wire[key] for key in ("key", "operator", "value", "effect", "tolerationSeconds") if key in wire
    }


def affinity(name: str) -> dict[str, Any]:
    """Prefer nodes whose deep health check passed; never two workers of this job on one host."""
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [
                            {"key": DEEP_HEALTH_LABEL, "operator": "In", "values": [DEEP_HEALTH_PASSED]}
                        ]
                    },
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {JOB_NAME_LABEL: name}},
                    "topologyKey": HOSTNAME_TOPOLOGY,
                }
            ]
        },
    }


def resources(spec: BlackwellTrainingJobSpec, plan: Plan) -> dict[str, Any]:
    """Requests equal limits: whole GPUs, every EFA device of the node, hugepages, host memory and the
    node-local disk the plan expects the pod to write (/local and the container's own files).

    The ephemeral-storage request makes the scheduler count the disk against the node's allocatable; the
    limit makes the kubelet evict this pod, alone, when it writes more, before the node reaches its own
    eviction thresholds and evicts other namespaces' pods (issue 24, docs/security.md).
    """
    instance = spec.cluster.instance_type.value
    amounts: dict[str, Any] = {
        GPU_RESOURCE: plan.gpus_per_node,
        EFA_RESOURCE: efa_interfaces(instance),
        "hugepages-2Mi": HUGEPAGES_2MI,
        "memory": memory_request(instance, plan.gpus_per_node),
    }
    if plan.local_storage is not None:  # every plan the planner makes has it; older stored ones may not
        amounts[EPHEMERAL_STORAGE] = gib_quantity(plan.local_storage.limit_bytes)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def gib_quantity(size: int) -> str:
    """A byte count as a Kubernetes quantity: whole GiB where it is one (the planner rounds to them)."""
    return f"{size >> 30}Gi" if size % GIB == 0 else str(size)


def container(
    spec: BlackwellTrainingJobSpec,
    plan: Plan,
    command: list[str],
    extra_ports: list[dict[str, Any]],
    name: str = CONTAINER_NAME,
) -> dict[str, Any]:
    """The one trainer container."""
    ports = [{"name": METRICS_PORT_NAME, "containerPort": plan.metrics_port, "protocol": "TCP"}, *extra_ports]
    return {
        "name": name,
        "image": spec.image or DEFAULT_IMAGE,
        "command": command,
        "env": container_env(spec.env, plan_env(plan)),
        "ports": ports,
        "resources": resources(spec, plan),
        # Why a worker failed, in the pod's status (`kubectl get pod -o yaml`, lastState.terminated): the
        # trainer writes its one-line error to /dev/termination-log; without it, the log's tail.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "plan", "mountPath": PLAN_DIR, "readOnly": True},
            {"name": "shm", "mountPath": OPERATOR_VOLUMES["shm"]},
            {"name": "local", "mountPath": LOCAL_DIR},
            *(claim_mount(volume) for volume in spec.volumes),
        ],
    }


def container_security_context() -> dict[str, Any]:
    """What Pod Security `restricted` asks of a container: no privilege escalation, every capability dropped.

    NCCL, EFA (libfabric) and the CUDA driver need no capability: GPUs and EFA devices come from their
    device plugins, and memory registration needs only the runtime's unlimited memlock limit
    (docs/security.md).
    """
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security_context() -> dict[str, Any]:
    """The pod runs as the trainer image's non-root user and group under the runtime's seccomp profile.

    fsGroup makes a volume that supports it (a ReadWriteOnce claim with a file system, e.g. EBS) writable by
    that group; OnRootMismatch changes ownership once, not on every start (FSx for Lustre claims are
    ReadWriteMany and left as they are: their folders must be writable by the trainer's user or group).
    """
    return {
        "fsGroup": TRAINER_GID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "runAsGroup": TRAINER_GID,
        "runAsNonRoot": True,
        "runAsUser": TRAINER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def claim_mount(volume: Volume) -> dict[str, Any]:
    """The container's mount of one spec.volumes entry."""
    mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount_path}
    if volume.read_only:
        mount["readOnly"] = True
    if volume.sub_path:
        mount["subPath"] = volume.sub_path
    return mount


def claim_volume(volume: Volume) -> dict[str, Any]:
    """The pod volume of one spec.volumes entry: its PersistentVolumeClaim (FSx for Lustre on HyperPod)."""
    source: dict[str, Any] = {"claimName": volume.claim_name}
    if volume.read_only:
        source["readOnly"] = True
    return {"name": volume.name, "persistentVolumeClaim": source}


def volumes(name: str, spec: BlackwellTrainingJobSpec, plan: Plan) -> list[dict[str, Any]]:
    """The plan ConfigMap, the pod's own /dev/shm and node-local scratch, then spec.volumes.

    No hostPath (docs/security.md): the node's /dev/shm and NVMe were shared by every pod on the node, so one
    namespace could read or poison another's cached shards, weights and checkpoints, and hostPath forces
    Pod Security `privileged`. Both are emptyDirs now, private to the pod and gone with it: /dev/shm a
    tmpfs (its pages count against the pod's memory limit, which also bounds its size), /local on the
    kubelet's disk, which on HyperPod and EKS nodes with instance store is the NVMe RAID. They survive a
    container restart in the pod (PyTorchJob's OnFailure, hyperpodrun's process restarts), not a new pod.
    /local's sizeLimit is the plan's share of the pod's ephemeral storage for it: past it the kubelet evicts
    the pod (the container's limit bounds /local and the container's own files together).
    """
    local: dict[str, Any] = {}
    if plan.local_storage is not None:
        local["sizeLimit"] = gib_quantity(plan.local_storage.volume_bytes)
    return [
        {"name": "plan", "configMap": {"name": plan_config_map_name(name), "defaultMode": 0o444}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
        {"name": "local", "emptyDir": local},
        *(claim_volume(volume) for volume in spec.volumes),
    ]


def pod_template(
    name: str,
    spec: BlackwellTrainingJobSpec,
    plan: Plan,
    *,
    labels: dict[str, str],
    plan_sha256: str,
    command: list[str],
    extra_ports: list[dict[str, Any]] | None = None,
    container_name: str = CONTAINER_NAME,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    """The worker pod template (`restart_policy` only where the job kind does not set it itself)."""
    pod_spec: dict[str, Any] = {
        "nodeSelector": {
            INSTANCE_TYPE_LABEL: spec.cluster.instance_type.value,
            NODE_HEALTH_LABEL: SCHEDULABLE,
        },
        "affinity": affinity(name),
        "containers": [container(spec, plan, command, extra_ports or [], container_name)],
        "volumes": volumes(name, spec, plan),
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        # The trainer never calls the Kubernetes API: no API token in its pods, whatever rights their
        # ServiceAccount holds. IRSA and EKS Pod Identity mount their own projected tokens for AWS, which
        # this does not touch (docs/security.md).
        "automountServiceAccountToken": False,
    }
    if restart_policy:
        pod_spec["restartPolicy"] = restart_policy
    if spec.tolerations:
        pod_spec["tolerations"] = [toleration(item) for item in spec.tolerations]
    if spec.service_account_name:
        # The pods' identity: on EKS, IRSA or EKS Pod Identity turn it into AWS credentials (S3).
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret.name} for secret in spec.image_pull_secrets]
    # The user's pod annotations first, the operator's over them (the spec refuses the operator's keys,
    # so nothing the user asked for is dropped); `labels` already hold spec.podLabels (render_children).
    return {
        "metadata": {
            "labels": dict(labels),
            "annotations": dict(
                sorted(
                    {
                        **(spec.pod_annotations or {}),
                        **topology_annotations(spec),
                        "kubectl.kubernetes.io/default-container": container_name,
                        PLAN_HASH_ANNOTATION: plan_sha256,
                    }.items()
                )
            ),
        },
        "spec": pod_spec,
    }

"""The Kubeflow PyTorchJob v1 child, shaped as HyperPod runs it: Worker-only, c10d elastic rendezvous."""

from __future__ import annotations

from typing import Any

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.render.environment import PLAN_PATH
from blackwell_operator.render.pod import pod_template
from blackwell_trainer.plan.config import Plan

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
PLURAL = "pytorchjobs"
# The training operator's defaulter adds this port to the `pytorch` container when it is missing; we
# render it ourselves so the stored object equals what we send (no diff, no churn).
RENDEZVOUS_PORT = {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}
# How long torchrun on a worker waits for the rendezvous store on worker-0 (c10d's read_timeout, 60 s by
# default; the training operator passes rdzvConf as PET_RDZV_CONF). Worker-0 may still be pulling a
# multi-GB image or waiting for its node: at 60 s the other workers crash-loop and use up backoffLimit
# before step 1 (pytorch-operator#125). 600 s matches the rendezvous' own join_timeout default; the price
# is that a store that dies mid-run is noticed later, which the NCCL watchdog covers for collectives.
RENDEZVOUS_READ_TIMEOUT_S = 600


def trainer_command(launcher: str, plan: Plan, *launcher_flags: str) -> list[str]:
    """`<launcher> --nproc-per-node=G [flags] -m blackwell_trainer --plan /etc/btj/plan.json`."""
    return [
        launcher,
        f"--nproc-per-node={plan.gpus_per_node}",
        *launcher_flags,
        "-m",
        "blackwell_trainer",
        "--plan",
        PLAN_PATH,
    ]


def render_pytorchjob(
    name: str,
    namespace: str,
    spec: BlackwellTrainingJobSpec,
    plan: Plan,
    *,
    labels: dict[str, str],
    annotations: dict[str, str],
    pod_labels: dict[str, str],
    plan_sha256: str,
) -> dict[str, Any]:
    """A PyTorchJob whose Worker pods run torchrun on the plan; nnodes and rendezvous come from PET_* env.

    HyperPod installs training operator v1.7.0, which sets PET_NPROC_PER_NODE only when a Master
    exists, so the launcher gets --nproc-per-node itself (docs/reference/hyperpod-pytorchjob.md §1.2).
    """
    nodes = plan.nodes
    template = pod_template(
        name,
        spec,
        plan,
        labels=pod_labels,
        plan_sha256=plan_sha256,
        command=trainer_command("torchrun", plan),
        extra_ports=[dict(RENDEZVOUS_PORT)],
    )
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running", "backoffLimit": spec.max_retries}
    if spec.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "nprocPerNode": str(plan.gpus_per_node),
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "rdzvConf": [{"key": "read_timeout", "value": str(RENDEZVOUS_READ_TIMEOUT_S)}],
                "minReplicas": nodes,
                "maxReplicas": nodes,
                "maxRestarts": spec.max_retries,
            },
            # No `suspend`: Kueue owns it (docs/reference/hyperpod-pytorchjob.md §2.7).
            "runPolicy": run_policy,
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": nodes, "restartPolicy": "OnFailure", "template": template},
            },
        },
    }

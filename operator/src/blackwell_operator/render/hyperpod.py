"""The HyperPodPyTorchJob child (sagemaker.amazonaws.com/v1) for HyperPod's own training operator."""

from __future__ import annotations

from typing import Any

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.render.pod import pod_template
from blackwell_operator.render.pytorchjob import trainer_command
from blackwell_trainer.plan.config import Plan

API_VERSION = "sagemaker.amazonaws.com/v1"
KIND = "HyperPodPyTorchJob"
PLURAL = "hyperpodpytorchjobs"
REPLICA_NAME = "pods"
# hyperpodrun's elastic agent talks to the HyperPod operator on this port (the AWS sample exposes it).
AGENT_PORT = {"name": "hyperpod-agent", "containerPort": 8080, "protocol": "TCP"}
# Process-level restarts before the whole job restarts, as in the AWS sample
# (docs/reference/hyperpod-pytorchjob.md §2.6).
RESTART_POLICY = {"numRestartBeforeFullJobRestart": 3, "evalPeriodSeconds": 21600, "maxFullJobRestarts": 1}


def render_hyperpodpytorchjob(
    name: str,
    namespace: str,
    spec: BlackwellTrainingJobSpec,
    plan: Plan,
    *,
    labels: dict[str, str],
    pod_labels: dict[str, str],
    plan_sha256: str,
) -> dict[str, Any]:
    """A HyperPodPyTorchJob: replicaSpecs is a list; retries live in runPolicy, not in annotations."""
    command = trainer_command(
        "hyperpodrun", plan, f"--nnodes={plan.nodes}", "--tee=3", "--log_dir=/tmp/hyperpod"
    )
    template = pod_template(
        name,
        spec,
        plan,
        labels=pod_labels,
        plan_sha256=plan_sha256,
        command=command,
        extra_ports=[dict(AGENT_PORT)],
    )
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",
        "jobMaxRetryCount": spec.max_retries,
        "restartPolicy": dict(RESTART_POLICY),
    }
    if spec.ttl_seconds_after_finished is not None:
        # docs/reference/hyperpod-pytorchjob.md §2.6
        run_policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nprocPerNode": str(plan.gpus_per_node),
            "replicaSpecs": [{"name": REPLICA_NAME, "replicas": plan.nodes, "template": template}],
            "runPolicy": run_policy,
        },
    }

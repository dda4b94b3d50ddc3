"""The Kubeflow Trainer v2 children: a TrainJob and the per-job TrainingRuntime it references.

Why a namespaced TrainingRuntime per job rather than one ClusterTrainingRuntime the chart installs: the
worker pod template carries per-job content that a TrainJob cannot express itself (its `trainer` holds
only image, command, env, node and process counts, and its runtimePatches only a few pod fields): the
plan ConfigMap's volume, the anti-affinity on this job's name, the instance type, EFA and hugepage
requests, spec.volumes, tolerations and the topology annotations. A runtime of our own also pins the
shape of a job when the chart is upgraded (a shared runtime would change every job not yet started),
needs no cluster-scoped write, and goes with the BTJ through its owner reference. See docs/backends.md.
"""

from __future__ import annotations

from typing import Any

from blackwell_operator.models.spec import API_GROUP, BlackwellTrainingJobSpec
from blackwell_operator.render.pod import TRAINJOB_CONTAINER_NAME, pod_template
from blackwell_operator.render.pytorchjob import trainer_command
from blackwell_trainer.plan.config import Plan

GROUP = "trainer.kubeflow.org"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "TrainJob"
PLURAL = "trainjobs"
RUNTIME_KIND = "TrainingRuntime"
RUNTIME_PLURAL = "trainingruntimes"
# The replicated job and the ancestor label by which Trainer v2 finds the trainer pods' template, and the
# framework label its SDK lists runtimes by (the upstream torch-distributed runtime carries the same).
REPLICATED_JOB = "node"
ANCESTOR_LABEL = f"{GROUP}/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
FRAMEWORK_LABEL = f"{GROUP}/framework"
# The label JobSet puts on every pod of a JobSet, which Trainer v2 names after the TrainJob.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# Trainer v2 runs a TrainJob as a JobSet it controls, whose Jobs (batch/v1) control the pods: the owner
# chain a trainer pod's result is checked along (lifecycle/ownership.py; docs/reference/pod-ownership.md).
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_KIND = "JobSet"
JOBSET_PLURAL = "jobsets"
BATCH_JOB_API_VERSION = "batch/v1"
BATCH_JOB_KIND = "Job"
BATCH_JOB_PLURAL = "jobs"
RUNTIME_HASH_ANNOTATION = f"{API_GROUP}/runtime-sha256"


def render_training_runtime(
    name: str,
    namespace: str,
    spec: BlackwellTrainingJobSpec,
    plan: Plan,
    *,
    labels: dict[str, str],
    pod_labels: dict[str, str],
    plan_sha256: str,
) -> dict[str, Any]:
    """The TrainingRuntime: a JobSet of one Job of `nodes` pods, each running torchrun on the plan.

    Trainer v2 sets the Job's parallelism and completions from the TrainJob's numNodes and gives the
    `node` container PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK and PET_MASTER_ADDR/PORT (static
    rendezvous on node 0, whose store waits 600 s for the others by default: the read_timeout the
    PyTorchJob sets for its c10d rendezvous). A failed pod fails its Job at once (backoffLimit 0), and
    JobSet then re-creates every pod of the job (a gang restart: torch ranks cannot rejoin a running
    group one by one) up to spec.maxRetries times before the TrainJob fails.
    """
    template = pod_template(
        name,
        spec,
        plan,
        labels=pod_labels,
        plan_sha256=plan_sha256,
        command=trainer_command("torchrun", plan),
        container_name=TRAINJOB_CONTAINER_NAME,
        restart_policy="Never",
    )
    jobset: dict[str, Any] = {
        "failurePolicy": {"maxRestarts": spec.max_retries, "restartStrategy": "Recreate"},
        "replicatedJobs": [
            {
                "name": REPLICATED_JOB,
                "template": {
                    "metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}},
                    "spec": {"backoffLimit": 0, "template": template},
                },
            }
        ],
    }
    if spec.ttl_seconds_after_finished is not None:
        # Trainer v2.3 has no TTL of its own (kubeflow/trainer#4052); the JobSet's deletes the finished
        # JobSet and its pods, and a finished TrainJob is never reconciled into a new JobSet.
        jobset["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    return {
        "apiVersion": API_VERSION,
        "kind": RUNTIME_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(sorted({**labels, FRAMEWORK_LABEL: "torch"}.items())),
        },
        "spec": {
            "mlPolicy": {"numNodes": plan.nodes, "torch": {}},
            "template": {"spec": jobset},
        },
    }


def render_trainjob(
    name: str,
    namespace: str,
    plan: Plan,
    *,
    labels: dict[str, str],
    runtime_sha256: str,
) -> dict[str, Any]:
    """The TrainJob: this job's TrainingRuntime, its node count and torchrun's processes per node.

    Kueue reads its queue and priority labels from the TrainJob and owns spec.suspend, so suspend is not
    rendered (the API server defaults it to false). The runtime's hash rides along as an annotation, so
    that a change of the runtime alone (a new image) changes the TrainJob's render hash too.
    """
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {RUNTIME_HASH_ANNOTATION: runtime_sha256},
        },
        "spec": {
            "runtimeRef": {"apiGroup": GROUP, "kind": RUNTIME_KIND, "name": name},
            "trainer": {"numNodes": plan.nodes, "numProcPerNode": plan.gpus_per_node},
        },
    }

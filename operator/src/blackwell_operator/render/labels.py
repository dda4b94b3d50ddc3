"""Labels and annotations of the children: ours, the user's (minus Argo CD's), Kueue's, HyperPod's."""

from __future__ import annotations

from collections.abc import Mapping

from blackwell_operator.applabels import (
    APP_NAME,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    MANAGER,
    NAME_LABEL,
    PART_OF,
    PART_OF_LABEL,
)
from blackwell_operator.models.spec import API_GROUP, BlackwellTrainingJobSpec

JOB_NAME_LABEL = f"{API_GROUP}/job-name"

# Kueue reads these from the job object (docs/reference/hyperpod-pytorchjob.md §2.7).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"

# Kueue topology-aware scheduling reads these from each pod template (a PodSet): all its pods within one
# domain of the named node-label level (docs/reference/hyperpod-pytorchjob.md §2.7; docs/backends.md).
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"

# HyperPod job auto-resume (docs/reference/hyperpod-pytorchjob.md §1.3 and §2.7).
AUTO_RESUME_ANNOTATION = "sagemaker.amazonaws.com/enable-job-auto-resume"
MAX_RETRY_ANNOTATION = "sagemaker.amazonaws.com/job-max-retry-count"

# Content hashes: the handler compares them to decide whether a patch is needed.
RENDER_HASH_ANNOTATION = f"{API_GROUP}/render-sha256"
PLAN_HASH_ANNOTATION = f"{API_GROUP}/plan-sha256"

# The keys of the BTJ's own labels an object was given, recorded on it: a key later removed from the BTJ is
# removed from the object too, and only such a key (a label another controller added stays).
PROPAGATED_ANNOTATION = f"{API_GROUP}/propagated-labels"

# Argo CD tracks resources by app.kubernetes.io/instance in `label` tracking mode and by argocd.argoproj.io/*
# keys; a child carrying them is reported OutOfSync or pruned (docs/reference/hyperpod-pytorchjob.md §3.2).
ARGO_INSTANCE_LABEL = INSTANCE_LABEL
ARGO_PREFIX = "argocd.argoproj.io/"


def strip_tracking_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The parent's labels without those Argo CD uses to track the parent itself."""
    return {
        key: value
        for key, value in sorted((labels or {}).items())
        if key != ARGO_INSTANCE_LABEL and not key.startswith(ARGO_PREFIX)
    }


def own_labels(name: str) -> dict[str, str]:
    """The labels every object the operator creates carries (also the anti-affinity selector)."""
    return {
        NAME_LABEL: APP_NAME,
        MANAGED_BY_LABEL: MANAGER,
        PART_OF_LABEL: PART_OF,
        JOB_NAME_LABEL: name,
    }


def child_labels(name: str, parent_labels: Mapping[str, str] | None) -> dict[str, str]:
    """Propagated parent labels overlaid by ours (ours win on a clash), sorted."""
    merged = strip_tracking_labels(parent_labels)
    merged.update(own_labels(name))
    return dict(sorted(merged.items()))


def job_labels(
    name: str, parent_labels: Mapping[str, str] | None, spec: BlackwellTrainingJobSpec
) -> dict[str, str]:
    """The job's own labels: child_labels, then the spec's Kueue labels over them, sorted."""
    return dict(sorted({**child_labels(name, parent_labels), **kueue_labels(spec)}.items()))


def propagated_annotation(parent_labels: Mapping[str, str] | None) -> dict[str, str]:
    """The annotation recording which of the parent's label keys an object was given (none: no annotation).

    Label keys hold no comma (a DNS prefix, a slash and a name), so a comma-separated list is unambiguous.
    """
    keys = sorted(strip_tracking_labels(parent_labels))
    return {PROPAGATED_ANNOTATION: ",".join(keys)} if keys else {}


def recorded_keys(annotations: Mapping[str, str] | None) -> set[str]:
    """The parent's label keys an object records it was given (propagated_annotation, read back)."""
    value = (annotations or {}).get(PROPAGATED_ANNOTATION) or ""
    return {key for key in value.split(",") if key}


def kueue_labels(spec: BlackwellTrainingJobSpec) -> dict[str, str]:
    """Kueue labels when a queue or priority class is named; the spec wins over propagated labels."""
    labels: dict[str, str] = {}
    if spec.queue_name:
        labels[KUEUE_QUEUE_LABEL] = spec.queue_name
    if spec.priority_class:
        labels[KUEUE_PRIORITY_LABEL] = spec.priority_class
    return labels


def topology_annotations(spec: BlackwellTrainingJobSpec) -> dict[str, str]:
    """Kueue's podset topology annotation for the worker pod template, when spec.cluster.topology asks."""
    topology = spec.cluster.topology
    if topology is None:
        return {}
    key = KUEUE_REQUIRED_TOPOLOGY if topology.mode == "Required" else KUEUE_PREFERRED_TOPOLOGY
    return {key: topology.level}


def auto_resume_annotations(spec: BlackwellTrainingJobSpec) -> dict[str, str]:
    """HyperPod auto-resume annotations for a Kubeflow PyTorchJob, when asked for."""
    if not spec.auto_resume:
        return {}
    return {AUTO_RESUME_ANNOTATION: "true", MAX_RETRY_ANNOTATION: str(spec.max_retries)}

"""render_children: the plan ConfigMap and the child job for a BTJ, deterministic and without owners."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from blackwell_operator.models.spec import DEFAULT_IMAGE, Backend, BlackwellTrainingJobSpec
from blackwell_operator.render.environment import PLAN_FILE
from blackwell_operator.render.hyperpod import render_hyperpodpytorchjob
from blackwell_operator.render.labels import (
    RENDER_HASH_ANNOTATION,
    auto_resume_annotations,
    child_labels,
    kueue_labels,
    own_labels,
)
from blackwell_operator.render.pod import plan_config_map_name
from blackwell_operator.render.pytorchjob import render_pytorchjob
from blackwell_operator.render.trainjob import render_training_runtime, render_trainjob
from blackwell_trainer.config import Plan


def sha256_of(document: Any) -> str:
    """A stable content hash: canonical JSON (sorted keys, no whitespace)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def with_render_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """Stamp the object with the hash of everything it carries, so a handler patches only on change."""
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations.pop(RENDER_HASH_ANNOTATION, None)
    digest = sha256_of(obj)
    annotations[RENDER_HASH_ANNOTATION] = digest
    obj["metadata"]["annotations"] = dict(sorted(annotations.items()))
    return obj


def render_plan_config_map(
    name: str, namespace: str, plan: Plan, *, labels: dict[str, str]
) -> dict[str, Any]:
    """The ConfigMap the trainer reads its plan from (mounted at /etc/btj/plan.json)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": plan_config_map_name(name), "namespace": namespace, "labels": labels},
        "data": _data(plan),
    }


def unprobed(plan: Plan) -> Plan:
    """The plan without its probe's kept result: the pods' plan hash is of the plan, and the result (the
    job's own record of what it chose, which a restart reads) changes no pod."""
    if plan.probe is None or plan.probe.result is None:
        return plan
    return plan.model_copy(update={"probe": plan.probe.model_copy(update={"result": None})})


def _data(plan: Plan) -> dict[str, str]:
    return {PLAN_FILE: plan.to_json()}


def render_children(
    name: str,
    namespace: str,
    spec: BlackwellTrainingJobSpec,
    plan: Plan,
    *,
    labels: Mapping[str, str] | None = None,
    default_image: str = DEFAULT_IMAGE,
) -> list[dict[str, Any]]:
    """[plan ConfigMap, (TrainingRuntime,) child job] for a BTJ; `labels` are the BTJ's own (Argo CD
    tracking is stripped). The job comes last: what it references is created before it.

    `default_image` is the trainer image for a spec that names none (the operator's setting).

    Pure and deterministic: the same input gives byte-identical YAML. No ownerReferences: the
    handler adopts the children (kopf.adopt) before sending them.
    """
    if spec.backend == Backend.AUTO:
        raise ValueError(
            "resolve spec.backend auto to a job kind first (blackwell_operator.lifecycle.backends)"
        )
    if spec.image is None:
        spec = spec.model_copy(update={"image": default_image})
    common = child_labels(name, labels)
    config_map = render_plan_config_map(name, namespace, plan, labels=dict(common))
    plan_sha256 = sha256_of(_data(unprobed(plan)))
    job_labels = dict(sorted({**common, **kueue_labels(spec)}.items()))
    # The pods: the BTJ's propagated labels, then spec.podLabels over them, then ours (the spec refuses
    # our keys, so nothing the user asked for is dropped).
    pod_labels = dict(sorted({**common, **(spec.pod_labels or {}), **own_labels(name)}.items()))
    job: dict[str, Any]
    if spec.backend == Backend.TRAIN_JOB:
        runtime = render_training_runtime(
            name, namespace, spec, plan, labels=dict(common), pod_labels=pod_labels, plan_sha256=plan_sha256
        )
        runtime = with_render_hash(runtime)
        job = render_trainjob(
            name,
            namespace,
            plan,
            labels=job_labels,
            runtime_sha256=runtime["metadata"]["annotations"][RENDER_HASH_ANNOTATION],
        )
        return [with_render_hash(config_map), runtime, with_render_hash(job)]
    if spec.backend == Backend.HYPERPOD_PYTORCH_JOB:
        job = render_hyperpodpytorchjob(
            name, namespace, spec, plan, labels=job_labels, pod_labels=pod_labels, plan_sha256=plan_sha256
        )
    else:
        job = render_pytorchjob(
            name,
            namespace,
            spec,
            plan,
            labels=job_labels,
            annotations=auto_resume_annotations(spec),
            pod_labels=pod_labels,
            plan_sha256=plan_sha256,
        )
    return [with_render_hash(config_map), with_render_hash(job)]

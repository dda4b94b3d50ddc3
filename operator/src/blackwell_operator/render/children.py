"""render_children: the plan ConfigMap and the child job for a BTJ, deterministic and without owners."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from blackwell_operator.models.spec import DEFAULT_IMAGE, Backend, BlackwellTrainingJobSpec
from blackwell_operator.render.environment import PLAN_FILE
from blackwell_operator.render.hyperpod import render_hyperpodpytorchjob
from blackwell_operator.render.labels import (
    PROPAGATED_ANNOTATION,
    RENDER_HASH_ANNOTATION,
    auto_resume_annotations,
    child_labels,
    job_labels,
    own_labels,
    propagated_annotation,
)
from blackwell_operator.render.pod import plan_config_map_name
from blackwell_operator.render.pytorchjob import render_pytorchjob
from blackwell_operator.render.trainjob import render_training_runtime, render_trainjob
from blackwell_trainer.plan.config import JOB_FILE, JobIdentity, Plan


def sha256_of(document: Any) -> str:
    """A stable content hash: canonical JSON (sorted keys, no whitespace)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def shape_hash(obj: Mapping[str, Any]) -> str:
    """The hash of everything `obj` carries but its own render hash annotation."""
    copied = copy.deepcopy(dict(obj))
    meta = copied["metadata"]
    meta["annotations"] = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != RENDER_HASH_ANNOTATION
    }
    return sha256_of(copied)


def labelled_hash(obj: Mapping[str, Any]) -> str:
    """The render hash an operator version before the shape hash stamped on `obj` as render_children makes
    it now: the hash of all it carries, the BTJ's labels included (and no PROPAGATED_ANNOTATION, which it
    did not write)."""
    copied = copy.deepcopy(dict(obj))
    annotations = copied["metadata"].get("annotations") or {}
    copied["metadata"]["annotations"] = {k: v for k, v in annotations.items() if k != PROPAGATED_ANNOTATION}
    return shape_hash(copied)


def with_render_hash(obj: dict[str, Any], shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Stamp the object with the hash of `shape` (by default the object itself), so a handler patches only
    on change. render_children passes the object as rendered without the BTJ's own labels: a label edit
    is then no new render (a running job would read it as a change it cannot take), and a pass brings
    the labels in step apart (lifecycle/child_apply.label_patch)."""
    digest = shape_hash(obj if shape is None else shape)
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations[RENDER_HASH_ANNOTATION] = digest
    obj["metadata"]["annotations"] = dict(sorted(annotations.items()))
    return obj


def render_plan_config_map(
    name: str, namespace: str, plan: Plan, *, labels: dict[str, str], uid: str
) -> dict[str, Any]:
    """The ConfigMap the trainer reads its plan from (mounted at /etc/btj/plan.json), and beside it the
    job it trains for (/etc/btj/job.json), which its checkpoints record (docs/trainer.md, "Whose checkpoint
    it is"). job.json is not part of the pods' plan hash: it changes no pod."""
    job = JobIdentity(namespace=namespace, name=name, uid=uid)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": plan_config_map_name(name), "namespace": namespace, "labels": labels},
        "data": {**_data(plan), JOB_FILE: job.model_dump_json(by_alias=True)},
    }


def plan_config_map(
    name: str, namespace: str, plan: Plan, *, parent_labels: Mapping[str, str] | None, uid: str
) -> dict[str, Any]:
    """The plan ConfigMap exactly as render_children makes it for a BTJ with labels `parent_labels` and
    metadata.uid `uid` ("" where there is none: `btj render`)."""
    shape = render_plan_config_map(name, namespace, plan, labels=own_labels(name), uid=uid)
    config_map = render_plan_config_map(
        name, namespace, plan, labels=child_labels(name, parent_labels), uid=uid
    )
    return with_render_hash(_recording(config_map, parent_labels), shape)


def _recording(obj: dict[str, Any], parent_labels: Mapping[str, str] | None) -> dict[str, Any]:
    """`obj` with the annotation naming the parent's label keys it was given (PROPAGATED_ANNOTATION)."""
    recorded = propagated_annotation(parent_labels)
    if recorded:
        obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), **recorded}
    return obj


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
    uid: str = "",
) -> list[dict[str, Any]]:
    """[plan ConfigMap, (TrainingRuntime,) child job] for a BTJ; `labels` are the BTJ's own (Argo CD
    tracking is stripped). The job comes last: what it references is created before it.

    `default_image` is the trainer image for a spec that names none (the operator's setting); `uid` the
    BTJ's metadata.uid, for the plan ConfigMap's job.json ("" offline, where there is none).

    Pure and deterministic: the same input gives byte-identical YAML. No ownerReferences: the
    handler adopts the children (kopf.adopt) before sending them.
    """
    if spec.backend == Backend.AUTO:
        raise ValueError(
            "resolve spec.backend auto to a job kind first (blackwell_operator.lifecycle.backends)"
        )
    if spec.image is None:
        spec = spec.model_copy(update={"image": default_image})
    config_map = plan_config_map(name, namespace, plan, parent_labels=labels, uid=uid)
    # Each object's render hash is of its shape: the object rendered without the BTJ's own labels.
    shapes = _render(name, namespace, spec, plan, None, None)
    runtime_sha256 = shape_hash(shapes[0]) if spec.backend == Backend.TRAIN_JOB else None
    rendered = _render(name, namespace, spec, plan, labels, runtime_sha256)
    stamped = [
        with_render_hash(_recording(obj, labels), shape) for obj, shape in zip(rendered, shapes, strict=True)
    ]
    return [config_map, *stamped]


def _render(
    name: str,
    namespace: str,
    spec: BlackwellTrainingJobSpec,
    plan: Plan,
    labels: Mapping[str, str] | None,
    runtime_sha256: str | None,
) -> list[dict[str, Any]]:
    """[(TrainingRuntime,) child job], not stamped; a TrainJob names `runtime_sha256`, by default the hash
    of the runtime rendered here."""
    common = child_labels(name, labels)
    plan_sha256 = sha256_of(_data(unprobed(plan)))
    labels_of_job = job_labels(name, labels, spec)
    # The pods: the BTJ's propagated labels, then spec.podLabels over them, then ours (the spec refuses
    # our keys, so nothing the user asked for is dropped).
    pod_labels = dict(sorted({**common, **(spec.pod_labels or {}), **own_labels(name)}.items()))
    if spec.backend == Backend.TRAIN_JOB:
        runtime = render_training_runtime(
            name, namespace, spec, plan, labels=dict(common), pod_labels=pod_labels, plan_sha256=plan_sha256
        )
        job = render_trainjob(
            name,
            namespace,
            plan,
            labels=labels_of_job,
            runtime_sha256=runtime_sha256 or shape_hash(runtime),
        )
        return [runtime, job]
    if spec.backend == Backend.HYPERPOD_PYTORCH_JOB:
        return [
            render_hyperpodpytorchjob(
                name,
                namespace,
                spec,
                plan,
                labels=labels_of_job,
                pod_labels=pod_labels,
                plan_sha256=plan_sha256,
            )
        ]
    return [
        render_pytorchjob(
            name,
            namespace,
            spec,
            plan,
            labels=labels_of_job,
            annotations=auto_resume_annotations(spec),
            pod_labels=pod_labels,
            plan_sha256=plan_sha256,
        )
    ]

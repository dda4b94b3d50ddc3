"""`spec.backend: auto`: which job kind to create, given the job APIs a cluster serves (pure)."""

from __future__ import annotations

from collections.abc import Collection

from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.render.kinds import JOB_KINDS

CONCRETE = tuple(JOB_KINDS)
# What API discovery looks for (discovery.apis.ServedJobApis).
JOB_RESOURCES = {backend: (row.api_version, row.plural) for backend, row in JOB_KINDS.items()}

# The order `auto` tries (docs/backends.md): Kubeflow Trainer v2 first, where Kubeflow is going and what
# Kueue v0.19 still manages by default (it no longer manages PyTorchJob by default, kubernetes-sigs/kueue
# #12620); then the Training Operator v1 HyperPod installs; HyperPod's own job kind last, where it is the
# only one. HyperPod's auto-resume works on Kubeflow PyTorchJobs only, so a spec that asks for it tries
# PyTorchJob first and never TrainJob (which refuses autoResume).
AUTO_ORDER = (Backend.TRAIN_JOB, Backend.PYTORCH_JOB, Backend.HYPERPOD_PYTORCH_JOB)
AUTO_RESUME_ORDER = (Backend.PYTORCH_JOB, Backend.HYPERPOD_PYTORCH_JOB)


def auto_order(spec: BlackwellTrainingJobSpec) -> tuple[Backend, ...]:
    """The backends `auto` tries for this spec, best first."""
    return AUTO_RESUME_ORDER if spec.auto_resume else AUTO_ORDER


def choose_backend(spec: BlackwellTrainingJobSpec, served: Collection[Backend]) -> Backend | None:
    """spec.backend, or for `auto` the first of auto_order the cluster serves (None: none of them)."""
    if spec.backend != Backend.AUTO:
        return spec.backend
    return next((backend for backend in auto_order(spec) if backend in served), None)


def backend_of_kind(kind: str | None) -> Backend | None:
    """The backend whose job kind is `kind` (a recorded child's), if any."""
    return next((backend for backend, row in JOB_KINDS.items() if row.kind == kind), None)


def none_served_message(spec: BlackwellTrainingJobSpec) -> str:
    """Why `auto` found nothing to create, and what to do."""
    wanted = ", ".join(f"{JOB_KINDS[b].kind} ({JOB_KINDS[b].api_version})" for b in auto_order(spec))
    return (
        f"spec.backend is auto and the cluster serves none of {wanted}. Fix: install Kubeflow Trainer v2 "
        "(TrainJob) or the Kubeflow Training Operator (PyTorchJob, which HyperPod EKS clusters have), or "
        "name a backend the cluster has"
    )


def with_backend(spec: BlackwellTrainingJobSpec, backend: Backend) -> BlackwellTrainingJobSpec:
    """The spec with a concrete backend, for the renderer."""
    return spec if spec.backend == backend else spec.model_copy(update={"backend": backend})

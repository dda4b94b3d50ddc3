"""`spec.backend: auto`: which job kind to create, given the job APIs a cluster serves (pure)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.render import hyperpod, pytorchjob, trainjob


@dataclass(frozen=True)
class JobApi:
    """Where a backend's job kind lives in the API."""

    api_version: str
    kind: str
    plural: str


JOB_APIS: dict[Backend, JobApi] = {
    Backend.PYTORCH_JOB: JobApi(pytorchjob.API_VERSION, pytorchjob.KIND, "pytorchjobs"),
    Backend.HYPERPOD_PYTORCH_JOB: JobApi(hyperpod.API_VERSION, hyperpod.KIND, "hyperpodpytorchjobs"),
    Backend.TRAIN_JOB: JobApi(trainjob.API_VERSION, trainjob.KIND, "trainjobs"),
}
CONCRETE = tuple(JOB_APIS)
# What API discovery looks for (discovery.apis.ServedJobApis).
JOB_RESOURCES = {backend: (api.api_version, api.plural) for backend, api in JOB_APIS.items()}

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
    return next((backend for backend, api in JOB_APIS.items() if api.kind == kind), None)


def none_served_message(spec: BlackwellTrainingJobSpec) -> str:
    """Why `auto` found nothing to create, and what to do."""
    wanted = ", ".join(f"{JOB_APIS[b].kind} ({JOB_APIS[b].api_version})" for b in auto_order(spec))
    return (
        f"spec.backend is auto and the cluster serves none of {wanted}. Fix: install Kubeflow Trainer v2 "
        "(TrainJob) or the Kubeflow Training Operator (PyTorchJob, which HyperPod EKS clusters have), or "
        "name a backend the cluster has"
    )


def with_backend(spec: BlackwellTrainingJobSpec, backend: Backend) -> BlackwellTrainingJobSpec:
    """The spec with a concrete backend, for the renderer."""
    return spec if spec.backend == backend else spec.model_copy(update={"backend": backend})

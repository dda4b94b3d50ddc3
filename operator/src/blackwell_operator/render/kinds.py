"""The child kinds, one row per backend: where each job kind, and what a job references, lives in the API."""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_operator.models.spec import Backend
from blackwell_operator.render import hyperpod, pytorchjob, trainjob


@dataclass(frozen=True)
class ChildKind:
    """Where one kind of child lives in the API: its kind, apiVersion and plural."""

    kind: str
    api_version: str
    plural: str

    @property
    def group(self) -> str:
        """The API group ("" for the core group, whose apiVersion is just "v1")."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        """The version within the group."""
        return self.api_version.rpartition("/")[2]

    @property
    def singular(self) -> str:
        """The singular resource name (the kind in lower case, as every kind here spells it)."""
        return self.kind.lower()

    @property
    def resource(self) -> str:
        """`<apiVersion>/<plural>`: how the emulated cluster names the resource."""
        return f"{self.api_version}/{self.plural}"


# One row per concrete backend, built from its render module: a new backend is a render module with KIND,
# API_VERSION and PLURAL, and a row here.
JOB_KINDS: dict[Backend, ChildKind] = {
    Backend.PYTORCH_JOB: ChildKind(pytorchjob.KIND, pytorchjob.API_VERSION, pytorchjob.PLURAL),
    Backend.HYPERPOD_PYTORCH_JOB: ChildKind(hyperpod.KIND, hyperpod.API_VERSION, hyperpod.PLURAL),
    Backend.TRAIN_JOB: ChildKind(trainjob.KIND, trainjob.API_VERSION, trainjob.PLURAL),
}

# What a job references, created before it and patched with it: the plan ConfigMap (every backend), and
# for a TrainJob its per-job TrainingRuntime.
CONFIG_MAP = ChildKind("ConfigMap", "v1", "configmaps")
TRAINING_RUNTIME = ChildKind(trainjob.RUNTIME_KIND, trainjob.API_VERSION, trainjob.RUNTIME_PLURAL)
SUPPORTING_KINDS: dict[str, ChildKind] = {row.kind: row for row in (CONFIG_MAP, TRAINING_RUNTIME)}

# What stands between a job kind and its pods, pod side first: a TrainJob's pods are controlled by a Job
# of the JobSet the TrainJob controls; the other kinds control their pods themselves
# (docs/reference/pod-ownership.md).
JOBSET = ChildKind(trainjob.JOBSET_KIND, trainjob.JOBSET_API_VERSION, trainjob.JOBSET_PLURAL)
BATCH_JOB = ChildKind(trainjob.BATCH_JOB_KIND, trainjob.BATCH_JOB_API_VERSION, trainjob.BATCH_JOB_PLURAL)
POD_OWNER_CHAINS: dict[str, tuple[ChildKind, ...]] = {
    **{row.kind: () for row in JOB_KINDS.values()},
    trainjob.KIND: (BATCH_JOB, JOBSET),
}


def job_kind(kind: object) -> ChildKind | None:
    """The row of a job kind (a child's or an owner reference's `kind`), or None when it is not ours."""
    return next((row for row in JOB_KINDS.values() if row.kind == kind), None)

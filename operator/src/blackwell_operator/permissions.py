"""Every (apiGroup, resource, verbs) the operator calls, Kopf's own calls included: the source of RBAC."""

from __future__ import annotations

from typing import NamedTuple

from blackwell_operator.render.kinds import BATCH_JOB, CONFIG_MAP, JOB_KINDS, JOBSET, TRAINING_RUNTIME


class Permission(NamedTuple):
    """One RBAC rule: API group ("" for core), resource (optionally /subresource), verbs."""

    api_group: str
    resource: str
    verbs: tuple[str, ...]


PERMISSIONS: tuple[Permission, ...] = (
    # Kopf: discovers CRDs and, with --namespace patterns, namespaces.
    Permission("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
    Permission("", "namespaces", ("list", "watch")),
    # Kopf: the BTJs it serves (annotations for its progress and diff base are patched on the object).
    Permission("training.blackwell.dev", "blackwelltrainingjobs", ("get", "list", "watch", "patch")),
    # The operator: phase, conditions, plan, child (status subresource; read-modify-write with an RV).
    Permission("training.blackwell.dev", "blackwelltrainingjobs/status", ("patch",)),
    # Admission, not a call: children carry ownerReferences with blockOwnerDeletion, which the
    # OwnerReferencesPermissionEnforcement plugin allows only to whoever may update the owner's finalizers.
    Permission("training.blackwell.dev", "blackwelltrainingjobs/finalizers", ("update",)),
    # The operator: the child jobs and the plan ConfigMap (create-or-get, patched on a safe spec change); a
    # child is deleted when a worker ends on a permanent error, so its GPUs are not held by retries, and
    # patched to add and release its final-status finalizer.
    *(
        Permission(row.group, row.plural, ("get", "list", "watch", "create", "patch", "delete"))
        for row in JOB_KINDS.values()
    ),
    # The operator: a TrainJob's per-job TrainingRuntime, created before it and patched with it like the
    # plan ConfigMap (get-or-create; never watched; deleted, like the ConfigMap, when the TrainJob's create
    # is refused or the finished TrainJob is gone, else it goes with the BTJ's owner reference).
    Permission(TRAINING_RUNTIME.group, TRAINING_RUNTIME.plural, ("get", "create", "patch", "delete")),
    # The plan ConfigMap is deleted when its job create is refused or its finished job is gone.
    Permission(CONFIG_MAP.group, CONFIG_MAP.plural, ("get", "create", "patch", "delete")),
    # The operator: cluster capacity (nodes of the instance type and their HyperPod health label), and the
    # node watch that times each node's absence for elastic jobs (track-nodes).
    Permission("", "nodes", ("list", "watch")),
    # The operator (track-pods): watches trainer pods, filtered by label on the server, to copy a failed
    # trainer container's exit code, reason and termination message onto the BTJ (status.lastFailure).
    # Nothing is fetched by name: the pod comes with each event. The stuck-pod sweep lists a running BTJ's
    # trainer pods and force-deletes one stuck Terminating on a gone or not-Ready node (lifecycle.stuck_pods).
    # With BTJ_FREE_CAPACITY, capacity lists the pods on nodes in every namespace (a cluster-scoped list,
    # the chart's operator.freeCapacity) and keeps of each its node, namespace, job label and GPUs only.
    Permission("", "pods", ("list", "watch", "delete")),
    # The operator: a pod's result counts only when its controllers lead to our child by uid
    # (lifecycle/ownership.py); a TrainJob's pods are controlled by a Job of its JobSet, read by name.
    *(Permission(row.group, row.plural, ("get",)) for row in (BATCH_JOB, JOBSET)),
    # The operator: before it creates a child, it reads the ServiceAccount its pods name (by name, never
    # listed); a missing one holds the create (handlers/preflight.py).
    Permission("", "serviceaccounts", ("get",)),
    # Kopf and the operator: Events on BTJs.
    Permission("", "events", ("create",)),
)

# Granted only when the chart's operator.checkImagePullSecrets is on (BTJ_CHECK_IMAGE_PULL_SECRETS): the
# pull Secrets a spec names are read by name to warn when one is missing. Off by default, since RBAC cannot
# limit `get secrets` to those names.
OPT_IN: tuple[Permission, ...] = (Permission("", "secrets", ("get",)),)


# Grants that no API call uses: they are checked by admission plugins when the operator creates children.
ADMISSION_ONLY: frozenset[tuple[str, str, str]] = frozenset(
    {("training.blackwell.dev", "blackwelltrainingjobs/finalizers", "update")}
)


def granted(api_group: str, resource: str, verb: str, *, opt_in: bool = False) -> bool:
    """Whether PERMISSIONS (with `opt_in`, OPT_IN too) covers one call."""
    rules = PERMISSIONS + OPT_IN if opt_in else PERMISSIONS
    return any(p.api_group == api_group and p.resource == resource and verb in p.verbs for p in rules)

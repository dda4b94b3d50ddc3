"""Kubernetes RBAC's authorization rule, evaluated over rendered chart objects: may this ServiceAccount make
this request? (Roles and ClusterRoles only add rights: a request is allowed when one bound rule covers it.)"""

from __future__ import annotations

from typing import Any, NamedTuple


class Request(NamedTuple):
    """One API request as RBAC sees it (`namespace` None: a cluster-scoped resource, or across all)."""

    api_group: str
    resource: str  # plural, with /subresource
    verb: str
    namespace: str | None = None
    name: str | None = None


def _covers(rule: dict[str, Any], request: Request) -> bool:
    names = rule.get("resourceNames")
    return (
        request.api_group in rule.get("apiGroups", [])
        and request.resource in rule.get("resources", [])
        and request.verb in rule.get("verbs", [])
        and (not names or (request.name in names and request.verb not in ("list", "watch", "create")))
    )


def _bound(binding: dict[str, Any], account: tuple[str, str]) -> bool:
    namespace, name = account
    return any(
        s.get("kind") == "ServiceAccount" and s.get("name") == name and s.get("namespace") == namespace
        for s in binding.get("subjects", [])
    )


def allowed(objects: list[dict[str, Any]], account: tuple[str, str], request: Request) -> bool:
    """Whether the (namespace, name) ServiceAccount may make `request` under the rendered RBAC objects."""
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objects
        if o.get("kind") in ("Role", "ClusterRole")
    }
    for binding in objects:
        kind = binding.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding") or not _bound(binding, account):
            continue
        where = binding["metadata"].get("namespace") if kind == "RoleBinding" else None
        if where is not None and where != request.namespace:
            continue  # a RoleBinding grants only inside its own namespace
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], where if ref["kind"] == "Role" else None, ref["name"]))
        if role and any(_covers(rule, request) for rule in role.get("rules", [])):
            return True
    return False


def operator_account(objects: list[dict[str, Any]]) -> tuple[str, str]:
    """(namespace, name) of the ServiceAccount the operator's Deployment runs as."""
    (deployment,) = [o for o in objects if o.get("kind") == "Deployment"]
    return deployment["metadata"]["namespace"], deployment["spec"]["template"]["spec"]["serviceAccountName"]

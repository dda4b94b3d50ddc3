"""Least-privilege RBAC: no wildcards, and exactly what the operator declares it uses
(blackwell_operator.permissions.PERMISSIONS) plus the documented rules Kopf itself needs."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.support.helm import CHART, NAMESPACE, TEAM, VALUES_CASES, by_kind, render, values_id
from tests.support.rbac import Request, allowed, operator_account

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)

# What Kopf needs whatever the operator's code does (KOPF docs/deployment-rbac.yaml): observe CRDs,
# observe namespaces when confined to some (--namespace), post events, and list/watch/patch the
# served resource and its status (progress annotations, finalizers, patch.status).
FRAMEWORK: set[Grant] = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("", "events", "create"),
    ("training.blackwell.dev", "blackwelltrainingjobs", "list"),
    ("training.blackwell.dev", "blackwelltrainingjobs", "watch"),
    ("training.blackwell.dev", "blackwelltrainingjobs", "patch"),
    ("training.blackwell.dev", "blackwelltrainingjobs/status", "patch"),
}
CLUSTER_SCOPED = {"nodes", "namespaces", "customresourcedefinitions"}
# What the ClusterRole may also hold in namespaced mode: the list of pods on nodes (operator.freeCapacity,
# on by default), one verb, `list`.
FREE_CAPACITY_GRANT = ("", "pods", "list")
# The Role for the cluster calibration's ConfigMap in the release namespace (in both modes).
CALIBRATION_ROLE_SUFFIX = "-calibration"
# The served-namespace marker: a Role per watched namespace granting an inert verb to a ServiceAccount name
# no pod runs as, not to the operator (tests/helm/test_install_steps.py checks it grants nothing).
MARKER_COMPONENT = "served-namespace"


def _is_marker(obj: dict[str, Any]) -> bool:
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == MARKER_COMPONENT


def watch_roles(objects: list[dict[str, Any]], kind: str = "Role") -> list[dict[str, Any]]:
    """The operator's Roles (or RoleBindings) of namespaced mode: one per watched namespace."""
    return [
        r
        for r in by_kind(objects, kind)
        if not r["metadata"]["name"].endswith(CALIBRATION_ROLE_SUFFIX) and not _is_marker(r)
    ]


def grants(rules: Iterable[dict[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def chart_grants(objects: list[dict[str, Any]]) -> set[Grant]:
    """What the chart grants the operator (the served-namespace markers grant it nothing)."""
    roles = [r for r in by_kind(objects, "ClusterRole") + by_kind(objects, "Role") if not _is_marker(r)]
    return set().union(*(grants(role["rules"]) for role in roles))


def declared_permissions() -> set[Grant]:
    """PERMISSIONS as (group, resource, verb) triples, whatever record type holds them."""
    from blackwell_operator import permissions as module

    declared: set[Grant] = set()
    for item in module.PERMISSIONS:
        if isinstance(item, tuple | list):
            group, resource, verbs = item
        else:
            group = getattr(item, "api_group", getattr(item, "group", None))
            resource, verbs = item.resource, item.verbs
        verbs = [verbs] if isinstance(verbs, str) else list(verbs)
        declared |= {(str(group), str(resource), str(verb)) for verb in verbs}
    return declared


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_no_wildcards(helm: str, values: Path | None) -> None:
    for role in by_kind(render(helm, values), "ClusterRole") + by_kind(render(helm, values), "Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: wildcard in {key}"
            assert "nonResourceURLs" not in rule
            assert "resourceNames" not in rule or rule["resourceNames"]


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_chart_grants_exactly_what_the_operator_declares(helm: str, values: Path | None) -> None:
    declared = declared_permissions()
    objects = render(helm, values)
    granted = chart_grants(objects)
    args = deployment_args(objects)
    if not [a for a in args if a.startswith("--namespace")]:
        # Cluster-wide with nothing excluded, Kopf never lists or watches namespaces (it does so only to
        # match --namespace patterns: kopf/_core/reactor/observation.py), so that grant is not needed.
        declared -= {("", "namespaces", "list"), ("", "namespaces", "watch")}
    missing = declared - granted
    assert not missing, f"the operator uses permissions the chart does not grant: {sorted(missing)}"
    extra = granted - declared - FRAMEWORK
    assert not extra, f"the chart grants more than the operator declares: {sorted(extra)}"


def deployment_args(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = by_kind(objects, "Deployment")
    return list(deployment["spec"]["template"]["spec"]["containers"][0].get("args", []))


def test_namespaces_are_read_only_and_read_only_when_kopf_matches_them(helm: str) -> None:
    read = {("", "namespaces", "list"), ("", "namespaces", "watch")}
    for values in (None, CHART / "ci" / "namespaced-values.yaml", CHART / "ci" / "cluster-wide-values.yaml"):
        assert {g for g in chart_grants(render(helm, values)) if g[1] == "namespaces"} == read
    # Cluster-wide with nothing excluded, its own namespace served too, Kopf reads no namespace: nothing is
    # granted.
    everything = render(
        helm,
        sets=(
            "operator.clusterWide=true",
            "operator.excludeNamespaces=null",
            "operator.serveOwnNamespace=true",
        ),
    )
    assert {g for g in chart_grants(everything) if g[1] == "namespaces"} == set()


def test_nodes_are_read_only(helm: str) -> None:
    node_verbs = {verb for group, resource, verb in chart_grants(render(helm)) if resource == "nodes"}
    assert node_verbs and node_verbs <= {"get", "list", "watch"}


def test_the_default_rights_are_the_listed_namespace_only(helm: str) -> None:
    """Least privilege by default: a Role in the one namespace listed (not the release namespace), and the
    ClusterRole holds only reads of cluster-scoped resources; nothing is granted in kube-system or any other
    namespace."""
    objects = render(helm)
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert {resource for _, resource, _ in grants(cluster_role["rules"])} == CLUSTER_SCOPED | {"pods"}
    assert {g for g in grants(cluster_role["rules"]) if g[1] == "pods"} == {FREE_CAPACITY_GRANT}
    assert {verb for _, _, verb in grants(cluster_role["rules"])} <= {"get", "list", "watch"}
    assert [r["metadata"]["namespace"] for r in watch_roles(objects)] == [TEAM]
    assert [b["metadata"]["namespace"] for b in watch_roles(objects, "RoleBinding")] == [TEAM]
    for binding in by_kind(objects, "RoleBinding") + by_kind(objects, "ClusterRoleBinding"):
        assert binding["metadata"].get("namespace") != "kube-system"


def test_cluster_wide_is_opt_in_and_leaves_the_system_namespaces_to_themselves(helm: str) -> None:
    objects = render(helm, CHART / "ci" / "cluster-wide-values.yaml")
    assert not watch_roles(objects)
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert declared_permissions() <= grants(cluster_role["rules"])
    # The release namespace, the operator's own, is left out as the system ones are.
    assert f"--namespace=!kube-system,!kube-public,!kube-node-lease,!{NAMESPACE}" in deployment_args(objects)


@pytest.mark.parametrize(
    ("sets", "message", "release_namespace"),
    [
        (("operator.watchNamespaces={kube-system}",), "kube-system is a system namespace", NAMESPACE),
        (("operator.watchNamespaces={team-a,kube-public}",), "kube-public is a system namespace", NAMESPACE),
        (("operator.clusterWide=true", "operator.watchNamespaces={team-a}"), "set one of them", NAMESPACE),
        # Installed into a system namespace: in every mode the calibration Role's ConfigMap writes land there.
        (("operator.watchNamespaces={team-a}",), "release namespace kube-system is a system", "kube-system"),
        # No scope at all: the chart does not guess one (issue 36: never the operator's own namespace).
        ((), "operator.watchNamespaces is empty: list the namespaces", NAMESPACE),
        (("operator.watchNamespaces={team-a,btj-system}",), "btj-system is the operator's own", NAMESPACE),
        (("operator.watchNamespaces={team-a}",), "release namespace kube-public is a system", "kube-public"),
        (("operator.clusterWide=true",), "release namespace kube-node-lease is a system", "kube-node-lease"),
    ],
)
def test_a_scope_that_reaches_a_system_namespace_or_is_ambiguous_is_refused(
    helm: str, sets: tuple[str, ...], message: str, release_namespace: str
) -> None:
    result = subprocess.run(
        [
            helm,
            "template",
            "t",
            str(CHART),
            "-n",
            release_namespace,
            *(a for s in sets for a in ("--set", s)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and message in result.stderr


def test_namespaced_mode_uses_roles_in_each_watched_namespace(helm: str) -> None:
    objects = render(helm, CHART / "ci" / "namespaced-values.yaml")
    (cluster_role,) = by_kind(objects, "ClusterRole")
    cluster_resources = {resource for _, resource, _ in grants(cluster_role["rules"])}
    assert cluster_resources == CLUSTER_SCOPED | {"pods"}
    roles = watch_roles(objects)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["hyperpod-ns-team-a", "hyperpod-ns-team-b"]
    bindings = watch_roles(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == [
        "hyperpod-ns-team-a",
        "hyperpod-ns-team-b",
    ]
    for role in roles:
        assert not {resource for _, resource, _ in grants(role["rules"])} & CLUSTER_SCOPED
    # Cluster-wide and namespaced mode grant the same namespaced permissions.
    wide = {
        g
        for g in chart_grants(render(helm, CHART / "ci" / "cluster-wide-values.yaml"))
        if g[1] not in CLUSTER_SCOPED
    }
    assert grants(roles[0]["rules"]) == wide


def test_every_rule_says_whether_kopf_or_the_operator_needs_it() -> None:
    text = (CHART / "templates" / "_rbac.tpl").read_text()
    rules = [m.start() for m in re.finditer(r"^- apiGroups:", text, flags=re.MULTILINE)]
    assert len(rules) >= 8
    for start in rules:
        preceding = text[:start].rstrip().splitlines()
        comment_block = []
        for line in reversed(preceding):
            if not line.lstrip().startswith("#"):
                break
            comment_block.append(line)
        assert any(re.search(r"# (Framework|Application)", line) for line in comment_block), text[
            start : start + 80
        ]


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_the_cluster_calibration_role_is_one_config_map_in_the_release_namespace(
    helm: str, values: Path | None
) -> None:
    objects = render(helm, values)
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith(CALIBRATION_ROLE_SUFFIX)]
    assert role["metadata"]["namespace"] == NAMESPACE
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert grants(named) == {("", "configmaps", "get"), ("", "configmaps", "patch")}
    assert all(r["resourceNames"] == ["btj-cluster-calibration"] for r in named)
    # Create cannot be limited to a name; nothing else is granted without one.
    assert grants(r for r in role["rules"] if not r.get("resourceNames")) == {("", "configmaps", "create")}
    (binding,) = [
        b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"].endswith(CALIBRATION_ROLE_SUFFIX)
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (deployment,) = by_kind(objects, "Deployment")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (
        env["BTJ_CLUSTER_CALIBRATION_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    )


def test_without_the_cluster_calibration_there_is_no_role_and_no_namespace(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "off.yaml"
    values.write_text(
        "operator:\n  watchNamespaces: [team-a]\n  verbose: false\n  clusterCalibration: false\n"
    )
    objects = render(helm, values)
    assert not [
        r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith(CALIBRATION_ROLE_SUFFIX)
    ]
    (deployment,) = by_kind(objects, "Deployment")
    names = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "BTJ_CLUSTER_CALIBRATION_NAMESPACE" not in names


def test_reading_secrets_is_opt_in_and_sets_the_operators_check(helm: str) -> None:
    """`get secrets` cannot be limited to names: off by default; operator.checkImagePullSecrets grants exactly
    permissions.OPT_IN and turns the operator's check on, in both modes."""
    from blackwell_operator import permissions

    opt_in = {(p.api_group, p.resource, verb) for p in permissions.OPT_IN for verb in p.verbs}
    assert opt_in == {("", "secrets", "get")}
    for values in (None, CHART / "ci" / "namespaced-values.yaml"):
        off = render(helm, values)
        on = render(helm, values, sets=("operator.checkImagePullSecrets=true",))
        assert not chart_grants(off) & opt_in, "nothing reads Secrets by default"
        assert chart_grants(on) - chart_grants(off) == opt_in
        (deployment,) = by_kind(on, "Deployment")
        env = {
            e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["BTJ_CHECK_IMAGE_PULL_SECRETS"] == "true"
        (deployment,) = by_kind(off, "Deployment")
        names = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert "BTJ_CHECK_IMAGE_PULL_SECRETS" not in names


# Where the operator's ServiceAccount may act, by Kubernetes' own RBAC rule over the rendered objects.
WRITES = [
    Request("", "pods", "delete", "{ns}", "w-0"),
    Request("", "configmaps", "patch", "{ns}", "job-plan"),
    Request("kubeflow.org", "pytorchjobs", "create", "{ns}"),
    Request("", "pods", "watch", "{ns}"),
]


def may(objects: list[dict[str, Any]], request: Request, namespace: str) -> bool:
    return allowed(objects, operator_account(objects), request._replace(namespace=namespace))


def test_by_default_the_operator_may_act_in_the_listed_namespace_only(helm: str) -> None:
    objects = render(helm)
    for request in WRITES:
        assert may(objects, request, TEAM), request
        for elsewhere in ("kube-system", NAMESPACE, "hyperpod-ns-team-b", "default"):
            assert not may(objects, request, elsewhere), (request, elsewhere)
    # Cluster-scoped reads stay: capacity from nodes, and (operator.freeCapacity, on by default) a list of
    # the pods on them, nothing more; with freeCapacity=false, no cluster-wide list of pods.
    assert allowed(objects, operator_account(objects), Request("", "nodes", "list"))
    assert allowed(objects, operator_account(objects), Request("", "pods", "list"))
    for verb in ("watch", "get", "delete"):
        assert not allowed(objects, operator_account(objects), Request("", "pods", verb, "kube-system", "x"))
    without = render(helm, sets=("operator.freeCapacity=false",))
    assert not allowed(without, operator_account(without), Request("", "pods", "list"))


def test_watched_namespaces_are_the_only_ones_written(helm: str) -> None:
    objects = render(helm, CHART / "ci" / "namespaced-values.yaml")
    for request in WRITES:
        for team in ("hyperpod-ns-team-a", "hyperpod-ns-team-b"):
            assert may(objects, request, team), (request, team)
        for elsewhere in ("kube-system", "hyperpod-ns-team-c", NAMESPACE):
            assert not may(objects, request, elsewhere), (request, elsewhere)
    # In its own namespace only the cluster calibration's one ConfigMap (and creating it).
    calibration = Request("", "configmaps", "patch", NAMESPACE, "btj-cluster-calibration")
    assert may(objects, calibration, NAMESPACE)


def test_cluster_wide_rights_reach_every_namespace_as_documented(helm: str) -> None:
    """RBAC cannot subtract a namespace from a ClusterRoleBinding: the chart's README and docs/security.md
    say so, and that the operator's own Kopf pattern leaves the system namespaces alone."""
    objects = render(helm, CHART / "ci" / "cluster-wide-values.yaml")
    for request in WRITES:
        assert may(objects, request, "hyperpod-ns-team-c") and may(objects, request, "kube-system")
    readme = (CHART / "README.md").read_text()
    assert "RBAC cannot leave a namespace out of a ClusterRoleBinding" in readme


def _free_capacity_env(objects: list[dict[str, Any]]) -> str:
    (deployment,) = by_kind(objects, "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    return str(env["BTJ_FREE_CAPACITY"])


def test_free_capacity_adds_a_cluster_wide_list_of_pods_and_nothing_else(helm: str) -> None:
    """operator.freeCapacity (issue 36): the operator lists the pods on nodes in every namespace to count
    the GPUs other workloads hold; it may not watch, get, change or delete any pod outside its namespaces."""
    objects = render(helm, sets=(f"operator.watchNamespaces={{{TEAM}}}", "operator.freeCapacity=true"))
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert {g for g in grants(cluster_role["rules"]) if g[1] == "pods"} == {("", "pods", "list")}
    account = operator_account(objects)
    assert allowed(objects, account, Request("", "pods", "list"))
    for verb in ("watch", "get", "delete", "patch"):
        assert not allowed(objects, account, Request("", "pods", verb, "kube-system", "x")), verb
    assert _free_capacity_env(objects) == "true"
    # On by default; off only where asked (the operator then says so in CapacityAvailable); cluster-wide
    # mode has the list with its namespaced rules, and counts free GPUs.
    assert _free_capacity_env(render(helm)) == "true"
    assert _free_capacity_env(render(helm, sets=("operator.freeCapacity=false",))) == "false"
    assert _free_capacity_env(render(helm, CHART / "ci" / "cluster-wide-values.yaml")) == "true"

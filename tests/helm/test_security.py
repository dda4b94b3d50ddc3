"""The operator Deployment runs as Kopf wants (one replica, Recreate) under the restricted PSS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.helm import CHART, VALUES_CASES, by_kind, render, values_id

CI = CHART / "ci"


def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = by_kind(objects, "Deployment")
    return only


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_restricted_pod_security(helm: str, values: Path | None) -> None:
    pod = deployment(render(helm, values))["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod.get("hostNetwork", False) is False
    assert pod.get("hostPID", False) is False
    for container in pod["containers"]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["runAsNonRoot"] is True
        assert ctx["capabilities"]["drop"] == ["ALL"]
        assert not ctx["capabilities"].get("add")
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        assert ctx.get("privileged", False) is False
    # A numeric non-root user, so runAsNonRoot can be verified by the kubelet.
    assert isinstance(pod["securityContext"]["runAsUser"], int) and pod["securityContext"]["runAsUser"] > 0


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_writable_tmp_on_a_read_only_root(helm: str, values: Path | None) -> None:
    pod = deployment(render(helm, values))["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert all("hostPath" not in v for v in pod["volumes"])


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_one_replica_recreate_probes_and_metrics_port(helm: str, values: Path | None) -> None:
    dep = deployment(render(helm, values))
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["btj", "run"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]


def container_args(objects: list[dict[str, Any]]) -> list[str]:
    return list(deployment(objects)["spec"]["template"]["spec"]["containers"][0].get("args", []))


def test_watch_scope_follows_values(helm: str) -> None:
    # The one required value: the operator serves the namespaces listed, never its own by default.
    assert [a for a in container_args(render(helm)) if a.startswith("--namespace")] == [
        "--namespace=hyperpod-ns-team-a"
    ]
    args = container_args(render(helm, CI / "namespaced-values.yaml"))
    assert "--namespace=hyperpod-ns-team-a" in args and "--namespace=hyperpod-ns-team-b" in args
    # Cluster-wide: one Kopf pattern that leaves the system namespaces and the operator's own out.
    args = container_args(render(helm, CI / "cluster-wide-values.yaml"))
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=!kube-system,!kube-public,!kube-node-lease,!btj-system"
    ]


def test_the_served_namespaces_match_kopfs_patterns(helm: str) -> None:
    """What the chart's arguments make Kopf serve, with Kopf's own matcher: kube-system never."""
    from blackwell_operator.handlers.kopf_private import match_namespace

    for values in (None, CI / "namespaced-values.yaml", CI / "cluster-wide-values.yaml"):
        patterns = [a.removeprefix("--namespace=") for a in container_args(render(helm, values))]
        patterns = [p for p in patterns if not p.startswith("--")]
        for system in ("kube-system", "kube-public", "kube-node-lease"):
            assert not any(match_namespace(system, p) for p in patterns), (values, system)  # type: ignore[arg-type]
    wide = [
        a.removeprefix("--namespace=") for a in container_args(render(helm, CI / "cluster-wide-values.yaml"))
    ]
    assert all(match_namespace("hyperpod-ns-team-a", p) for p in wide)  # type: ignore[arg-type]


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_btj_run_accepts_the_arguments_the_chart_passes(helm: str, values: Path | None) -> None:
    """The container's command line parses with the real `btj run` (click parses, nothing runs)."""
    import typer.main

    from blackwell_operator import cli

    cli._register_commands()
    objects = render(helm, values)
    container = deployment(objects)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["btj", "run"]
    group = typer.main.get_command(cli.app)
    run = group.commands["run"]  # type: ignore[attr-defined]
    context = run.make_context("run", container_args(objects))
    namespaces = context.params["namespace"] or []
    assert sorted(namespaces) == sorted(
        a.removeprefix("--namespace=") for a in container_args(objects) if a.startswith("--namespace=")
    )
    # The chart's probes and metrics port assume the default bind.
    assert context.params["metrics_bind"] == "0.0.0.0:8080"


def test_custom_image_and_existing_service_account(helm: str) -> None:
    objects = render(helm, Path(__file__).parents[2] / "helm/btj-operator/ci/custom-image-values.yaml")
    assert not by_kind(objects, "ServiceAccount")
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "btj-operator-irsa"
    assert (
        pod["containers"][0]["image"] == "123456789012.dkr.ecr.us-west-2.amazonaws.com/btj-operator:0.1.0-rc1"
    )
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "btj-operator-irsa"


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_the_operator_and_its_hook_are_admitted_at_restricted(helm: str, values: Path | None) -> None:
    """The upstream restricted checks (tests/pod_security.py), as for the trainer pods."""
    from tests.pod_security import violations

    objects = render(helm, values)
    templates = [o["spec"]["template"] for o in by_kind(objects, "Deployment") + by_kind(objects, "Job")]
    assert len(templates) == 2
    for template in templates:
        assert violations(template) == []

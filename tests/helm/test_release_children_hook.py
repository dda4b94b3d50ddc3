"""The pre-delete hook Job that runs `btj release-children` on `helm uninstall` (real helm binary).

Its API calls are the operator's own (tests/operator/test_release_children.py checks each against
PERMISSIONS, which tests/helm/test_rbac.py checks against the chart), so it needs no RBAC of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.helm import CHART, VALUES_CASES, by_kind, render, values_id


def hook(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = by_kind(objects, "Job")
    return job


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_the_hook_runs_before_helm_deletes_anything_and_leaves_nothing_behind(
    helm: str, values: Path | None
) -> None:
    job = hook(render(helm, values))
    assert job["metadata"]["name"].endswith("-release-children")
    assert job["metadata"]["namespace"] == "btj-system"
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-delete"
    policies = set(annotations["helm.sh/hook-delete-policy"].split(","))
    assert policies == {"before-hook-creation", "hook-succeeded"}, "a failed run is kept for its logs"
    assert job["spec"]["activeDeadlineSeconds"] == 240, "within helm uninstall's default 5 m timeout"
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_the_hook_runs_as_the_operator_with_its_image_and_pod_security(
    helm: str, values: Path | None
) -> None:
    objects = render(helm, values)
    (deployment,) = by_kind(objects, "Deployment")
    operator_pod, hook_pod = deployment["spec"]["template"]["spec"], hook(objects)["spec"]["template"]["spec"]
    assert hook_pod["serviceAccountName"] == operator_pod["serviceAccountName"]
    assert hook_pod["securityContext"] == operator_pod["securityContext"]
    assert hook_pod.get("imagePullSecrets") == operator_pod.get("imagePullSecrets")
    (container,), (operator,) = hook_pod["containers"], operator_pod["containers"]
    assert container["image"] == operator["image"]
    assert container["securityContext"] == operator["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    # Its pod is neither one of the Deployment's nor behind the metrics Service.
    labels = hook(objects)["spec"]["template"]["metadata"]["labels"]
    assert not selects(deployment["spec"]["selector"]["matchLabels"], labels)
    (service,) = by_kind(objects, "Service")
    assert not selects(service["spec"]["selector"], labels)


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_the_hook_covers_the_namespaces_the_operator_watches(helm: str, values: Path | None) -> None:
    """The command line parses with the real `btj release-children` (click parses, nothing runs)."""
    import typer.main

    from blackwell_operator import cli

    cli._register_commands()
    objects = render(helm, values)
    (container,) = hook(objects)["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["btj", "release-children"]
    command = typer.main.get_command(cli.app).commands["release-children"]  # type: ignore[attr-defined]
    params = command.make_context("release-children", list(container["args"])).params
    (deployment,) = by_kind(objects, "Deployment")
    served = [
        a.removeprefix("--namespace=")
        for a in deployment["spec"]["template"]["spec"]["containers"][0].get("args", [])
        if a.startswith("--namespace=")
    ]
    if any(s.startswith("!") for s in served):
        # Cluster-wide: every BTJ's children are released (the operator made none in an excluded namespace).
        assert params["all_namespaces"] and not params["namespace"]
    else:
        assert served, "namespaced by default"
        assert sorted(params["namespace"]) == sorted(served) and not params["all_namespaces"]
    assert not params["dry_run"]


def test_the_hook_can_be_turned_off_and_timed(helm: str) -> None:
    assert not by_kind(render(helm, sets=("uninstallHook.enabled=false",)), "Job")
    job = hook(render(helm, sets=("uninstallHook.timeoutSeconds=90", "uninstallHook.backoffLimit=0")))
    assert job["spec"]["activeDeadlineSeconds"] == 90 and job["spec"]["backoffLimit"] == 0


def test_a_bad_hook_value_is_refused_by_the_schema(helm: str) -> None:
    from tests.support.helm import run_helm

    result = run_helm(helm, "template", "btj", str(CHART), "--set", "uninstallHook.timeoutSeconds=0")
    assert result.returncode != 0 and "timeoutSeconds" in result.stderr

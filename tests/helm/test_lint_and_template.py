"""`helm lint --strict` and `helm template` with the real helm binary, for the defaults and every ci/ file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helm import CHART, CI_VALUES, SERVED, VALUES_CASES, render, run_helm, values_id


def test_ci_folder_has_the_promised_cases() -> None:
    names = {p.name for p in CI_VALUES}
    assert {
        "default-values.yaml",
        "everything-on-values.yaml",
        "namespaced-values.yaml",
        "cluster-wide-values.yaml",
        "custom-image-values.yaml",
    } <= names


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_helm_lint_strict_passes(helm: str, values: Path | None) -> None:
    args = ["lint", str(CHART), "--strict"] + (["-f", str(values)] if values else [])
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", VALUES_CASES, ids=values_id)
def test_helm_template_renders_the_operator(helm: str, values: Path | None) -> None:
    kinds = {obj["kind"] for obj in render(helm, values)}
    assert {"Deployment", "Service", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"} <= kinds


def test_optional_objects_are_off_by_default(helm: str) -> None:
    kinds = [obj["kind"] for obj in render(helm)]
    assert "PodMonitor" not in kinds
    assert "ServiceMonitor" not in kinds
    assert kinds.count("ConfigMap") == 0


def test_everything_on_renders_every_optional_object(helm: str) -> None:
    objects = render(helm, CHART / "ci" / "everything-on-values.yaml")
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("ServiceMonitor", "btj-btj-operator") in names
    assert ("PodMonitor", "btj-btj-operator-trainers") in names
    assert ("ConfigMap", "btj-btj-operator-dashboard") in names
    assert ("ConfigMap", "btj-btj-operator-argocd-health") in names


def test_both_operator_monitors_at_once_fail_with_a_clear_message(helm: str) -> None:
    result = run_helm(
        helm,
        "template",
        "btj",
        str(CHART),
        "--set",
        SERVED,
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.enabled=true",
    )
    assert result.returncode != 0
    assert "enable one of them" in result.stderr


def test_notes_tell_the_next_steps(helm: str) -> None:
    result = run_helm(
        helm,
        "install",
        "btj",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "btj-system",
        "--set",
        SERVED,
        "--set",
        "argocd.healthCheck.enabled=true",
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    for step in ("kubectl apply -f examples/", "kubectl get btj", "dashboard.enabled=true", "argocd-cm"):
        assert step in notes


def test_chart_packages_with_its_crds_and_files(helm: str, tmp_path: Path) -> None:
    import tarfile

    result = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (archive,) = tmp_path.glob("btj-operator-0.1.0.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert "btj-operator/crds/training.blackwell.dev_blackwelltrainingjobs.yaml" in names
    assert "btj-operator/files/dashboards/btj-training.json" in names
    assert "btj-operator/files/btj-health.lua" in names
    assert "btj-operator/values.schema.json" in names
    assert not any(name.startswith("btj-operator/ci/") for name in names)

"""Files the chart must carry inside itself (helm reads nothing outside the chart) equal their sources."""

from __future__ import annotations

import yaml

from tests.support.helm import CHART, ROOT

HEALTH_KEY = "resource.customizations.health.training.blackwell.dev_BlackwellTrainingJob"


def test_chart_crds_equal_the_generated_crds() -> None:
    source = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert source, "crds/ is empty: commit the output of `btj crd`"
    chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert chart == source, "helm/btj-operator/crds/ must hold exactly the files of crds/ (cp crds/*.yaml)"
    for name in source:
        assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"helm/btj-operator/crds/{name} differs from crds/{name}: copy it again"
        )


def test_argocd_cm_snippet_carries_the_same_lua() -> None:
    snippet = yaml.safe_load((ROOT / "examples" / "argocd" / "argocd-cm-health.yaml").read_text())
    assert snippet["kind"] == "ConfigMap"
    assert snippet["metadata"]["name"] == "argocd-cm"
    lua = (CHART / "files" / "btj-health.lua").read_text()
    assert snippet["data"][HEALTH_KEY].strip() == lua.strip()


def test_rendered_health_configmap_carries_the_lua(helm: str) -> None:
    from tests.support.helm import render

    objects = render(helm, CHART / "ci" / "everything-on-values.yaml")
    health = next(o for o in objects if o["metadata"]["name"].endswith("-argocd-health"))
    assert health["data"][HEALTH_KEY].strip() == (CHART / "files" / "btj-health.lua").read_text().strip()


def test_rendered_dashboard_configmap_is_the_dashboard_file(helm: str) -> None:
    import json

    from tests.support.helm import render

    objects = render(helm, CHART / "ci" / "everything-on-values.yaml")
    dashboard = next(o for o in objects if o["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    shipped = json.loads(dashboard["data"]["btj-training.json"])
    assert shipped == json.loads((CHART / "files" / "dashboards" / "btj-training.json").read_text())

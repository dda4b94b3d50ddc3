"""The examples are valid: each BTJ against the CRD's own schema and the operator's models, each
built-in object against Kubernetes 1.33, and each says what the planner chooses for it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.helm import KUBE_VERSION, ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CRD_PATH = ROOT / "crds" / "training.blackwell.dev_blackwelltrainingjobs.yaml"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    return dict(version["schema"]["openAPIV3Schema"])


def test_the_promised_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert len(names) >= 7
    backends = {documents(p)[0]["spec"].get("backend", "PyTorchJob") for p in EXAMPLES}
    assert backends == {"PyTorchJob", "HyperPodPyTorchJob", "TrainJob"}
    instance_types = {documents(p)[0]["spec"]["cluster"]["instanceType"] for p in EXAMPLES}
    assert {"ml.p6-b200.48xlarge", "ml.p5en.48xlarge"} <= instance_types
    specs = [documents(p)[0]["spec"] for p in EXAMPLES]
    assert any(s.get("dryRun") for s in specs)
    assert any(s.get("autoResume") and s["cluster"]["nodes"] == 8 for s in specs)
    assert any("architecture" in s["model"] for s in specs)
    assert any(
        s.get("queueName") == "hyperpod-ns-team-a-localqueue"
        and s.get("priorityClass") == "training-priority"
        for s in specs
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_against_the_crd_schema(path: Path) -> None:
    schema = crd_schema()
    (job,) = documents(path)
    assert job["kind"] == "BlackwellTrainingJob"
    # The structural schema is OpenAPI v3.0, whose keywords are JSON Schema Draft 4's (a boolean
    # exclusiveMinimum beside minimum); its x-kubernetes-* and nullable keys are extensions the
    # validator ignores, the rest (types, enums, bounds, required, unknown fields) applies.
    jsonschema.Draft4Validator(schema).validate(job)
    # ...and the CLI's and operator's own admission check (the CRD's CEL rules too) admits it.
    from blackwell_operator.admission import admission_errors

    assert admission_errors(job) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads_through_the_operator_models(path: Path) -> None:
    from blackwell_operator.cli.manifest import load_manifest

    job = load_manifest(path)
    assert job.metadata.namespace, "examples name their namespace"
    assert len(job.metadata.name) <= 63


def _refresh_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "refresh_examples", ROOT / "scripts" / "refresh_examples.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PLANNED = [p for p in EXAMPLES if p.suffix == ".yaml" and "kind: BlackwellTrainingJob" in p.read_text()]


@pytest.mark.parametrize("path", PLANNED, ids=lambda p: p.name)
def test_example_says_what_the_planner_chooses_now(path: Path) -> None:
    header = path.read_text().split("apiVersion:", 1)[0]
    assert "# PLANNER:" in header
    script = _refresh_script()
    assert path.read_text() == script.refreshed(path), (
        f"{path.name}: its # PLANNER: comment is not what the planner says now; "
        "run `python scripts/refresh_examples.py` and review the change"
    )


def test_argocd_examples_are_valid_objects() -> None:
    (config_map,) = documents(ROOT / "examples" / "argocd" / "argocd-cm-health.yaml")
    kubernetes_validate.validate(config_map, KUBE_VERSION, strict=True)
    (application,) = documents(ROOT / "examples" / "argocd" / "application.yaml")
    assert application["apiVersion"] == "argoproj.io/v1alpha1" and application["kind"] == "Application"
    assert "SkipDryRunOnMissingResource=true" in application["spec"]["syncPolicy"]["syncOptions"]
    assert application["spec"]["source"]["directory"]["recurse"] is True

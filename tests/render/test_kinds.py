"""The child-kinds table against what the renderer emits and what the upstream CRDs declare."""

from __future__ import annotations

from pathlib import Path

import pytest

from blackwell_operator.models import BlackwellTrainingJobSpec
from blackwell_operator.models.spec import Backend
from blackwell_operator.render import render_children
from blackwell_operator.render.kinds import (
    CONFIG_MAP,
    JOB_KINDS,
    SUPPORTING_KINDS,
    TRAINING_RUNTIME,
    ChildKind,
    job_kind,
)
from tests.support.k8s_schema import PYTORCHJOB_CRDS, SCHEMA_MISSING, SHARED_SCHEMAS, load_crd
from tests.support.plans import plan_for

# The CRD each row is checked against. HyperPod publishes no HyperPodPyTorchJob CRD
# (docs/reference/crd-schemas.md), so that row is checked against the renderer only.
UPSTREAM_CRDS: dict[ChildKind, Path] = {
    JOB_KINDS[Backend.PYTORCH_JOB]: PYTORCHJOB_CRDS["kubeflow-release-1.9"],
    JOB_KINDS[Backend.TRAIN_JOB]: SHARED_SCHEMAS
    / "kubeflow-trainer-v2.3.0.trainer.kubeflow.org_trainjobs.yaml",
    TRAINING_RUNTIME: SHARED_SCHEMAS / "kubeflow-trainer-v2.3.0.trainer.kubeflow.org_trainingruntimes.yaml",
}


def test_every_concrete_backend_has_one_row() -> None:
    assert set(JOB_KINDS) == set(Backend) - {Backend.AUTO}
    assert len({row.kind for row in JOB_KINDS.values()}) == len(JOB_KINDS)
    assert len({row.resource for row in JOB_KINDS.values()}) == len(JOB_KINDS)


@pytest.mark.parametrize("backend", sorted(JOB_KINDS))
def test_the_renderer_emits_the_rows_kinds(backend: Backend) -> None:
    spec = BlackwellTrainingJobSpec.model_validate({"model": {"preset": "llama3.1-8b"}, "backend": backend})
    *supporting, job = render_children("btj", "ns", spec, plan_for(spec))
    assert (job["kind"], job["apiVersion"]) == (JOB_KINDS[backend].kind, JOB_KINDS[backend].api_version)
    assert job_kind(job["kind"]) == JOB_KINDS[backend]
    for obj in supporting:
        row = SUPPORTING_KINDS[obj["kind"]]
        assert obj["apiVersion"] == row.api_version


def test_rows_split_their_api_version() -> None:
    row = JOB_KINDS[Backend.TRAIN_JOB]
    assert (row.group, row.version, row.singular) == ("trainer.kubeflow.org", "v1alpha1", "trainjob")
    assert (CONFIG_MAP.group, CONFIG_MAP.version, CONFIG_MAP.resource) == ("", "v1", "v1/configmaps")
    assert job_kind("ConfigMap") is None and job_kind(None) is None


@pytest.mark.parametrize("row", list(UPSTREAM_CRDS), ids=lambda row: row.kind)
def test_rows_match_the_upstream_crds(row: ChildKind) -> None:
    path = UPSTREAM_CRDS[row]
    if not path.is_file():
        pytest.skip(f"{path} {SCHEMA_MISSING}")
    crd = load_crd(path)
    names = crd["spec"]["names"]
    served = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
    assert (crd["spec"]["group"], names["kind"], names["plural"]) == (row.group, row.kind, row.plural)
    assert names.get("singular", row.singular) == row.singular
    assert row.version in served

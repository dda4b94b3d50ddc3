"""Property: the CLI's verdict on a manifest equals the shipped CRD's (its schema and CEL rules).

The reference is tests/support/k8s_schema.py, a separate evaluation of the committed crds/ file (Draft 4
JSON Schema plus cel-python), not the product's admission package; only the null pruning and defaulting
before it are the product's (admission/openapi.py). Manifests are the embedded example
with a few fields set to values drawn from each field's valid range and from every YAML type.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from blackwell_operator.admission import load_documents
from blackwell_operator.admission.job import Rejected, validate_manifest
from blackwell_operator.cli.manifest import read_manifest_text
from blackwell_operator.render.yamlio import dump_yaml
from tests.support.k8s_schema import ROOT, admit, as_kubectl_sends, btj_schema_and_validator, load_crd

CRD = load_crd(ROOT / "crds" / "training.blackwell.dev_blackwelltrainingjobs.yaml")
SCHEMA, VALIDATOR = btj_schema_and_validator(CRD)
BASE = yaml.safe_load(read_manifest_text(None)[0])

# Any YAML scalar or small collection, within int64 (the reference does not model int64 decoding).
ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.sampled_from([0, 1, 2, 8, 64, 1024, 1025, -1])
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=8)
    | st.sampled_from(["auto", "2", "true", "false", "", "bf16", "mxfp8", "Exists", "Equal"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=6), inner, max_size=2),
    max_leaves=4,
)
NAME = st.from_regex(r"[a-z][-a-z0-9]{0,60}", fullmatch=True) | st.text(max_size=12) | st.just("a.b")
LABELISH = st.from_regex(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,70}", fullmatch=True) | st.text(max_size=10)
TOLERATION = st.fixed_dictionaries(
    {},
    optional={
        "key": st.sampled_from(["", "dedicated", "nvidia.com/gpu"]),
        "operator": st.sampled_from(["Exists", "Equal", "In"]),
        "value": st.sampled_from(["", "ml", "x" * 64]),
        "effect": st.sampled_from(["NoSchedule", "NoExecute", "Never"]),
        "tolerationSeconds": st.integers(-5, 5),
    },
)
ENV = st.fixed_dictionaries(
    {"name": st.sampled_from(["A", "B", "", "NCCL_DEBUG"])}, optional={"value": st.sampled_from(["", "1", 3])}
)
VOLUME = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["fsx", "data", "plan", "Bad_Name"]),
        "claimName": st.sampled_from(["fsx-claim", "c"]),
        "mountPath": st.sampled_from(["/fsx", "/data", "/fsx/sub", "relative", "/etc/btj", "/local/x"]),
    },
    optional={"readOnly": st.booleans()},
)

# spec paths and what to draw for each: a field's own values and anything at all.
FIELDS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("cluster", "nodes"): st.integers(-1, 1100) | ANY,
    ("cluster", "gpusPerNode"): st.integers(0, 17) | ANY,
    ("cluster", "instanceType"): st.sampled_from(["ml.p5.48xlarge", "ml.p6-b200.48xlarge", "m5"]) | ANY,
    ("training", "sequenceLength"): st.integers(0, 2_000_000) | ANY,
    ("training", "steps"): st.integers(-1, 10) | ANY,
    ("training", "dataset"): st.fixed_dictionaries(
        {"kind": st.sampled_from(["synthetic", "shards", "s3"])},
        optional={"uri": st.sampled_from(["", "s3://b/p/", "/fsx/tokens", "/tmp/x"])},
    )
    | ANY,
    ("training", "checkpoint", "path"): st.sampled_from(["/fsx/ckpt", "/local/ckpt", "/tmp", "", "/fsx/../x"])
    | ANY,
    ("tuning", "precision"): st.sampled_from(["auto", "bf16", "fp8", "mxfp8", "fp16"]) | ANY,
    ("tuning", "microBatchSize"): st.integers(-1, 1100) | ANY,
    ("tuning", "contextParallel"): st.integers(0, 70) | ANY,
    ("tuning", "memoryHeadroom"): st.floats(-0.5, 1.5, allow_nan=False) | ANY,
    ("tuning", "compile"): ANY,
    ("image",): st.sampled_from(["img:1", ""]) | ANY,
    ("backend",): st.sampled_from(["PyTorchJob", "HyperPodPyTorchJob", "Job"]) | ANY,
    ("queueName",): LABELISH | ANY,
    ("priorityClass",): LABELISH | ANY,
    ("autoResume",): ANY,
    ("maxRetries",): st.integers(-1, 101) | ANY,
    ("ttlSecondsAfterFinished",): st.integers(-1, 10**6) | ANY,
    ("dryRun",): ANY,
    ("tolerations",): st.lists(TOLERATION, max_size=3) | ANY,
    ("env",): st.lists(ENV, max_size=3) | ANY,
    ("volumes",): st.lists(VOLUME, max_size=2) | ANY,
    ("model",): st.sampled_from([{"preset": "llama3.2-1b"}, {}, {"preset": "gpt-7"}]) | ANY,
}


def _set(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        child = obj.get(key)
        if not isinstance(child, dict):
            child = obj[key] = {}
        obj = child
    obj[path[-1]] = value


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    manifest = copy.deepcopy(BASE)
    manifest["metadata"]["name"] = draw(st.just(BASE["metadata"]["name"]) | NAME)
    paths = draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=3, unique=True))
    for path in paths:
        _set(manifest["spec"], path, draw(FIELDS[path]))
    return manifest


def cli_admits(manifest: dict[str, Any]) -> bool:
    """What `btj plan`/`btj render` decide on the manifest written as YAML (before planning)."""
    # Written as `btj render` writes YAML: PyYAML's safe_dump leaves `y` unquoted, which kubectl (and
    # btj, reading as kubectl does) reads as true.
    (document,) = load_documents(dump_yaml(manifest), "job.yaml")
    try:
        validate_manifest(document)
    except Rejected:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
# Found by CI's draw (2026-12-06): kubectl sends an integral float as an integer, and so does btj.
@example(
    {**BASE, "spec": {**BASE["spec"], "maxRetries": 0.0}},
)
def test_the_cli_admits_exactly_what_the_crd_admits(manifest: dict[str, Any]) -> None:
    reference = admit(SCHEMA, VALIDATOR, as_kubectl_sends(manifest))
    assert cli_admits(manifest) == (reference == []), reference or "the CRD admits it"


@pytest.mark.parametrize("case", ["nodes-true", "nodes-string", "queue-space"])
def test_known_disagreements_of_the_past_now_agree(case: str) -> None:
    manifest = copy.deepcopy(BASE)
    value = {"nodes-true": True, "nodes-string": "2", "queue-space": "team a"}[case]
    _set(manifest["spec"], ("queueName",) if case == "queue-space" else ("cluster", "nodes"), value)
    assert admit(SCHEMA, VALIDATOR, manifest) != [] and not cli_admits(manifest)

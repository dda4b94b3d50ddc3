"""The committed CRD equals the generator's output, is structural, and describes every field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from blackwell_operator.render.crd import crd_yaml, generate_crd
from tests.support.k8s_schema import ROOT, cel_rules, crd_open_api_schema

CRD_FILE = ROOT / "crds" / "training.blackwell.dev_blackwelltrainingjobs.yaml"
FORBIDDEN_KEYS = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const", "definitions"}


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its dotted path."""
    yield path or "<root>", schema
    for name, child in schema.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}.*")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return crd_open_api_schema(generate_crd(), "v1alpha1")


def test_committed_crd_matches_the_generator() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ is stale: run `btj crd > " + str(CRD_FILE.name) + "`"


def test_generation_is_deterministic() -> None:
    assert crd_yaml() == crd_yaml()


def test_names_scope_and_subresources() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "blackwelltrainingjobs.training.blackwell.dev"
    assert spec["group"] == "training.blackwell.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "BlackwellTrainingJob"
    assert spec["names"]["plural"] == "blackwelltrainingjobs"
    assert spec["names"]["shortNames"] == ["btj"]
    assert spec["names"]["categories"] == ["ml"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    (version,) = generate_crd()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    default = [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c]
    assert default == ["Phase", "Model", "Instance", "Nodes", "Precision", "MBS", "AC", "Age"]
    assert columns["Tok/s/GPU"]["priority"] == 1
    assert columns["Child"]["priority"] == 1
    assert {name: columns[name]["jsonPath"] for name in ("Step", "Progress", "Left")} == {
        "Step": ".status.progress.step",
        "Progress": ".status.progress.percent",
        "Left": ".status.progress.remaining",
    }
    assert all(columns[name]["priority"] == 1 for name in ("Step", "Progress", "Left"))
    assert columns["Age"]["type"] == "date"
    schema = crd_open_api_schema(generate_crd(), "v1alpha1")
    for column in version["additionalPrinterColumns"]:
        parts = column["jsonPath"].lstrip(".").split(".")
        if parts[0] == "metadata":
            continue
        node = schema
        for part in parts:  # every column points at a declared field
            node = node["properties"][part]
        assert node.get("type") == column["type"] or column["type"] == "number", column


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    problems = []
    for path, node in nodes(schema):
        if FORBIDDEN_KEYS & node.keys():
            problems.append(f"{path}: has {sorted(FORBIDDEN_KEYS & node.keys())}")
        typed = (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        )
        if not typed:
            problems.append(f"{path}: no type")
        if node.get("x-kubernetes-int-or-string") and "type" in node:
            problems.append(f"{path}: int-or-string must not set type")
        if node.get("additionalProperties") is False:
            problems.append(f"{path}: additionalProperties: false is not structural")
        if "properties" in node and isinstance(node.get("additionalProperties"), dict):
            problems.append(f"{path}: properties and additionalProperties are exclusive")
        if "nullable" in node and "default" in node and node["default"] is None:
            problems.append(f"{path}: null default")
    assert not problems, problems


def test_every_property_has_a_description(schema: dict[str, Any]) -> None:
    missing = [path for path, node in nodes(schema) if path != "<root>" and not node.get("description")]
    # Array items and map values are not properties: `kubectl explain` shows their parent's text.
    missing = [path for path in missing if not path.endswith((".*", "[]"))]
    assert not missing, missing


def test_defaults_make_the_spec_complete(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    assert spec["cluster"]["default"] == {}
    assert spec["cluster"]["properties"]["instanceType"]["default"] == "ml.p6-b200.48xlarge"
    assert spec["tuning"]["properties"]["precision"]["default"] == "auto"
    assert spec["training"]["properties"]["dataset"]["default"] == {}
    assert "default" not in spec["model"], "model is required: no default"


def test_auto_or_integer_fields_are_int_or_string(schema: dict[str, Any]) -> None:
    mbs = schema["properties"]["spec"]["properties"]["tuning"]["properties"]["microBatchSize"]
    assert mbs["x-kubernetes-int-or-string"] is True
    assert mbs["pattern"] == "^(auto)$"
    assert (mbs["minimum"], mbs["maximum"]) == (1, 1024)
    assert mbs["x-kubernetes-validations"][0]["message"].startswith("must be 'auto'")


def test_status_keeps_its_schema_and_the_plan_is_never_pruned(schema: dict[str, Any]) -> None:
    status = schema["properties"]["status"]
    assert {"phase", "conditions", "plan", "child", "observedGeneration"} <= status["properties"].keys()
    assert status.get("x-kubernetes-preserve-unknown-fields") is None, "kopf#574: keep status structural"
    plan = status["properties"]["plan"]
    assert plan["x-kubernetes-preserve-unknown-fields"] is True
    assert "chosen" in plan["properties"]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert set(conditions["items"]["required"]) >= {"type", "status", "reason", "lastTransitionTime"}


def test_cel_rules_compile(schema: dict[str, Any]) -> None:
    import celpy

    environment = celpy.Environment()
    rules = cel_rules(schema)
    assert len(rules) >= 10
    for rule in rules:
        environment.compile(rule)


def test_crd_fits_client_side_apply() -> None:
    # kubectl apply (client-side) stores the object in a 256 KiB annotation.
    assert len(CRD_FILE.read_bytes()) < 200_000


@pytest.mark.parametrize("kubernetes_version", ["1.29.0", "1.33.0"])
def test_crd_is_a_valid_apiextensions_object(kubernetes_version: str) -> None:
    # Strict built-in schema of CustomResourceDefinition: unknown JSONSchemaProps keys (const, $defs, ...)
    # and wrong types fail here. 1.29 is the first release with CEL validation rules GA.
    import kubernetes_validate

    crd = yaml.safe_load(CRD_FILE.read_text())
    kubernetes_validate.validate(crd, kubernetes_version, strict=True)


def test_list_map_keys_are_required_or_defaulted(schema: dict[str, Any]) -> None:
    for path, node in nodes(schema):
        if node.get("x-kubernetes-list-type") != "map":
            continue
        items = node["items"]
        for key in node["x-kubernetes-list-map-keys"]:
            assert key in items.get("required", []) or "default" in items["properties"][key], (path, key)


def test_every_default_validates_against_its_own_schema(schema: dict[str, Any]) -> None:
    import jsonschema

    from blackwell_operator.admission.openapi import apply_defaults
    from tests.support.k8s_schema import to_json_schema

    checked = 0
    for _path, node in nodes(schema):
        if "default" in node:
            value = apply_defaults(node, yaml.safe_load(yaml.safe_dump(node["default"])))
            jsonschema.Draft4Validator(to_json_schema(node)).validate(value)
            checked += 1
    assert checked > 20

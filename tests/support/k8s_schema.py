"""What the API server does with a CRD schema, offline: defaulting, null pruning, strict JSON Schema, CEL.

The conversion to JSON Schema follows docs/reference/k8s-test-harness.md §6; CEL rules run with
cel-python. Only the parts our CRD and the PyTorchJob CRDs use are emulated.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

# Null pruning and structural defaulting are the product's own (one home: what the API server does before it
# validates); the checks after them, Draft 4 JSON Schema and cel-python, are this module's, apart from the
# product's admission package.
from blackwell_operator.admission.openapi import apply_defaults, prune_nulls

Schema = dict[str, Any]

# The Kubernetes release whose built-in schemas (Pod, ConfigMap) the rendered objects are checked against.
KUBERNETES_VERSION = "1.33.0"


def kubernetes_errors(obj: dict[str, Any]) -> str | None:
    """The first strict-validation error of a built-in Kubernetes object, or None when it is valid."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return str(exc).splitlines()[0]
    return None


ROOT = Path(__file__).resolve().parents[2]
# The upstream CRDs are not vendored (docs/reference/crd-schemas.md): BTJ_CRD_SCHEMAS names their folder;
# by default the one CI provides beside the repository's folder, else the one scripts/fetch_crd_schemas.py
# fills from a fresh clone.
_BESIDE = ROOT.parent / "shared" / "schemas"
SHARED_SCHEMAS = Path(
    os.environ.get("BTJ_CRD_SCHEMAS") or (_BESIDE if _BESIDE.is_dir() else ROOT / ".tools" / "crd-schemas")
)
# What a skipped schema check says: the one command that makes it run.
SCHEMA_MISSING = (
    "is absent: run python3 scripts/fetch_crd_schemas.py "
    "(or set BTJ_CRD_SCHEMAS; docs/reference/crd-schemas.md)"
)
PYTORCHJOB_CRDS = {
    "kubeflow-release-1.9": SHARED_SCHEMAS / "kubeflow.org_pytorchjobs.yaml",
    "hyperpod-training-operator-v1.7": SHARED_SCHEMAS
    / "hyperpod-training-operator-v1.7.pytorchjobs.kubeflow.org.yaml",
}


def crd_open_api_schema(crd: dict[str, Any], version: str) -> Schema:
    """The openAPIV3Schema of one served version of a CRD."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema: Schema = entry["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(version)


def load_crd(path: Path) -> dict[str, Any]:
    """The (first) CustomResourceDefinition in a YAML file."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the PyTorchJob CRDs are 600 KB
    for document in yaml.load_all(path.read_text(), Loader=loader):
        if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition":
            return document
    raise ValueError(f"{path}: no CustomResourceDefinition")


def to_json_schema(node: Any, *, strict: bool = True) -> Any:
    """OpenAPI v3 (Kubernetes flavour) to Draft 4 JSON Schema; strict rejects unknown fields."""
    if isinstance(node, list):
        return [to_json_schema(item, strict=strict) for item in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(child, strict=strict) for name, child in value.items()}
        elif (key in ("items", "additionalProperties", "not") and isinstance(value, dict)) or key in (
            "allOf",
            "anyOf",
            "oneOf",
        ):
            out[key] = to_json_schema(value, strict=strict)
        elif key in ("default", "example", "enum"):
            out[key] = copy.deepcopy(value)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string") and "type" not in node:
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if strict and "properties" in node and not preserve and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


def strict_validator(open_api: Schema, *, api_version: str, kind: str) -> jsonschema.Draft4Validator:
    """A validator for whole objects of a kind, apiVersion and kind pinned."""
    schema = to_json_schema(open_api)
    schema["properties"]["apiVersion"] = {"enum": [api_version]}
    schema["properties"]["kind"] = {"enum": [kind]}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind"})
    return jsonschema.Draft4Validator(schema)


def btj_schema_and_validator(crd: dict[str, Any]) -> tuple[Schema, jsonschema.Draft4Validator]:
    """A BlackwellTrainingJob CRD's v1alpha1 schema and a strict validator of whole BTJ objects."""
    schema = crd_open_api_schema(crd, "v1alpha1")
    return schema, strict_validator(
        schema, api_version="training.blackwell.dev/v1alpha1", kind="BlackwellTrainingJob"
    )


def schema_errors(validator: jsonschema.Draft4Validator, obj: Any) -> list[str]:
    """Every schema error as `path: message`."""
    return sorted(
        f"{'.'.join(str(part) for part in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(obj)
    )


def list_map_errors(schema: Schema, obj: Any, path: str = "") -> list[str]:
    """x-kubernetes-list-type: map keys must be unique (the API server rejects duplicates)."""
    errors: list[str] = []
    if isinstance(obj, list):
        keys = schema.get("x-kubernetes-list-map-keys")
        if schema.get("x-kubernetes-list-type") == "map" and keys:
            seen = [tuple(item.get(key) for key in keys) for item in obj if isinstance(item, dict)]
            errors += [f"{path}: duplicate entry {key}" for key in sorted(set(seen)) if seen.count(key) > 1]
        for index, item in enumerate(obj):
            errors += list_map_errors(schema.get("items", {}), item, f"{path}[{index}]")
    elif isinstance(obj, dict):
        for name, child in schema.get("properties", {}).items():
            if name in obj:
                errors += list_map_errors(child, obj[name], f"{path}.{name}" if path else name)
    return errors


_CEL = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _CEL.program(_CEL.compile(rule))
    return _PROGRAMS[rule]


def cel_rules(schema: Any) -> list[str]:
    """Every x-kubernetes-validations rule in a schema."""
    found: list[str] = []
    if isinstance(schema, dict):
        found += [entry["rule"] for entry in schema.get("x-kubernetes-validations", [])]
        for value in schema.values():
            found += cel_rules(value)
    elif isinstance(schema, list):
        for value in schema:
            found += cel_rules(value)
    return found


def cel_errors(schema: Schema, new: Any, old: Any = None, path: str = "") -> list[str]:
    """Evaluate the CEL rules as the API server does; rules with oldSelf only when an old value exists."""
    errors: list[str] = []
    for entry in schema.get("x-kubernetes-validations", []):
        rule = entry["rule"]
        transition = "oldSelf" in rule
        if transition and old is None:
            continue
        activation = {"self": json_to_cel(new)}
        if transition:
            activation["oldSelf"] = json_to_cel(old)
        try:
            ok = bool(_program(rule).evaluate(activation))
        except CELEvalError as exc:  # a runtime error rejects the object too
            ok = False
            entry = {**entry, "message": f"{entry['message']} (evaluation error {exc})"}
        if not ok:
            errors.append(f"{path or '<root>'}: {entry['message']}")
    if isinstance(new, dict):
        for name, child in schema.get("properties", {}).items():
            if name in new:
                child_old = old.get(name) if isinstance(old, dict) else None
                errors += cel_errors(child, new[name], child_old, f"{path}.{name}" if path else name)
    elif isinstance(new, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(new):
            errors += cel_errors(schema["items"], item, None, f"{path}[{index}]")
    return errors


def as_kubectl_sends(obj: Any) -> Any:
    """`obj` as kubectl sends a YAML manifest: sigs.k8s.io/yaml decodes it and writes JSON with Go's
    encoding/json, which prints an integral float64 below 1e21 without a fraction (`0.0` becomes `0`), and
    the API server decodes a number without fraction or exponent as int64 (k8s.io/apimachinery util/json).
    So `maxRetries: 0.0` arrives as the integer 0; `0.5`, and integral floats beyond int64, stay floats."""
    if isinstance(obj, dict):
        return {k: as_kubectl_sends(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [as_kubectl_sends(v) for v in obj]
    if isinstance(obj, float) and obj.is_integer() and abs(obj) < 2**63:
        return int(obj)
    return obj


def admit(open_api: Schema, validator: jsonschema.Draft4Validator, obj: Any, old: Any = None) -> list[str]:
    """All the reasons the API server would reject `obj` (an update of `old` when given)."""
    new = apply_defaults(open_api, prune_nulls(copy.deepcopy(obj)))
    previous = apply_defaults(open_api, prune_nulls(copy.deepcopy(old))) if old is not None else None
    errors = schema_errors(validator, new) + list_map_errors(open_api, new)
    if errors:  # CEL runs only on schema-valid objects
        return errors
    return cel_errors(open_api, new, previous)

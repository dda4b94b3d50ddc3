"""values.yaml is documented key by key and validated by the hand-written values.schema.json, which helm
enforces: a bad values file fails `helm lint` and `helm template`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.helm import CHART, CI_VALUES, run_helm

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
BAD_VALUES = Path(__file__).parent / "fixtures" / "bad-values.yaml"
# Kubernetes types passed through whole: the schema pins the restricted-PSS fields and leaves the
# rest of the Kubernetes type open (a closed copy of the API type would reject valid new fields).
KUBERNETES_TYPES = {
    "podSecurityContext",
    "podSecurityContext.seccompProfile",
    "securityContext",
    "securityContext.capabilities",
    "securityContext.seccompProfile",
}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def walk_schema(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path or "<root>", node)]
    for key, child in node.get("properties", {}).items():
        found += walk_schema(child, f"{path}.{key}" if path else key)
    if isinstance(node.get("items"), dict):
        found += walk_schema(node["items"], f"{path}[]")
    return found


def test_values_yaml_names_its_schema() -> None:
    first = (CHART / "values.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=values.schema.json"


def test_defaults_validate_against_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(VALUES, SCHEMA)


@pytest.mark.parametrize("path", CI_VALUES, ids=lambda p: p.name)
def test_ci_values_validate_against_the_schema(path: Path) -> None:
    jsonschema.validate(deep_merge(VALUES, yaml.safe_load(path.read_text())), SCHEMA)


def test_schema_is_curated() -> None:
    for path, node in walk_schema(SCHEMA):
        if path.endswith("[]") and "properties" not in node:
            continue
        assert node.get("description"), f"{path}: no description"
        if node.get("type") == "object" and "properties" in node and path not in KUBERNETES_TYPES:
            assert node.get("additionalProperties") is False, f"{path}: additionalProperties must be false"


def test_every_value_key_is_in_the_schema_and_documented() -> None:
    text = (CHART / "values.yaml").read_text().splitlines()

    def keys(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> None:
        for key, value in values.items():
            assert key in schema.get("properties", {}), f"{prefix}{key} is not in values.schema.json"
            child = schema["properties"][key]
            if isinstance(value, dict) and "properties" in child:
                keys(value, child, f"{prefix}{key}.")

    keys(VALUES, SCHEMA)
    # helm-docs: every leaf key (and every key whose value is a map of free settings) has a `# --`
    # comment block right above it, or sits in a block whose parent carries one.
    for number, line in enumerate(text):
        match = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9]*):( .*)?$", line)
        if not match or (match.group(3) is None and _has_child_keys(text, number)):
            continue
        above = number - 1
        while above >= 0 and text[above].lstrip().startswith("#") and "# --" not in text[above]:
            above -= 1
        documented = above >= 0 and "# --" in text[above]
        parent_documented = _parent_has_doc(text, number)
        assert documented or parent_documented, (
            f"values.yaml line {number + 1}: {line.strip()} has no # -- comment"
        )


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _has_child_keys(text: list[str], number: int) -> bool:
    following = [t for t in text[number + 1 :] if t.strip() and not t.lstrip().startswith("#")]
    return bool(following) and _indent(following[0]) > _indent(text[number])


def _parent_has_doc(text: list[str], number: int) -> bool:
    """True inside a documented free-form block (e.g. resources:, securityContext:), at any depth."""
    indent = _indent(text[number])
    for above in range(number - 1, -1, -1):
        line = text[above]
        if line.strip() and not line.lstrip().startswith("#") and _indent(line) < indent:
            if above > 0 and "# --" in text[above - 1]:
                return True
            indent = _indent(line)
            if indent == 0:
                return False
    return False


@pytest.mark.parametrize("command", ["lint", "template"])
def test_bad_values_are_rejected_by_helm(helm: str, command: str) -> None:
    result = (
        run_helm(helm, command, "btj", str(CHART), "-f", str(BAD_VALUES))
        if command == "template"
        else (run_helm(helm, "lint", str(CHART), "-f", str(BAD_VALUES)))
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "schema" in output
    for problem in ("pullPolicy", "verbose", "replicas"):
        assert problem in output, f"{problem} not reported:\n{output}"


def test_chart_readme_lists_every_documented_value() -> None:
    readme = (CHART / "README.md").read_text()
    text = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []
    documented = False
    for line in text:
        stripped = line.strip()
        if stripped.startswith("# --"):
            documented = True
            continue
        match = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if documented:
            path = ".".join(key for _, key in stack)
            assert f"| `{path}` |" in readme, f"helm/btj-operator/README.md lacks the value {path}"
            documented = False


@pytest.mark.parametrize(
    "override",
    [
        "securityContext.allowPrivilegeEscalation=true",
        "securityContext.readOnlyRootFilesystem=false",
        "podSecurityContext.runAsNonRoot=false",
        "securityContext.capabilities.add={NET_ADMIN}",
    ],
)
def test_the_schema_keeps_pod_security_restricted(helm: str, override: str) -> None:
    result = run_helm(helm, "template", "btj", str(CHART), "--set", override)
    assert result.returncode != 0, f"{override} was accepted"
    assert "schema" in result.stderr

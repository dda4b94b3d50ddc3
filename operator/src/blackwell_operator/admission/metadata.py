"""ObjectMeta as the API server validates it: name, namespace, labels and annotations (apimachinery rules)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from blackwell_operator.admission.openapi import did_you_mean
from blackwell_operator.units import KIB

# k8s.io/apimachinery/pkg/util/validation: DNS-1123 label and subdomain, qualified names, label values.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# apimachinery's TotalAnnotationSizeLimitB: keys and values together.
_ANNOTATIONS_LIMIT = 256 * KIB

# ObjectMeta's fields (meta/v1); strict field validation rejects any other.
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "generateName": str,
    "namespace": str,
    "selfLink": str,
    "uid": str,
    "resourceVersion": str,
    "generation": int,
    "creationTimestamp": str,
    "deletionTimestamp": str,
    "deletionGracePeriodSeconds": int,
    "labels": dict,
    "annotations": dict,
    "ownerReferences": list,
    "finalizers": list,
    "managedFields": list,
}


def _qualified_name_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return "its prefix must be a DNS subdomain (lowercase, at most 253 characters)"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        return "the name part must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    return None


def _string_map(field: str, value: Mapping[Any, Any], *, labels: bool) -> Iterator[str]:
    for key, item in value.items():
        if not isinstance(key, str):
            yield f"metadata.{field}: key {key!r} must be a string"
            continue
        problem = _qualified_name_problem(key)
        if problem:
            yield f"metadata.{field}: key {key!r} is not a valid name: {problem}"
        if not isinstance(item, str):
            yield (f'metadata.{field}.{key}: must be a string (got {item!r}); quote it, e.g. {key}: "{item}"')
        elif labels and (len(item) > 63 or not _LABEL_VALUE.fullmatch(item)):
            yield (
                f"metadata.labels.{key}: {item[:70]!r} is not a label value (at most 63 letters, digits, "
                "'-', '_' or '.', starting and ending alphanumeric)"
            )
    if not labels:
        total = sum(len(str(k)) + len(str(v)) for k, v in value.items())
        if total > _ANNOTATIONS_LIMIT:
            yield f"metadata.annotations: {total} bytes in all, over the API server's {_ANNOTATIONS_LIMIT}"


def metadata_errors(metadata: Any) -> Iterator[str]:
    """Why the API server would refuse this metadata (before the CRD's own rules run)."""
    if not isinstance(metadata, dict):
        yield "metadata: required, a mapping with at least a name, e.g. metadata: {name: my-job}"
        return
    for key, value in metadata.items():
        expected = _FIELDS.get(key)
        if expected is None:
            yield f"metadata.{key}: unknown field{did_you_mean(key, _FIELDS)}"
        elif not isinstance(value, expected) or isinstance(value, bool):
            yield f"metadata.{key}: wrong type (got {value!r})"
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if name is None:
        yield "metadata.name: required: the child PyTorchJob and ConfigMap take the BTJ's name"
    elif isinstance(name, str) and (len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name)):
        yield f"metadata.name: {name[:70]!r} is not a DNS-1123 subdomain (lowercase, digits, '-', '.')"
    if isinstance(namespace, str) and (len(namespace) > 63 or not _DNS1123_LABEL.fullmatch(namespace)):
        yield f"metadata.namespace: {namespace[:70]!r} is not a DNS-1123 label (lowercase, digits, '-')"
    for field in ("labels", "annotations"):
        value = metadata.get(field)
        if isinstance(value, dict):
            yield from _string_map(field, value, labels=field == "labels")

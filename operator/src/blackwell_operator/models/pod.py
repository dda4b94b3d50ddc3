"""What the spec says about the trainer pods' identity: service account, pull secrets, labels, annotations."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from blackwell_operator.applabels import OPERATOR_POD_LABELS
from blackwell_operator.units import KIB
from blackwell_trainer.plan.config import WireModel

DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_SUBDOMAIN = 253
# A label or annotation key is a qualified name: an optional DNS-1123 subdomain prefix (253 at most) and
# `/`, then a name of 63 at most: alphanumeric at both ends, `-`, `_` and `.` inside (the API server's
# validation.IsQualifiedName). Two patterns, so that the CRD's CEL rule (RE2: no lookahead) states the
# same rule: the structure, and the prefix's length. `[.]`, not a backslash: a CEL string has no such escape.
QUALIFIED_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
QUALIFIED_PREFIX_LENGTH = r"^[^/]{1,253}/"
MAX_KEY = MAX_SUBDOMAIN + 1 + 63
# A label value: empty, or 63 at most, alphanumeric at both ends, `-`, `_` and `.` inside.
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"

# The Pod validation rules of the API server for the fields the BTJ copies into pod templates, which a
# job's own API accepts and only the pods' creation refuses (docs/reference/pod-validation.md).
# An env name: printable ASCII but '=' (the relaxed rule of Kubernetes 1.32 and later).
ENV_NAME = "^[ -<>-~]+$"
# An image: no leading or trailing whitespace (checked on Pods, not on pod templates).
IMAGE = r"^[^\s](.*[^\s])?$"
TOLERATION_SECONDS_EFFECT = "NoExecute"

MAX_POD_LABELS = 64
MAX_PULL_SECRETS = 16
# The API server refuses an object whose annotations (keys plus values) exceed 256 KiB. These two bounds
# keep the user's share of the pod template below it whatever they write, with room for the operator's
# own two annotations, so a spec the CRD admits never becomes a child the API server refuses.
MAX_POD_ANNOTATIONS = 24
MAX_ANNOTATION_VALUE = 8192
TOTAL_ANNOTATION_LIMIT = 256 * KIB

# Keys the operator sets on every trainer pod itself: its job-name label selects the pods (the
# anti-affinity rule, the operator's pod watch) and the app.kubernetes.io ones mark them as the
# operator's; a user value would break that, so the spec may not set them.
RESERVED_PREFIX = "training.blackwell.dev/"  # the API group (models/spec.py); a test ties them
RESERVED_LABELS = OPERATOR_POD_LABELS
RESERVED_ANNOTATIONS = ("kubectl.kubernetes.io/default-container",)


def _error(code: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(code, message)


def key_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes label/annotation key (a qualified name), or None."""
    prefix_ok = "/" not in key or re.match(QUALIFIED_PREFIX_LENGTH, key) is not None
    if len(key) <= MAX_KEY and prefix_ok and re.fullmatch(QUALIFIED_KEY, key):
        return None
    return (
        f"key {key!r} is not a qualified name. Fix: an optional DNS prefix and '/', then up to 63 letters, "
        "digits, '-', '_' or '.' starting and ending with a letter or digit, e.g. team or example.com/team"
    )


def _check_keys(field: str, keys: list[str], reserved: tuple[str, ...], most: int) -> None:
    if len(keys) > most:
        raise _error(
            "pod_metadata_count",
            f"{len(keys)} keys in {field}; at most {most} are allowed. Fix: keep the ones the pods need",
        )
    for key in keys:
        problem = key_problem(key)
        if problem:
            raise _error("pod_metadata_key", f"{problem} (in {field})")
        if key.startswith(RESERVED_PREFIX) or key in reserved:
            raise _error(
                "pod_metadata_key",
                f"key {key!r} is one the operator sets on every trainer pod itself. Fix: choose another "
                f"key (not {', '.join(reserved)} nor {RESERVED_PREFIX}*)",
            )


def _pod_labels(labels: dict[str, str]) -> dict[str, str]:
    _check_keys("podLabels", list(labels), RESERVED_LABELS, MAX_POD_LABELS)
    for key, value in labels.items():
        if not re.fullmatch(LABEL_VALUE, value):
            raise _error(
                "pod_label_value",
                f"value {value!r} of label {key!r} is not a label value. Fix: up to 63 letters, digits, "
                "'-', '_' or '.' starting and ending with a letter or digit (or empty); put free text in "
                "podAnnotations",
            )
    return labels


def _pod_annotations(annotations: dict[str, str]) -> dict[str, str]:
    _check_keys("podAnnotations", list(annotations), RESERVED_ANNOTATIONS, MAX_POD_ANNOTATIONS)
    for key, value in annotations.items():
        if len(value) > MAX_ANNOTATION_VALUE:
            raise _error(
                "pod_annotation_value",
                f"annotation {key!r} has {len(value)} characters, more than {MAX_ANNOTATION_VALUE}. Fix: "
                "keep large data in a ConfigMap and name it in the annotation",
            )
    return annotations


def _subdomain(what: str, example: str) -> AfterValidator:
    def check(value: str) -> str:
        if len(value) > MAX_SUBDOMAIN or not re.fullmatch(DNS1123_SUBDOMAIN, value):
            raise _error(
                "object_name",
                f"{value!r} is not a {what} name. Fix: lowercase letters, digits, '-' and '.', at most "
                f"{MAX_SUBDOMAIN} characters, e.g. {example}",
            )
        return value

    return AfterValidator(check)


_NAME_SCHEMA: JsonDict = {"pattern": DNS1123_SUBDOMAIN, "maxLength": MAX_SUBDOMAIN}

ServiceAccountName = Annotated[
    str, _subdomain("ServiceAccount", "training-s3"), Field(json_schema_extra=_NAME_SCHEMA)
]
PodLabels = Annotated[
    dict[str, str],
    AfterValidator(_pod_labels),
    Field(
        json_schema_extra={
            "maxProperties": MAX_POD_LABELS,
            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
        }
    ),
]
PodAnnotations = Annotated[
    dict[str, str],
    AfterValidator(_pod_annotations),
    Field(
        json_schema_extra={
            "maxProperties": MAX_POD_ANNOTATIONS,
            "additionalProperties": {"type": "string", "maxLength": MAX_ANNOTATION_VALUE},
        }
    ),
]


class SecretReference(WireModel):
    """A Secret in the job's namespace, e.g. a docker-registry Secret for a private registry."""

    name: Annotated[str, _subdomain("Secret", "regcred")] = Field(
        description="Secret name (kubectl create secret docker-registry NAME ...).",
        json_schema_extra=_NAME_SCHEMA,
    )


def distinct_secrets(secrets: list[SecretReference]) -> list[SecretReference]:
    """Each pull secret once: the API server keys the list by name."""
    seen: set[str] = set()
    for index, secret in enumerate(secrets):
        if secret.name in seen:
            raise _error(
                "pull_secret_duplicate",
                f"imagePullSecrets[{index}].name {secret.name} is listed twice. Fix: list each Secret once",
            )
        seen.add(secret.name)
    return secrets

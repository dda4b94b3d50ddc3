"""One admission check for the CLI and the operator: a BTJ judged as the API server judges it with our CRD."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import jsonschema

from blackwell_operator.admission.cel import cel_errors, compile_rules
from blackwell_operator.admission.metadata import metadata_errors
from blackwell_operator.admission.openapi import (
    Schema,
    apply_defaults,
    build_validator,
    int64_errors,
    list_map_errors,
    prune_nulls,
    schema_errors,
)
from blackwell_operator.admission.yamlread import InputError, decode, load_documents
from blackwell_operator.models.spec import API_GROUP, API_VERSION, KIND
from blackwell_operator.shared_cache import shared_cache

__all__ = ["InputError", "admission_errors", "decode", "load_documents", "warm_up"]

API_VERSION_FULL = f"{API_GROUP}/{API_VERSION}"


@shared_cache
def _crd() -> tuple[Schema, jsonschema.Draft4Validator]:
    # The CRD generated in-process is byte-for-byte the shipped crds/ file (tests/render checks for drift).
    from blackwell_operator.render.crd import generate_crd

    versions = generate_crd()["spec"]["versions"]
    open_api: Schema = next(v for v in versions if v["name"] == API_VERSION)["schema"]["openAPIV3Schema"]
    return open_api, build_validator(open_api)


def warm_up() -> int:
    """Build the CRD's validator and compile its CEL rules now (once per process: a second or so of CPU that
    would otherwise fall on the first BTJ judged); how many rules."""
    open_api, _ = _crd()
    return compile_rules(open_api)


# Verdicts by the object's repr (which tells 1, "1" and True apart): the operator judges the same spec
# again on every event of a generation, and evaluating the CEL rules costs tens of milliseconds.
_VERDICTS: dict[tuple[bytes, bool], tuple[str, ...]] = {}
_VERDICTS_KEPT = 1024


def admission_errors(obj: Any, *, server_side: bool = False) -> list[str]:
    """Every reason the API server would refuse to create `obj` with the shipped CRD; [] when it admits it.

    server_side: `obj` was read back from the API server (the operator): its metadata carries server
    fields and its kind is known, so only what a user wrote is judged.
    """
    key = (hashlib.sha256(repr(obj).encode()).digest(), server_side)
    if key not in _VERDICTS:
        if len(_VERDICTS) >= _VERDICTS_KEPT:
            _VERDICTS.pop(next(iter(_VERDICTS)))  # the oldest first
        _VERDICTS[key] = tuple(_judge(obj, server_side))
    return list(_VERDICTS[key])


def _judge(obj: Any, server_side: bool) -> list[str]:
    if not isinstance(obj, dict):
        return [f"manifest: must be a mapping (got {type(obj).__name__})"]
    errors: list[str] = []
    if not server_side:
        if obj.get("apiVersion") != API_VERSION_FULL:
            errors.append(f"apiVersion: must be {API_VERSION_FULL} (got {obj.get('apiVersion')!r})")
        if obj.get("kind") != KIND:
            errors.append(f"kind: must be {KIND} (got {obj.get('kind')!r})")
    errors += metadata_errors(obj.get("metadata"))
    open_api, validator = _crd()
    # On create the API server drops status (a subresource), prunes nulls, then applies the defaults.
    new = {key: value for key, value in obj.items() if key != "status"}
    new = apply_defaults(open_api, prune_nulls(copy.deepcopy(new)))
    errors += int64_errors(new)
    errors += schema_errors(validator, {**new, "apiVersion": "", "kind": ""} if server_side else new)
    errors += list_map_errors(open_api, new)
    if errors:  # CEL rules run only on an object that passed the schema
        return list(dict.fromkeys(errors))
    return list(dict.fromkeys(cel_errors(open_api, new)))

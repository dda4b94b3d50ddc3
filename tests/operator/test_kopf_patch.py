"""Kopf's JSON patch of an empty patch is [] without copying the object (handlers/kopf_patch.py)."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest

from blackwell_operator.handlers import kopf_patch
from blackwell_operator.handlers.kopf_private import patches
from blackwell_operator.handlers.runtime import configure


def _body() -> dict[str, Any]:
    return {
        "metadata": {"name": "a", "resourceVersion": "3", "finalizers": ["x"]},
        "spec": {"n": 1},
        "status": {"plan": {"alternatives": [{"a": i} for i in range(20)]}},
    }


def _add_finalizer(body: Any) -> None:
    body["metadata"]["finalizers"].append("y")


def _patch(keys: dict[str, Any], fns: list[Any]) -> patches.Patch:
    patch = patches.Patch(fns=fns)
    patch.update(keys)
    return patch


@pytest.mark.parametrize(
    ("keys", "fns"),
    [
        ({}, []),
        ({"spec": {"n": 2}}, []),
        ({}, [_add_finalizer]),
        ({"status": {"plan": None}}, [_add_finalizer]),
    ],
)
def test_the_operations_are_kopfs_own(keys: dict[str, Any], fns: list[Any]) -> None:
    ours = kopf_patch.as_json_patch(_patch(keys, fns), _body())
    assert ours == kopf_patch._original(_patch(keys, fns), _body())


def test_an_empty_patch_copies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_: Any) -> Any:
        raise AssertionError("the object was copied")

    monkeypatch.setattr(patches.copy, "deepcopy", refuse)
    assert kopf_patch.as_json_patch(_patch({}, []), _body()) == []
    monkeypatch.setattr(patches.copy, "deepcopy", copy.deepcopy)


def test_it_is_installed_by_the_operators_settings() -> None:
    configure(kopf.OperatorSettings())
    assert patches.Patch.as_json_patch is kopf_patch.as_json_patch

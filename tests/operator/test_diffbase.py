"""The diff base Kopf stores and compares is the essence Kopf's own storage builds (handlers/diffbase.py only
skips copying the status that Kopf would delete)."""

from __future__ import annotations

import json
from typing import Any, cast

import kopf
import pytest

from blackwell_operator.handlers.diffbase import StatuslessDiffBaseStorage

PREFIX, KEY = "training.blackwell.dev", "last-handled-configuration"


def _btj() -> dict[str, Any]:
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "labels": {"team": "a"},
            "annotations": {
                "training.blackwell.dev/last-handled-configuration": json.dumps({"spec": {"x": 1}}),
                "training.blackwell.dev/reconcile": "{}",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "note": "kept",
            },
        },
        "spec": {"model": {"preset": "llama3.1-8b"}, "cluster": {"nodes": 2}},
        "status": {"phase": "Running", "plan": {"alternatives": [{"a": 1}] * 50}, "observedGeneration": 1},
    }


@pytest.mark.parametrize(
    "extra_fields",
    [None, [], ["spec"], [("spec", "cluster")], ["status.phase"], [("status", "plan")], ["status"]],
)
def test_the_essence_is_kopfs_own(extra_fields: Any) -> None:
    body = kopf.Body(cast(kopf.RawBody, _btj()))
    ours = StatuslessDiffBaseStorage(prefix=PREFIX, key=KEY).build(body=body, extra_fields=extra_fields)
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY).build(
        body=body, extra_fields=extra_fields
    )
    assert ours == kopfs
    assert ("status" in ours) == ("status" in kopfs)


def test_the_essence_is_a_copy_and_the_body_is_left_alone() -> None:
    raw = _btj()
    before = json.dumps(raw, sort_keys=True)
    essence: Any = StatuslessDiffBaseStorage(prefix=PREFIX, key=KEY).build(
        body=kopf.Body(cast(kopf.RawBody, raw)), extra_fields=["spec"]
    )
    essence["spec"]["cluster"]["nodes"] = 9
    assert json.dumps(raw, sort_keys=True) == before

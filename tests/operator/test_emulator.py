"""The hardened KMock emulator behaves like an API server where the operator and Kopf depend on it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from blackwell_operator.testing.emulator import (
    HardenedEmulator,
    field_selector_matches,
    label_selector_matches,
    merge_patch,
)

BTJS = "/apis/training.blackwell.dev/v1alpha1/namespaces/ns1/blackwelltrainingjobs"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def k() -> AsyncIterator[HardenedEmulator]:
    async with HardenedEmulator() as emulator, kmock.Server(emulator):
        emulator.declare_resources()
        yield emulator


async def call(k: HardenedEmulator, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    response = await k.request(method, path, json=body, **kw)
    return response.status, await response.json()


def btj(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {"a": 1},
        "status": {"phase": "X"},
    }


async def test_create_sets_server_fields_and_answers_201(k: HardenedEmulator) -> None:
    status, obj = await call(k, "POST", BTJS, btj("a"))
    assert status == 201
    meta = obj["metadata"]
    assert (
        meta["namespace"] == "ns1" and meta["generation"] == 1 and meta["uid"] and meta["creationTimestamp"]
    )
    assert int(meta["resourceVersion"]) > 0
    assert "status" not in obj, "status is set only through /status"
    assert (await call(k, "POST", BTJS, btj("a")))[0] == 409


async def test_status_subresource_and_generation(k: HardenedEmulator) -> None:
    await call(k, "POST", BTJS, btj("a"))
    status, obj = await call(
        k, "PATCH", f"{BTJS}/a", {"spec": {"a": 2}, "status": {"phase": "Y"}}, headers=MERGE
    )
    assert status == 200 and obj["metadata"]["generation"] == 2 and "status" not in obj
    _, obj = await call(
        k, "PATCH", f"{BTJS}/a/status", {"spec": {"a": 3}, "status": {"phase": "Y"}}, headers=MERGE
    )
    assert obj["spec"] == {"a": 2} and obj["status"] == {"phase": "Y"} and obj["metadata"]["generation"] == 2
    _, obj = await call(k, "PATCH", f"{BTJS}/a", {"metadata": {"labels": {"x": "1"}}}, headers=MERGE)
    assert obj["metadata"]["generation"] == 2, "metadata changes do not bump the generation"


async def test_stale_resource_version_conflicts(k: HardenedEmulator) -> None:
    _, obj = await call(k, "POST", BTJS, btj("a"))
    rv = obj["metadata"]["resourceVersion"]
    await call(k, "PATCH", f"{BTJS}/a/status", {"status": {"phase": "Y"}}, headers=MERGE)
    status, body = await call(
        k,
        "PATCH",
        f"{BTJS}/a/status",
        {"metadata": {"resourceVersion": rv}, "status": {"phase": "Z"}},
        headers=MERGE,
    )
    assert status == 409 and body["reason"] == "Conflict"
    test_op = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}]
    status, body = await call(
        k, "PATCH", f"{BTJS}/a", test_op, headers={"Content-Type": "application/json-patch+json"}
    )
    # A JSON patch the server cannot apply, a failed `test` op included, is 422 on kube-apiserver (kubectl
    # prints "The request is invalid"); Kopf's finalizer patches count on it ("try again next cycle").
    assert status == 422 and body["reason"] == "Invalid"


async def test_put_replaces_and_keeps_identity(k: HardenedEmulator) -> None:
    _, obj = await call(
        k, "POST", "/api/v1/namespaces/ns1/configmaps", {"metadata": {"name": "c"}, "data": {"a": "1"}}
    )
    status, new = await call(
        k, "PUT", "/api/v1/namespaces/ns1/configmaps/c", {"metadata": {"name": "c"}, "data": {"b": "2"}}
    )
    assert status == 200 and new["data"] == {"b": "2"} and new["metadata"]["uid"] == obj["metadata"]["uid"]


async def test_generate_name_and_namespaces(k: HardenedEmulator) -> None:
    status, obj = await call(
        k, "POST", "/api/v1/namespaces/ns1/events", {"metadata": {"generateName": "kopf-event-"}}
    )
    assert (
        status == 201
        and obj["metadata"]["name"].startswith("kopf-event-")
        and len(obj["metadata"]["name"]) == 16
    )
    assert (await call(k, "POST", "/api/v1/namespaces", {"metadata": {"name": "ns1"}}))[0] == 201
    status, listing = await call(k, "GET", "/api/v1/namespaces")
    assert status == 200 and [n["metadata"]["name"] for n in listing["items"]] == ["ns1"]
    assert (await call(k, "GET", "/api/v1/namespaces/ns1"))[1]["metadata"]["name"] == "ns1"


async def test_list_honours_selectors_and_reports_a_resource_version(k: HardenedEmulator) -> None:
    await call(k, "POST", BTJS, btj("a", team="x"))
    await call(k, "POST", BTJS, btj("b", team="y"))
    status, listing = await call(k, "GET", BTJS, params={"labelSelector": "team in (x,z)"})
    assert status == 200 and [i["metadata"]["name"] for i in listing["items"]] == ["a"]
    assert listing["kind"] == "BlackwellTrainingJobList" and int(listing["metadata"]["resourceVersion"]) >= 2
    _, listing = await call(k, "GET", BTJS, params={"fieldSelector": "metadata.name!=a"})
    assert [i["metadata"]["name"] for i in listing["items"]] == ["b"]


async def test_watch_resumes_after_a_resource_version_and_times_out(k: HardenedEmulator) -> None:
    _, a = await call(k, "POST", BTJS, btj("a"))
    await call(k, "PATCH", f"{BTJS}/a", {"spec": {"a": 5}}, headers=MERGE)
    await call(k, "DELETE", f"{BTJS}/a")
    params = {"watch": "true", "resourceVersion": a["metadata"]["resourceVersion"], "timeoutSeconds": "1"}
    async with k.get(BTJS, params=params) as response:
        lines = [json.loads(line) for line in (await response.read()).splitlines() if line.strip()]
    assert [e["type"] for e in lines] == ["MODIFIED", "DELETED"], "no replay of what the client saw"
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in lines]
    assert rvs == sorted(set(rvs)), "every event has its own, newer resourceVersion"


async def test_owner_references_are_garbage_collected(k: HardenedEmulator) -> None:
    _, owner = await call(k, "POST", BTJS, btj("a"))
    ref = {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "name": "a",
        "uid": owner["metadata"]["uid"],
    }
    await call(
        k, "POST", "/api/v1/namespaces/ns1/configmaps", {"metadata": {"name": "c", "ownerReferences": [ref]}}
    )
    await call(k, "DELETE", f"{BTJS}/a")
    assert k.get_object("v1/configmaps", "ns1", "c") is None
    # A dependent created for an owner that is already gone is collected too.
    await call(
        k, "POST", "/api/v1/namespaces/ns1/configmaps", {"metadata": {"name": "d", "ownerReferences": [ref]}}
    )
    assert k.get_object("v1/configmaps", "ns1", "d") is None


async def test_faults_fail_requests_with_or_without_applying_them(k: HardenedEmulator) -> None:
    k.inject_fault("post", "configmaps", 503)
    k.inject_fault("post", "configmaps", 504, commit=True)
    cm = {"metadata": {"name": "c"}}
    assert (await call(k, "POST", "/api/v1/namespaces/ns1/configmaps", cm))[0] == 503
    assert k.get_object("v1/configmaps", "ns1", "c") is None
    assert (await call(k, "POST", "/api/v1/namespaces/ns1/configmaps", cm))[0] == 504
    assert k.get_object("v1/configmaps", "ns1", "c") is not None
    assert (await call(k, "POST", "/api/v1/namespaces/ns1/configmaps", cm))[0] == 409


def test_selector_and_merge_semantics() -> None:
    labels = {"a": "1", "b": "2"}
    assert label_selector_matches("a=1,b", labels)
    assert label_selector_matches("a==1,!c,b notin (3,4)", labels)
    assert not label_selector_matches("a!=1", labels)
    assert not label_selector_matches("c", labels)
    assert field_selector_matches("metadata.name=x", {"metadata": {"name": "x"}})
    # A pod's node and phase, as the operator's list of the pods on nodes selects them (unset reads as "").
    on_nodes = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    assert field_selector_matches(on_nodes, {"spec": {"nodeName": "n"}, "status": {"phase": "Running"}})
    assert not field_selector_matches(on_nodes, {"spec": {}, "status": {"phase": "Pending"}})
    assert not field_selector_matches(on_nodes, {"spec": {"nodeName": "n"}, "status": {"phase": "Failed"}})
    assert not field_selector_matches("spec.schedulerName=x", {"spec": {"schedulerName": "x"}})  # unserved
    assert merge_patch({"a": 1, "b": {"c": 1}}, {"a": {"x": 1}, "b": {"c": None}}) == {"a": {"x": 1}, "b": {}}

"""The integration harness: the hardened KMock emulator as API server, the real operator under KopfRunner."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import kmock
import kopf
from kopf.testing import KopfRunner

import blackwell_operator.handlers as handlers
from blackwell_operator.admission.accounts import TRAINING_ACCOUNT_LABEL, TRAINING_ACCOUNT_VALUE
from blackwell_operator.testing import cluster as testing_cluster
from blackwell_operator.testing import kubeconfig as testing_kubeconfig
from blackwell_operator.testing.cluster import hyperpod_node
from blackwell_operator.testing.emulator import BTJ_RESOURCE, PYTORCHJOB_RESOURCE, HardenedEmulator
from tests.support.manifests import (
    B200,
    BTJS,
    CONFIGMAPS,
    HOLD_FINALIZER,
    HYPERPODJOBS,
    LAST_HANDLED,
    NAMESPACE,
    PODS,
    PYTORCHJOBS,
    TRAINJOBS,
    btj,
)
from tests.support.pods import job_condition

# The plain objects and paths live in tests/support/manifests.py (no kopf or kmock import); the
# integration tests take them from here with the rest.
__all__ = [
    "B200",
    "BTJS",
    "CONFIGMAPS",
    "HOLD_FINALIZER",
    "HYPERPODJOBS",
    "LAST_HANDLED",
    "NAMESPACE",
    "PODS",
    "PYTORCHJOBS",
    "TRAINJOBS",
    "Cluster",
    "api_calls",
    "btj",
    "emulated_cluster",
    "from_operator",
    "node",
    "operator_registry",
    "running_operator",
    "verb_of",
    "wait_for",
    "write_kubeconfig",
]


# Cluster.settle's sync point: an annotation the operator never reads.
SETTLE_ANNOTATION = "btj-test-settle"


def node(name: str, instance_type: str = B200, health: str = "Schedulable") -> dict[str, Any]:
    """A HyperPod node with its instance-type and health labels (no allocatable published)."""
    return hyperpod_node(name, instance_type, health=health)


async def wait_for(predicate: Callable[[], Any], *, timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll every 20 ms until `predicate()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (KeyError, TypeError, IndexError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Cluster:
    """Test-side view of the emulated cluster: HTTP calls like kubectl's, reads straight from the store."""

    def __init__(self, emulator: HardenedEmulator, job_kinds: int = 3) -> None:
        self.k = emulator
        self.job_kinds = job_kinds  # how many of the three job CRDs the cluster serves
        self._settles = 0

    @property
    def url(self) -> str:
        return str(self.k.url).rstrip("/")

    async def _json(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> Any:
        headers = {"Content-Type": content_type} if content_type else None
        response = await self.k.request(method, path, json=body, headers=headers)
        payload = await response.json()
        if response.status >= 400:
            raise AssertionError(f"{method} {path}: HTTP {response.status}: {payload.get('message')}")
        return payload

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """POST a BTJ."""
        result: dict[str, Any] = await self._json("POST", BTJS, copy.deepcopy(dict(manifest)))
        return result

    async def patch_spec(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a BTJ's spec, as `kubectl patch --type=merge` does."""
        result: dict[str, Any] = await self._json(
            "PATCH", f"{BTJS}/{name}", {"spec": dict(spec)}, "application/merge-patch+json"
        )
        return result

    async def patch_labels(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        """Merge-patch a BTJ's labels (None removes one), as `kubectl label` does."""
        result: dict[str, Any] = await self._json(
            "PATCH", f"{BTJS}/{name}", {"metadata": {"labels": dict(labels)}}, "application/merge-patch+json"
        )
        return result

    async def delete_btj(self, name: str) -> None:
        await self._json("DELETE", f"{BTJS}/{name}")

    async def set_child_status(
        self, name: str, status: Mapping[str, Any], *, collection: str = PYTORCHJOBS
    ) -> None:
        """Play the training operator: merge-patch the job's /status."""
        await self._json(
            "PATCH", f"{collection}/{name}/status", {"status": dict(status)}, "application/merge-patch+json"
        )

    async def running_child(self, name: str, **spec: Any) -> dict[str, Any]:
        """Apply BTJ `name` (the example spec with `spec` overrides), wait for its PyTorchJob, report that
        job Running as the training operator does and wait for phase Running; the job."""
        await self.apply(btj(name, **spec))
        job: dict[str, Any] = await wait_for(lambda: self.job(name), what=f"{name}'s PyTorchJob")
        await self.set_child_status(
            name, {"conditions": [job_condition("Created"), job_condition("Running")]}
        )
        await wait_for(lambda: self.status(name).get("phase") == "Running", what=f"{name} Running")
        return job

    async def delete_child(self, name: str, *, collection: str = PYTORCHJOBS) -> None:
        """Delete a child job by hand, as `kubectl delete pytorchjob NAME` does."""
        await self._json("DELETE", f"{collection}/{name}")

    async def set_btj_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a BTJ's /status (to stage what an earlier operator run left behind)."""
        await self._json(
            "PATCH", f"{BTJS}/{name}/status", {"status": dict(status)}, "application/merge-patch+json"
        )

    async def settle(self, name: str) -> None:
        """Wait until the operator has handled every event of BTJ `name` seen so far.

        Kopf handles one object's events in order, event handlers first, and stores what it handled in its
        last-handled-configuration annotation, the BTJ's annotations included. Once that annotation shows a
        fresh value of an annotation of ours, every earlier event of this BTJ went through every handler: a
        positive sync point, so that "nothing happened" can be asserted without sleeping.

        An annotation, not a label: the operator copies a BTJ's labels onto its children (a label edit is
        a reconcile pass of its own), so a label would change what the test asserts on; it reads no BTJ
        annotation, and Kopf has no handler for one.
        """
        self._settles += 1
        token = str(self._settles)
        await self._json(
            "PATCH",
            f"{BTJS}/{name}",
            {"metadata": {"annotations": {SETTLE_ANNOTATION: token}}},
            "application/merge-patch+json",
        )

        def handled() -> bool:
            annotations = (self.btj(name) or {}).get("metadata", {}).get("annotations") or {}
            stored = json.loads(annotations.get(LAST_HANDLED, "{}"))
            return bool(stored.get("metadata", {}).get("annotations", {}).get(SETTLE_ANNOTATION) == token)

        await wait_for(handled, what=f"the operator to handle every event of {name}")

    async def add_service_account(self, name: str, *, allowed: bool = True) -> None:
        """Create a ServiceAccount in the namespace, as `kubectl create serviceaccount NAME` does, and (by
        default) label it for training as an admin does (admission/accounts.py)."""
        labels = {TRAINING_ACCOUNT_LABEL: TRAINING_ACCOUNT_VALUE} if allowed else {}
        body = {"metadata": {"name": name, "labels": labels}}
        await self._json("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", body)

    async def label_service_account(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch a ServiceAccount's labels, as `kubectl label serviceaccount` does."""
        await self._json(
            "PATCH",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}",
            {"metadata": {"labels": dict(labels)}},
            "application/merge-patch+json",
        )

    async def add_secret(self, name: str) -> None:
        """Create a docker-registry Secret in the namespace (its content is never read)."""
        body = {
            "metadata": {"name": name},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": "e30="},
        }
        await self._json("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body)

    async def add_node(self, manifest: Mapping[str, Any]) -> None:
        await self._json("POST", "/api/v1/nodes", dict(manifest))

    async def restarting_job(self, name: str, restarting: Mapping[str, Any]) -> dict[str, Any]:
        """Apply BTJ `name`, wait for its PyTorchJob, report that job `restarting` (its status) and wait until
        the BTJ shows phase Restarting; the job is returned (for the owner reference of its pods)."""
        await self.apply(btj(name))
        job = await wait_for(lambda: self.job(name), what="the PyTorchJob")
        await wait_for(lambda: self.condition(name, "ChildCreated"), what="ChildCreated")
        await self.set_child_status(name, restarting)
        await wait_for(lambda: self.status(name).get("phase") == "Restarting", what="phase Restarting")
        return dict(job)

    async def terminating_pod(self, manifest: Mapping[str, Any]) -> str:
        """Create a pod, then delete it as the node controller's eviction does; a finalizer keeps it
        Terminating here, as a kubelet that never confirms does on a lost node."""
        body = copy.deepcopy(dict(manifest))
        body["metadata"]["finalizers"] = [*(body["metadata"].get("finalizers") or []), HOLD_FINALIZER]
        name = await self.add_pod(body)
        await self._json("DELETE", f"{PODS}/{name}", {"gracePeriodSeconds": 0})
        return name

    async def set_node_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Play the kubelet: merge-patch the node's /status (conditions such as Ready)."""
        await self._json(
            "PATCH", f"/api/v1/nodes/{name}/status", {"status": dict(status)}, "application/merge-patch+json"
        )

    async def add_pod(self, manifest: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> str:
        """Create a pod (as the training operator does), then set its status (as the kubelet does)."""
        created = await self._json("POST", PODS, copy.deepcopy(dict(manifest)))
        name = str(created["metadata"]["name"])
        if status is not None:
            await self.set_pod_status(name, status)
        return name

    async def set_pod_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Play the kubelet: merge-patch the pod's /status."""
        await self._json(
            "PATCH", f"{PODS}/{name}/status", {"status": dict(status)}, "application/merge-patch+json"
        )

    def btj(self, name: str) -> dict[str, Any] | None:
        return self.k.get_object(BTJ_RESOURCE, NAMESPACE, name)

    def status(self, name: str) -> dict[str, Any]:
        obj = self.btj(name) or {}
        return dict(obj.get("status") or {})

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        for cond in self.status(name).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return None

    def job(self, name: str, resource: str = PYTORCHJOB_RESOURCE) -> dict[str, Any] | None:
        return self.k.get_object(resource, NAMESPACE, name)

    def config_map(self, name: str) -> dict[str, Any] | None:
        return self.k.get_object("v1/configmaps", NAMESPACE, name)

    def events(self, involved: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.k.live_objects("v1/events", NAMESPACE)
            if (e.get("involvedObject") or {}).get("name") == involved
        ]

    def creates(self, plural: str) -> int:
        """POST requests seen for a resource (successful or not)."""
        return sum(
            1
            for r in self.k.requests
            if r.method == kmock.method.POST and r.resource is not None and r.resource.plural == plural
        )


def verb_of(request: Any) -> str | None:
    """The RBAC verb of a recorded request."""
    method = request.method.value
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if request.name else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method)


def from_operator(request: Any) -> bool:
    """Whether the operator (Kopf or its kubernetes client) sent the request, not the test."""
    return not str(request.headers.get("User-Agent", "")).startswith("kmock/")


def api_calls(requests: Any) -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/subresource], verb) of every resource request (discovery excluded)."""
    calls = set()
    for request in requests:
        resource = request.resource
        if resource is None or not resource.plural:
            continue
        verb = verb_of(request)
        if verb is None:
            continue
        plural = resource.plural + (f"/{request.subresource}" if request.subresource else "")
        calls.add((resource.group or "", plural, verb))
    return calls


def write_kubeconfig(path: Path, server: str) -> Path:
    return testing_kubeconfig.write_kubeconfig(path, server, namespace=NAMESPACE)


def operator_registry(server: str) -> kopf.OperatorRegistry:
    """A fresh registry with every operator handler and a login for the emulator."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=server, scheme="Bearer", token="test-token", default_namespace=NAMESPACE
        )

    return registry


@contextlib.asynccontextmanager
async def running_operator(cluster: Cluster, *, namespace: str | None = None) -> AsyncIterator[KopfRunner]:
    """The real operator in KopfRunner's thread; stopped off the test loop (harness pitfall 7)."""
    watches_before = _watch_count(cluster)
    args = ["run", "--standalone"] + (["--namespace", namespace] if namespace else ["--all-namespaces"])
    runner = KopfRunner(args, registry=operator_registry(cluster.url), timeout=30)
    runner.__enter__()
    try:
        # Ready when it watches BTJs, the child kinds the cluster serves and the trainer pods.
        wanted = watches_before + 2 + cluster.job_kinds
        await wait_for(lambda: _watch_count(cluster) >= wanted, what="the operator's watches")
        yield runner
    except BaseException as exc:
        await asyncio.to_thread(runner.__exit__, type(exc), exc, exc.__traceback__)
        raise
    else:
        await asyncio.to_thread(runner.__exit__, None, None, None)


def _watch_count(cluster: Cluster) -> int:
    return sum(
        1
        for r in cluster.k.requests
        if verb_of(r) == "watch"
        and r.resource is not None
        and r.resource.plural
        in ("blackwelltrainingjobs", "pytorchjobs", "hyperpodpytorchjobs", "trainjobs", "pods")
    )


@contextlib.asynccontextmanager
async def emulated_cluster(
    nodes: int = 2, unhealthy: int = 0, job_resources: tuple[str, ...] | None = None
) -> AsyncIterator[Cluster]:
    """The emulator with the namespace and `nodes` B200 nodes (`unhealthy` of them not Schedulable),
    serving every job CRD or `job_resources` only."""
    bodies = [
        node(f"hyperpod-i-{i:03d}", health="Unschedulable" if i < unhealthy else "Schedulable")
        for i in range(nodes)
    ]
    async with testing_cluster.emulated_cluster(NAMESPACE, bodies, job_resources) as emulator:
        yield Cluster(emulator, 3 if job_resources is None else len(job_resources))

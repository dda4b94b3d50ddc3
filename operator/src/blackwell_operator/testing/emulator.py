"""A hardened KMock Kubernetes emulator: enough API-server semantics to run the real operator against it.

Plain KMock 0.8 lacks what Kopf and the kubernetes client rely on (see docs/reference/k8s-test-harness.md):
resourceVersions, an RV-honouring watch, 201 on create, generateName, status-subresource rules, generation,
PUT, selectors, `timeoutSeconds`, `GET /api/v1/namespaces`. This subclass adds them, plus optimistic
concurrency (409 on a stale `metadata.resourceVersion`), owner-reference garbage collection and fault
injection. It uses a few KMock internals, hence the pin `kmock==0.8`.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import copy
import itertools
import random
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import attrs
import jsonpatch
import kmock
from kmock._internal import aiobus, parsing, rendering

from blackwell_operator.models.spec import API_GROUP, API_VERSION, KIND, PLURAL, Backend
from blackwell_operator.render.kinds import JOB_KINDS, JOBSET, TRAINING_RUNTIME
from blackwell_operator.timefmt import now_rfc3339

BTJ_RESOURCE = f"{API_GROUP}/{API_VERSION}/{PLURAL}"
PYTORCHJOB_RESOURCE = JOB_KINDS[Backend.PYTORCH_JOB].resource
HYPERPOD_RESOURCE = JOB_KINDS[Backend.HYPERPOD_PYTORCH_JOB].resource
TRAINJOB_RESOURCE = JOB_KINDS[Backend.TRAIN_JOB].resource
TRAINING_RUNTIME_RESOURCE = TRAINING_RUNTIME.resource
JOBSET_RESOURCE = JOBSET.resource
JOB_RESOURCES = tuple(row.resource for row in JOB_KINDS.values())
# The subresources each job CRD serves (a PyTorchJob's scale too).
_JOB_SUBRESOURCES = {Backend.PYTORCH_JOB: {"status", "scale"}}
_ALL_VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}

_NAMESPACES_PATH = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?$")
_original_parse_path = parsing.parse_path
_parse_fix_users = 0


def _parse_path_fixed(path: str) -> parsing.ParsedPath:
    # KMock reads /api/v1/namespaces/NAME as "namespace NAME" with no plural; a namespace object is
    # a cluster-scoped resource named NAME.
    match = _NAMESPACES_PATH.match(path)
    if match:
        return parsing.ParsedPath("", "v1", "namespaces", None, match["name"], match["sub"])
    return _original_parse_path(path)


def _install_parse_fix() -> None:
    global _parse_fix_users
    _parse_fix_users += 1
    parsing.parse_path = _parse_path_fixed


def _remove_parse_fix() -> None:
    global _parse_fix_users
    _parse_fix_users -= 1
    if _parse_fix_users <= 0:
        parsing.parse_path = _original_parse_path


def _rv_of(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (a dict may replace a scalar, unlike KMock's built-in merge)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ----- selectors -------------------------------------------------------------------------------------------

_SET_EXPR = re.compile(r"^\s*(?P<key>[^\s!=]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    # Commas separate requirements, except inside "in (a,b)" value lists.
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def label_selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics: =, ==, !=, in, notin, exists, !key."""
    for req in _split_selector(selector):
        set_match = _SET_EXPR.match(req)
        if set_match:
            values = {v.strip() for v in set_match["values"].split(",") if v.strip()}
            present = set_match["key"] in labels and labels[set_match["key"]] in values
            if (set_match["op"] == "in") != present:
                return False
        elif "!=" in req:
            key, value = (s.strip() for s in req.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in req:
            key, value = (s.strip() for s in req.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif req not in labels:
            return False
    return True


# Field selectors the API server serves: every resource's metadata.name and metadata.namespace, and of a
# pod's fields those the operator uses (the API server serves a few more: pkg/registry/core/pod/strategy.go).
_SELECTABLE_FIELDS = frozenset({"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"})


def field_selector_matches(selector: str, obj: Mapping[str, Any]) -> bool:
    """Field selectors (= / == / !=) on metadata.name, metadata.namespace and a pod's spec.nodeName and
    status.phase; an unset field reads as "" (so `spec.nodeName!=` selects the pods bound to a node)."""
    for req in _split_selector(selector):
        negate = "!=" in req
        key, value = (s.strip() for s in re.split(r"!=|==|=", req, maxsplit=1))
        if key not in _SELECTABLE_FIELDS:
            return False
        section, _, name = key.partition(".")
        actual = str((obj.get(section) or {}).get(name) or "")
        if (actual == value) == negate:
            return False
    return True


def _matches(request: rendering.Request, obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata", {})
    if request.namespace is not None and meta.get("namespace") != request.namespace:
        return False
    if request.name is not None and meta.get("name") != request.name:
        return False
    labels = request.params.get("labelSelector")
    if labels and not label_selector_matches(labels, meta.get("labels") or {}):
        return False
    fields = request.params.get("fieldSelector")
    return not (fields and not field_selector_matches(fields, obj))


# ----- the recording bus and faults ------------------------------------------------------------------------


@attrs.mutable(weakref_slot=True)
class _RecordingBus(aiobus.Bus[Any]):
    """A KMock bus that also keeps every event, so a watch can resume from a resourceVersion."""

    next_rv: Callable[[], str] = attrs.field(kw_only=True, default=lambda: "0")
    history: list[dict[str, Any]] = attrs.field(init=False, factory=list)

    async def put(self, *items: Any) -> None:
        stamped = []
        for item in items:
            if isinstance(item, dict) and item.get("type") == "DELETED":
                # A real server gives the deletion its own resourceVersion; KMock repeats the last one.
                obj = copy.deepcopy(item["object"])
                obj.setdefault("metadata", {})["resourceVersion"] = self.next_rv()
                item = {"type": "DELETED", "object": obj}
            if isinstance(item, dict):
                self.history.append(item)
            stamped.append(item)
        await super().put(*stamped)


@dataclass
class Fault:
    """Answer matching requests with an error `times` times; `commit` applies the change first."""

    method: str
    plural: str
    status: int
    times: int = 1
    commit: bool = False
    subresource: str | None = None
    reason: str = "InjectedFault"
    watch: bool | None = None  # True: only watch requests, False: none, None: either
    # Only requests this says yes to (one object's, one writer's): None, every matching request.
    when: Callable[[rendering.Request], bool] | None = None
    hits: int = 0  # requests answered with the fault so far

    def matches(self, request: rendering.Request) -> bool:
        watching = request.params.get("watch") in ("true", "1")
        return (
            self.times > 0
            and request.method.value == self.method.upper()
            and request.resource is not None
            and request.resource.plural == self.plural
            and request.subresource == self.subresource
            and (self.watch is None or self.watch == watching)
            and (self.when is None or self.when(request))
        )


@dataclass
class Chaos:
    """Random faults for soak runs: each request not from KMock's own client (the test's) and not a watch
    is delayed up to `max_delay_s` and, with probability `rate`, answered with one of `statuses`; a
    `committed` share of those failing writes is applied first (an answer lost on the way back)."""

    rate: float
    statuses: tuple[int, ...] = (409, 500, 503, 504)
    max_delay_s: float = 0.0
    committed: float = 0.25
    rng: random.Random = field(default_factory=random.Random)
    injected: int = 0
    # Each fault drawn: (method, plural, subresource, object name, status, applied first), for a soak to
    # say which requests met one (a create's name is its body's).
    drawn: list[tuple[str, str, str, str, int, bool]] = field(default_factory=list)

    def applies(self, request: rendering.Request) -> bool:
        if str(request.headers.get("User-Agent", "")).startswith("kmock/"):
            return False
        return request.params.get("watch") not in ("true", "1")

    def draw(self, request: rendering.Request) -> tuple[float, int | None, bool]:
        """(delay, the status to answer or None, whether to apply the change first).

        A conflict only where a real server can answer one: a create (the name is taken) or a write that
        names the resourceVersion it read; elsewhere a drawn 409 becomes a 500.
        """
        delay = self.rng.uniform(0.0, self.max_delay_s) if self.max_delay_s > 0 else 0.0
        if self.rng.random() >= self.rate:
            return delay, None, False
        self.injected += 1
        status = self.rng.choice(self.statuses)
        data = request.data if isinstance(request.data, dict) else {}
        guarded = bool((data.get("metadata") or {}).get("resourceVersion"))
        if status == 409 and not (request.method == kmock.method.POST or guarded):
            status = 500
        committed = self.rng.random() < self.committed
        name = request.name or str((data.get("metadata") or {}).get("name") or "")
        plural = str(request.resource.plural or "") if request.resource is not None else ""
        self.drawn.append((request.method.value, plural, request.subresource or "", name, status, committed))
        return delay, status, committed


_HANDLING: contextvars.ContextVar[rendering.Request | None] = contextvars.ContextVar("handling", default=None)
_ERROR_REASONS = {
    409: "Conflict",
    410: "Expired",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def _error(status: int, message: str, reason: str | None = None) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=status, reason=reason or _ERROR_REASONS.get(status, "Error"), message=message, details={}
    )


# ----- the emulator ----------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class HardenedEmulator(kmock.KubernetesEmulator):
    """KMock's KubernetesEmulator with the API-server semantics the operator and Kopf rely on."""

    _rv_counter: Iterable[int] = attrs.field(init=False, factory=lambda: itertools.count(1))
    _last_rv: int = attrs.field(init=False, default=0)
    _write_lock: asyncio.Lock = attrs.field(init=False, factory=asyncio.Lock)
    faults: list[Fault] = attrs.field(init=False, factory=list)
    chaos: Chaos | None = attrs.field(init=False, default=None)
    garbage_collection: bool = True

    def __attrs_post_init__(self) -> None:
        self._buses = collections.defaultdict(lambda: _RecordingBus(next_rv=self._next_rv))
        super().__attrs_post_init__()

    async def __aenter__(self) -> HardenedEmulator:
        _install_parse_fix()
        await super().__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await super().__aexit__(*exc)
        finally:
            _remove_parse_fix()

    # -- public helpers for tests and the demo --

    def declare_resources(self, only: Collection[str] | None = None) -> None:
        """The built-ins of a K3s cluster plus the CRDs the operator touches; of the job CRDs (PyTorchJob,
        HyperPodPyTorchJob, TrainJob with TrainingRuntime), `only` those named when given."""
        self._declare_all()
        if only is not None:
            for resource in JOB_RESOURCES:
                if resource not in only:
                    del self.resources[resource]
            if TRAINJOB_RESOURCE not in only:
                del self.resources[TRAINING_RUNTIME_RESOURCE]
                del self.resources[JOBSET_RESOURCE]

    def _declare_all(self) -> None:
        self.resources.load_bundled()
        self.resources[BTJ_RESOURCE] = kmock.ResourceInfo(
            kind=KIND,
            singular=KIND.lower(),
            namespaced=True,
            verbs=_ALL_VERBS,
            shortnames={"btj"},
            categories={"ml"},
            subresources={"status"},
        )
        for backend, row in JOB_KINDS.items():
            self.resources[row.resource] = kmock.ResourceInfo(
                kind=row.kind,
                singular=row.singular,
                namespaced=True,
                verbs=_ALL_VERBS,
                subresources=_JOB_SUBRESOURCES.get(backend, {"status"}),
            )
        self.resources[TRAINING_RUNTIME_RESOURCE] = kmock.ResourceInfo(
            kind=TRAINING_RUNTIME.kind, singular=TRAINING_RUNTIME.singular, namespaced=True, verbs=_ALL_VERBS
        )
        # The JobSet a TrainJob runs as (Kubeflow Trainer v2 installs JobSet beside it).
        self.resources[JOBSET_RESOURCE] = kmock.ResourceInfo(
            kind=JOBSET.kind,
            singular=JOBSET.singular,
            namespaced=True,
            verbs=_ALL_VERBS,
            subresources={"status"},
        )

    def inject_fault(
        self,
        method: str,
        plural: str,
        status: int,
        *,
        times: int = 1,
        commit: bool = False,
        subresource: str | None = None,
        watch: bool | None = None,
        when: Callable[[rendering.Request], bool] | None = None,
    ) -> Fault:
        """Make the next `times` matching requests fail with `status` (after applying them if `commit`);
        `watch`: only watch requests (True), only others (False), either (None); `when`: only requests it
        says yes to."""
        fault = Fault(
            method=method,
            plural=plural,
            status=status,
            times=times,
            commit=commit,
            subresource=subresource,
            watch=watch,
            when=when,
        )
        self.faults.append(fault)
        return fault

    def live_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Current (not deleted) objects of a resource, as plain dicts."""
        res = kmock.resource(resource)
        return [
            obj.raw
            for (r, ns, _), obj in self.objects.items()
            if r == res and not obj.deleted and (namespace is None or ns == namespace)
        ]

    def get_object(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One live object, or None."""
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return dict(self.objects[key].raw)

    @property
    def requests(self) -> list[rendering.Request]:
        """Every request served so far, in order."""
        return list(self)

    # -- internals --

    def _next_rv(self) -> str:
        self._last_rv = next(self._rv_counter)  # type: ignore[call-overload]
        return str(self._last_rv)

    def _has_status_subresource(self, request: rendering.Request) -> bool:
        try:
            return request.resource is not None and "status" in self.resources[request.resource].subresources
        except KeyError:
            return False

    def _stored(self, request: rendering.Request) -> dict[str, Any] | None:
        if request.resource is None or request.name is None:
            return None
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(dict(self.objects[key].raw))

    def _set(self, request: rendering.Request, **fields: Any) -> None:
        for name, value in fields.items():
            object.__setattr__(request, name, value)  # Request is a frozen attrs class

    def _prepare_create(self, request: rendering.Request) -> None:
        data = request.data
        if not isinstance(data, dict):
            raise _error(400, "the request body must be a JSON object", "BadRequest")
        meta = data.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _error(422, "metadata.name or metadata.generateName is required", "Invalid")
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if request.namespace:
            meta["namespace"] = request.namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        meta["resourceVersion"] = self._next_rv()
        meta.pop("deletionTimestamp", None)
        if self._has_status_subresource(request):
            data.pop("status", None)  # status is set only through /status

    def _prepare_update(self, request: rendering.Request) -> None:
        """Compute the new object with real-server rules and hand KMock a whole-object replacement."""
        old = self._stored(request)
        if old is None:
            raise kmock.KubernetesObjectNotFoundError()
        data = request.data
        if isinstance(data, list):  # JSON patch
            try:
                new = jsonpatch.apply_patch(old, data, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                # kube-apiserver answers any JSON patch it cannot apply, a failed `test` op included, with
                # 422 (apiserver's patch handler); Kopf relies on that for its finalizer patches.
                raise _error(422, f"invalid JSON patch: {exc}", "Invalid") from exc
        elif isinstance(data, dict):
            wanted_rv = data.get("metadata", {}).get("resourceVersion")
            if wanted_rv and str(wanted_rv) != str(old["metadata"].get("resourceVersion")):
                raise _error(
                    409,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again",
                )
            new = copy.deepcopy(data) if request.method == kmock.method.PUT else merge_patch(old, data)
        else:
            raise _error(400, "the request body must be a JSON object or a JSON patch", "BadRequest")

        if self._has_status_subresource(request):
            if request.subresource == "status":
                # /status changes only status (and labels/annotations are ignored too on a real server).
                new = (
                    {**old, "status": new.get("status")}
                    if new.get("status") is not None
                    else {k: v for k, v in old.items() if k != "status"}
                )
            else:
                new = {k: v for k, v in new.items() if k != "status"}
                if "status" in old:
                    new["status"] = old["status"]
        # Identity fields are the server's; PUT bodies may omit them.
        meta = new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "name", "namespace", "generation", "deletionTimestamp"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
        if any(new.get(k) != old.get(k) for k in set(new) | set(old) if k not in ("metadata", "status")):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        meta["resourceVersion"] = self._next_rv()
        self._set(request, action=kmock.action.UPDATE, data=[{"op": "replace", "path": "", "value": new}])

    async def _collect_garbage(self, owner_uid: str) -> None:
        """Background cascading deletion, as kube-controller-manager's garbage collector does it."""
        orphans_gone: list[str] = []
        async with self._lock:
            for key, obj in list(self.objects.items()):
                if obj.deleted:
                    continue
                refs = obj.get("metadata", {}).get("ownerReferences") or []
                if not any(ref.get("uid") == owner_uid for ref in refs):
                    continue
                if obj.get("metadata", {}).get("finalizers"):
                    obj.patch(
                        {"metadata": {"deletionTimestamp": now_rfc3339(), "resourceVersion": self._next_rv()}}
                    )
                    await self._buses[key[0]].put({"type": "MODIFIED", "object": obj.raw})
                else:
                    raw = obj.raw
                    obj.delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})
                    orphans_gone.append(raw.get("metadata", {}).get("uid", ""))
        for uid in filter(None, orphans_gone):  # their own dependents, depth-first
            await self._collect_garbage(uid)

    async def _collect_if_orphaned(self, request: rendering.Request) -> None:
        """Delete a new object all of whose owners are gone (the garbage collector's dangling-owner rule)."""
        data = request.data if isinstance(request.data, dict) else {}
        meta = data.get("metadata", {})
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if not owners:
            return
        live = {obj.get("metadata", {}).get("uid") for obj in self.objects.values() if not obj.deleted}
        if owners & live:
            return
        async with self._lock:
            if request.resource is None:
                return
            key = (request.resource, meta.get("namespace"), str(meta.get("name")))
            if key not in self.objects or self.objects[key].deleted:
                return
            obj = self.objects[key]
            raw = obj.raw
            obj.delete()
            await self._buses[request.resource].put({"type": "DELETED", "object": raw})

    def __iter__(self) -> Iterator[rendering.Request]:
        # KMock matches a request to its reactions with `request in view`, which walks every request
        # ever served (quadratic under load). While one request is being handled, its own task sees
        # only that request; every other task (the tests) sees the full history.
        only = _HANDLING.get()
        if only is not None:
            yield only
            return
        yield from super().__iter__()

    async def _handle(self, request: rendering.Request) -> Any:
        token = _HANDLING.set(request)
        try:
            return await self._handle_one(request)
        finally:
            _HANDLING.reset(token)

    async def _handle_one(self, request: rendering.Request) -> Any:
        if request.resource is None or request.resource.plural is None:
            return await super()._handle(request)  # discovery and plain HTTP
        if request.method == kmock.method.PUT and request.name:
            self._set(request, action=kmock.action.UPDATE)
        fault = next((f for f in self.faults if f.matches(request)), None)
        if fault is None and self.chaos is not None and self.chaos.applies(request):
            delay, status, commit = self.chaos.draw(request)
            if delay:
                await asyncio.sleep(delay)
            if status is not None:
                fault = Fault(request.method.value, request.resource.plural, status, commit=commit)
        if fault is not None and not fault.commit:
            fault.times -= 1
            fault.hits += 1
            raise _error(fault.status, f"injected fault ({fault.status})", fault.reason)
        if request.action not in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE):
            return await super()._handle(request)
        async with self._write_lock:  # serialise writes: compute-then-store must not interleave
            uid = None
            if request.action == kmock.action.CREATE:
                self._prepare_create(request)
            else:
                old = self._stored(request)
                uid = old["metadata"].get("uid") if old else None
                if request.action == kmock.action.UPDATE:
                    self._prepare_update(request)
                elif (
                    old and old["metadata"].get("finalizers") and not old["metadata"].get("deletionTimestamp")
                ):
                    # KMock marks it deleted (a MODIFIED event) without a new resourceVersion; a real server
                    # gives that change one like any other.
                    key = (request.resource, request.namespace, str(request.name))
                    self.objects[key].patch({"metadata": {"resourceVersion": self._next_rv()}})
            response = await super()._handle(request)
        if uid and self.garbage_collection and self._stored(request) is None:
            await self._collect_garbage(uid)
        if request.action == kmock.action.CREATE and self.garbage_collection:
            await self._collect_if_orphaned(request)
        if fault is not None:
            fault.times -= 1
            fault.hits += 1
            raise _error(
                fault.status, f"injected fault ({fault.status}) after the change was applied", fault.reason
            )
        return response

    async def _serve_create(self, request: rendering.Request) -> rendering.Payload:
        return rendering.Response(status=201, payload=await super()._serve_create(request))

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_list(request)
        assert isinstance(payload, dict)
        info = self.resources.get(request.resource) if request.resource is not None else None
        kind = (getattr(info, "kind", None) or "Object") + "List"
        return {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {"resourceVersion": str(self._last_rv)},
            "items": [obj for obj in payload["items"] if _matches(request, obj)],
        }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now, even if no event comes
        assert request.resource is not None
        bus = self._buses[request.resource]
        assert isinstance(bus, _RecordingBus)
        since = request.params.get("resourceVersion")
        timeout = request.params.get("timeoutSeconds")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(timeout) if timeout else None
        async with self._lock:  # KMock emits events under this lock: no event slips between snapshot and mark
            marker = await bus.mark()
            if since and since != "0":
                backlog = [ev for ev in bus.history if _rv_of(ev["object"]) > int(since)]
            else:
                backlog = [
                    {"type": "ADDED", "object": obj.raw}
                    for (res, _, _), obj in self.objects.items()
                    if res == request.resource and not obj.deleted
                ]
        try:
            for event in backlog:
                if _matches(request, event["object"]):
                    yield event
            stream = bus.stream(since=marker).__aiter__()
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    event = await asyncio.wait_for(anext(stream), remaining)
                except TimeoutError:
                    return
                if isinstance(event, dict) and _matches(request, event.get("object", {})):
                    yield event
        finally:
            await bus.unmark(marker)

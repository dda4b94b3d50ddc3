"""A thin REST layer over the official kubernetes client: plain dicts in and out, typed errors."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import kubernetes
import urllib3

MERGE_PATCH = "application/merge-patch+json"
# Transient by nature: retry with backoff. 429 is throttling, 409 on a write is a lost race.
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class ApiError(Exception):
    """An API call that failed; `status` 0 means no HTTP answer (connection error, timeout)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        # What the operator asked for, set by the caller (e.g. "the create of PyTorchJob x"), and whether
        # it was on the way to creating the child: for the condition that reports a refusal.
        self.action: str | None = None
        self.creating = True
        super().__init__(f"HTTP {status} {reason}: {message}" if status else f"{reason}: {message}")

    @property
    def retryable(self) -> bool:
        """Whether waiting and trying again can help."""
        return self.status == 0 or self.status in RETRYABLE_STATUSES

    @property
    def metric_reason(self) -> str:
        """Label for btj_operator_reconcile_errors_total."""
        return f"ApiError{self.status}" if self.status else "ApiUnreachable"


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """/api/v1/... or /apis/group/version/... for a collection or one object."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def load_api_client() -> Any:
    """An ApiClient from the in-cluster service account, else from $KUBECONFIG / ~/.kube/config."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        # Read $KUBECONFIG now: the client freezes its default location at import time.
        config_file = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=config_file, client_configuration=configuration
        )
    configuration.connection_pool_maxsize = 32  # handlers run in Kopf's thread pool
    return kubernetes.client.ApiClient(configuration)


class KubeApi:
    """GET/LIST/POST/PATCH/DELETE on any resource path, returning parsed JSON dicts."""

    def __init__(self, api_client: Any, *, timeout: float = 15.0) -> None:
        self._client = api_client
        self._timeout = timeout

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            status, reason, data = self._send(method, path, body, query or [], headers)
        except kubernetes.client.exceptions.ApiException as exc:
            raise _api_error(int(exc.status or 0), str(exc.reason or "Error"), exc.body) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, type(exc).__name__, str(exc)) from exc
        if not 200 <= status <= 299:
            raise _api_error(status, reason, data)
        return dict(json.loads(data)) if data else {}

    def _send(
        self, method: str, path: str, body: Any, query: list[tuple[str, str]], headers: dict[str, str]
    ) -> tuple[int, str, bytes]:
        """One request through the client's generator API (kubernetes 37's ApiClient: serialize, then call;
        the range pyproject.toml pins, so there is one code path)."""
        serialized = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        method_, url, headers_, body_, post = serialized
        response = self._client.call_api(
            method_, url, header_params=headers_, body=body_, post_params=post, _request_timeout=self._timeout
        )
        response.read()
        return int(response.status), str(response.reason or ""), bytes(response.data or b"")

    def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._call("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, path: str, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Items of a collection."""
        query = [("labelSelector", label_selector)] if label_selector else []
        query += [("fieldSelector", field_selector)] if field_selector else []
        return list(self._call("GET", path, query=query or None).get("items") or [])

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST to a collection."""
        return self._call("POST", path, body=dict(body), content_type="application/json")

    def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch (RFC 7386); a metadata.resourceVersion in the body makes it conditional."""
        return self._call("PATCH", path, body=dict(body), content_type=MERGE_PATCH)

    def delete(self, path: str, *, uid: str | None = None, grace_period_s: int | None = None) -> bool:
        """Delete the object (its dependents in the background); False when it is gone already.

        With `uid`, only that object: a newer one of the same name is left alone (a 409 is raised).
        `grace_period_s=0` deletes a pod without waiting for its kubelet (a force delete).
        """
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            self._call("DELETE", path, body=body, content_type="application/json")
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _api_error(status: int, reason: str, body: Any) -> ApiError:
    message = reason
    try:
        payload = json.loads(body or "{}")
        message = str(payload.get("message") or message)
    except (TypeError, ValueError, AttributeError):
        pass
    return ApiError(status, reason or "Error", message)

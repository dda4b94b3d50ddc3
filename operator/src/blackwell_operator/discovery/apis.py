"""API discovery: which job kinds (PyTorchJob, HyperPodPyTorchJob, TrainJob) the cluster serves, cached."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from blackwell_operator.models.spec import Backend

# GET of a discovery document (/apis/<group>/<version>): the APIResourceList, or None when not served.
DiscoveryGetter = Callable[[str], Mapping[str, Any] | None]
# backend -> (apiVersion, plural) of its job kind (lifecycle.backends.JOB_RESOURCES, from render.kinds).
JobResources = Mapping[Backend, tuple[str, str]]
# A CRD installed or removed shows within this long; a burst of BTJs asks the API server once.
DEFAULT_TTL_S = 60.0


def discovery_path(api_version: str) -> str:
    """/apis/<group>/<version> (or /api/v1 for the core group)."""
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def serves(document: Mapping[str, Any] | None, plural: str) -> bool:
    """Whether a group version's APIResourceList lists the resource."""
    resources = (document or {}).get("resources") or []
    return any(isinstance(r, Mapping) and r.get("name") == plural for r in resources)


class ServedJobApis:
    """The backends whose job kind the cluster serves, by API discovery (one GET per group version),
    remembered for `ttl` seconds. An error other than 404 propagates (the caller retries)."""

    def __init__(
        self,
        get: DiscoveryGetter,
        resources: JobResources,
        *,
        ttl: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._get = get
        self._resources = dict(resources)
        self._ttl = ttl
        self._clock = clock
        self._cached: tuple[float, frozenset[Backend]] | None = None
        self._lock = threading.Lock()

    def served(self) -> frozenset[Backend]:
        """The backends served now (as of at most `ttl` seconds ago)."""
        with self._lock:
            cached = self._cached
        if cached is not None and self._clock() - cached[0] < self._ttl:
            return cached[1]
        found = frozenset(
            backend
            for backend, (api_version, plural) in self._resources.items()
            if serves(self._get(discovery_path(api_version)), plural)
        )
        with self._lock:
            self._cached = (self._clock(), found)
        return found

"""The cluster calibration's store: one ConfigMap in the operator's namespace, written with resourceVersion.

A ConfigMap rather than a CRD: it needs no schema installed or upgraded beside the operator, `kubectl get
cm -o yaml` and `btj calibrate cluster show` read it, and its size limit (1 MiB) holds the bounded sample
list many times over. Several measure rounds (and operator replicas during a rollout) update it; each
write carries the resourceVersion it read, and a conflict re-reads and merges again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from blackwell_operator.applabels import COMPONENT_LABEL, MANAGED_BY_LABEL, MANAGER
from blackwell_operator.calibration.cluster import ClusterCalibration, Sample
from blackwell_operator.calibration.learned_memory import MemoryReading
from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.settings import env_name, operator_environment

NAME = "btj-cluster-calibration"
DATA_KEY = "calibration.json"
NAMESPACE_ENV = env_name("cluster_calibration_namespace")
POOL_ENV = env_name("cluster_calibration_pool")
_LOG = logging.getLogger(__name__)


class UnreadableCalibration(ValueError):
    """The ConfigMap exists but does not hold a cluster calibration (edited by hand, another tool's)."""


def pooled() -> bool:
    """Whether plans learn from every namespace's jobs (`BTJ_CLUSTER_CALIBRATION_POOL`), not their own."""
    return operator_environment().cluster_calibration_pool


def calibration_namespace() -> str | None:
    """Where the ConfigMap lives (`BTJ_CLUSTER_CALIBRATION_NAMESPACE`); None: no cluster calibration."""
    return operator_environment().cluster_calibration_namespace


def path(namespace: str, name: str | None = NAME) -> str:
    return resource_path("v1", "configmaps", namespace, name)


def parse(config_map: Mapping[str, Any]) -> ClusterCalibration:
    """The calibration a ConfigMap holds; UnreadableCalibration, naming the fix, for anything else."""
    text = (config_map.get("data") or {}).get(DATA_KEY)
    where = f"ConfigMap {NAME} key {DATA_KEY}"
    if text is None:
        raise UnreadableCalibration(f"{where} is missing; `btj calibrate cluster reset` starts it afresh")
    try:
        return ClusterCalibration.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise UnreadableCalibration(
            f"{where} is not a cluster calibration ({first}); `btj calibrate cluster reset` starts it afresh"
        ) from None


def body_of(calibration: ClusterCalibration, namespace: str) -> dict[str, Any]:
    """The ConfigMap for a calibration."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": NAME,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGER, COMPONENT_LABEL: NAME},
        },
        "data": {DATA_KEY: calibration.model_dump_json(by_alias=True, indent=1)},
    }


def load(api: KubeApi, namespace: str) -> ClusterCalibration:
    """The stored calibration (empty when there is none yet)."""
    found = api.get(path(namespace))
    return ClusterCalibration() if found is None else parse(found)


def read_cluster_calibration(ctx: OperatorContext, logger: Logger) -> ClusterCalibration | None:
    """For planning: the stored calibration, or None (off, unreadable, the API down: plan on the model)."""
    namespace = calibration_namespace()
    if namespace is None:
        return None
    try:
        return load(ctx.api, namespace)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot read the cluster calibration, planning without it: {exc}")
    except UnreadableCalibration as exc:
        logger.warning(f"Planning without the cluster calibration: {exc}")
    return None


def record(
    api: KubeApi, namespace: str, sample: Sample | MemoryReading, logger: Logger | None = None
) -> ClusterCalibration:
    """Add one job's sample or memory reading: create the ConfigMap, or patch it on the resourceVersion
    read (409: again)."""

    def added(calibration: ClusterCalibration) -> ClusterCalibration:
        if isinstance(sample, MemoryReading):
            return calibration.record_memory(sample)
        return calibration.record(sample)

    def once() -> ClusterCalibration:
        found = api.get(path(namespace))
        if found is None:
            updated = added(ClusterCalibration())
            api.create(path(namespace, None), body_of(updated, namespace))
            return updated
        updated = added(parse(found))
        patch = body_of(updated, namespace)
        patch["metadata"] = {"resourceVersion": found["metadata"]["resourceVersion"]}
        api.patch(path(namespace), patch)
        return updated

    return retrying.call(f"cluster calibration {namespace}/{NAME}", logger or _LOG, once)

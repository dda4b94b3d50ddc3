"""Measured throughput, read back from a running trainer pod's /metrics: status.measured beside the plan.

The trainer exports cumulative counters (btj_trainer_tokens_total for the pod's GPUs, btj_trainer_gpus)
and the last step's MFU; tokens/s per GPU is the change of the token counter between two readings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from blackwell_operator.render.pod import METRICS_PORT_NAME, TRAINER_CONTAINER_NAMES


@dataclass(frozen=True)
class Reading:
    """One scrape of a trainer pod."""

    at: float  # seconds (the operator's clock)
    tokens: float  # tokens the pod's GPUs have trained since the pod started
    gpus: int
    mfu: float | None


def parse_reading(text: str, at: float) -> Reading | None:
    """The trainer's counters from Prometheus text, or None when they are not there (not our trainer)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
    if "btj_trainer_tokens_total" not in values:
        return None
    gpus = int(values.get("btj_trainer_gpus") or 1)
    mfu = values.get("btj_trainer_model_flops_utilization_ratio")
    return Reading(at, values["btj_trainer_tokens_total"], max(gpus, 1), mfu if mfu else None)


def tokens_per_second_per_gpu(earlier: Reading, later: Reading) -> float | None:
    """Throughput between two readings of one pod; None when it cannot be told (no time, a restart)."""
    elapsed = later.at - earlier.at
    trained = later.tokens - earlier.tokens
    if elapsed <= 0 or trained < 0:  # a restarted container counts from zero again
        return None
    return trained / elapsed / later.gpus


def metrics_endpoint(pod: Mapping[str, Any]) -> str | None:
    """http://IP:PORT/metrics of a running trainer pod (its container's `metrics` port), else None."""
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if status.get("phase") != "Running" or not ip or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") not in TRAINER_CONTAINER_NAMES:
            continue
        for port in container.get("ports") or []:
            if port.get("name") == METRICS_PORT_NAME and port.get("containerPort"):
                host = f"[{ip}]" if ":" in str(ip) else ip  # IPv6 pod addresses
                return f"http://{host}:{port['containerPort']}/metrics"
    return None

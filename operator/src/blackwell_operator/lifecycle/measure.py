"""Measured throughput and progress, read back from a running trainer pod's /metrics, beside the plan.

The trainer exports cumulative counters (btj_trainer_tokens_total for the pod's GPUs, btj_trainer_gpus),
the last step's MFU, the job's step and planned steps, and the peak reserved GPU memory; tokens/s per GPU
and the step time are the changes between two readings. A probed trainer also says which probe candidate
it trains with and that candidate's prediction (docs/probe.md), long before its termination message does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from blackwell_operator.render.pod import METRICS_PORT_NAME, TRAINER_CONTAINER_NAMES
from blackwell_trainer.plan.metric_names import (
    GPU_MEMORY_PEAK,
    GPUS,
    MEMORY_KIND_LABEL,
    MFU,
    PLANNED_STEPS,
    PREDICTED_MEMORY_PEAK,
    PREDICTED_TOKENS_PER_SECOND,
    PROBE_RESULT_PATH,
    PROBE_WINNER,
    RESERVED,
    STEP,
    STEPS,
    TOKENS,
    total,
)


@dataclass(frozen=True)
class Reading:
    """One scrape of a trainer pod."""

    at: float  # seconds (the operator's clock)
    tokens: float  # tokens the pod's GPUs have trained since the pod started
    gpus: int
    mfu: float | None
    step: int | None = None  # the job's last completed step (None: a trainer without the gauge)
    planned_steps: int | None = None
    pod_steps: int = 0  # steps this container ran since it started (its warm-up comes first)
    reserved_bytes: int = 0  # peak reserved GPU memory of local rank 0 (0 on CPU)
    # The probe candidate the pod trains with (its index in plan.probe.options; None: no probe, or a trainer
    # without the gauge) and the prediction the pod exports beside it: the winner's once it has probed.
    probe_winner: int | None = None
    predicted_tokens_per_second: float | None = None
    predicted_peak_reserved: int | None = None


# Beyond 2**53 a float gauge no longer counts one by one; well below what the status's int64 fields hold,
# so a pod's absurd count cannot make the API server refuse the BTJ's whole status write.
MAX_COUNT = 2**53


def _count(value: float | None) -> int | None:
    """A gauge or counter that must be a whole number of something: None unless finite, not negative and
    at most MAX_COUNT."""
    if value is None or not math.isfinite(value) or not 0 <= value <= MAX_COUNT:
        return None
    return int(value)


def parse_reading(text: str, at: float) -> Reading | None:
    """The trainer's counters from Prometheus text, or None when they are not there (not our trainer) or
    not a reading at all (a token count that is NaN, infinite or negative). A NaN or infinite gauge beside
    a good count is dropped (no MFU, no step); ValueError for text that is not Prometheus exposition."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kind = sample.labels.get(MEMORY_KIND_LABEL)
            values[f"{sample.name}:{kind}" if kind else sample.name] = float(sample.value)
    tokens = values.get(total(TOKENS))
    if tokens is None or not math.isfinite(tokens) or tokens < 0:
        return None
    mfu = values.get(MFU)
    predicted = values.get(PREDICTED_TOKENS_PER_SECOND)
    return Reading(
        at,
        tokens,
        max(_count(values.get(GPUS)) or 1, 1),
        mfu if mfu and math.isfinite(mfu) and mfu > 0 else None,
        step=_count(values.get(STEP)),
        planned_steps=_count(values.get(PLANNED_STEPS)) or None,
        pod_steps=_count(values.get(total(STEPS))) or 0,
        reserved_bytes=_count(values.get(f"{GPU_MEMORY_PEAK}:{RESERVED}")) or 0,
        probe_winner=_count(values.get(PROBE_WINNER)),  # -1 (no probe) is not a count: None
        predicted_tokens_per_second=predicted if predicted and math.isfinite(predicted) else None,
        predicted_peak_reserved=_count(values.get(PREDICTED_MEMORY_PEAK)),
    )


def tokens_per_second_per_gpu(earlier: Reading, later: Reading) -> float | None:
    """Throughput between two readings of one pod; None when it cannot be told (no time, a restart)."""
    elapsed = later.at - earlier.at
    trained = later.tokens - earlier.tokens
    if elapsed <= 0 or trained < 0:  # a restarted container counts from zero again
        return None
    rate = trained / elapsed / later.gpus
    return rate if math.isfinite(rate) else None


def probe_endpoint(metrics_url: str) -> str:
    """The probe result's URL beside a pod's /metrics (the trainer serves both on its metrics port)."""
    return metrics_url.removesuffix("/metrics") + PROBE_RESULT_PATH


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

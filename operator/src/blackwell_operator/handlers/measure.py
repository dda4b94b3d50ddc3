"""The measure loop: each running BTJ's throughput, read from one trainer pod's /metrics into status.measured.

One loop for the operator, fed by the pod watch (OperatorContext.running_pods). Workers of a job step in
lockstep, so one pod per job tells its tokens/s per GPU. The operator must reach the pods' metrics port
(a NetworkPolicy may forbid it): an unreachable pod is logged at debug level and status.measured stays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from blackwell_operator.failures import belongs_to
from blackwell_operator.handlers.api import ApiError
from blackwell_operator.handlers.btjstatus import write_status
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.periodic import every
from blackwell_operator.measure import Reading, metrics_endpoint, parse_reading, tokens_per_second_per_gpu
from blackwell_operator.models.status import Phase
from blackwell_operator.render.labels import JOB_NAME_LABEL
from blackwell_operator.settings import env_name, operator_environment
from blackwell_operator.status import now_rfc3339

INTERVAL_ENV = env_name("measure_interval_s")
SCRAPE_TIMEOUT_S = 5.0
# A reading this close to the stored one is not written (a status write per job per minute otherwise).
UNCHANGED = 0.01


def measure_interval() -> float | None:
    """Seconds between readings (`BTJ_MEASURE_INTERVAL_S`, default 60); None when 0 (off)."""
    return operator_environment().measure_interval_s or None


def one_pod_per_job(pods: list[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """(namespace, BTJ name) -> the first running trainer pod by name that has a metrics endpoint."""
    chosen: dict[tuple[str, str], Mapping[str, Any]] = {}
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace")), str((meta.get("labels") or {}).get(JOB_NAME_LABEL)))
        if key not in chosen and metrics_endpoint(pod):
            chosen[key] = pod
    return chosen


def _close(stored: Mapping[str, Any], tokens_per_s: float, mfu: float | None) -> bool:
    """Whether a reading is within 1% (tokens/s) and 0.01 (MFU) of the stored one."""
    before, before_mfu = stored.get("tokensPerSecondPerGpu"), stored.get("modelFlopsUtilization")
    if not before or abs(tokens_per_s - before) > UNCHANGED * before:
        return False
    if mfu is None or before_mfu is None:
        return mfu is None and before_mfu is None
    return bool(abs(mfu - float(before_mfu)) <= UNCHANGED)


def measured_changes(
    btj: Mapping[str, Any], pod: Mapping[str, Any], tokens_per_s: float, mfu: float | None, now: str
) -> dict[str, Any] | None:
    """status.measured from a reading of `pod`, when it is this BTJ's running worker and the value moved."""
    status = btj.get("status") or {}
    if status.get("phase") != Phase.RUNNING.value or not belongs_to(pod, btj):
        return None
    if _close(status.get("measured") or {}, tokens_per_s, mfu):
        return None
    measured: dict[str, Any] = {"tokensPerSecondPerGpu": round(tokens_per_s, 1), "observedAt": now}
    if mfu is not None:
        measured["modelFlopsUtilization"] = round(mfu, 4)
    return {"measured": measured}


class Measurer:
    """Reads the chosen pods and writes status.measured; remembers each pod's previous reading."""

    def __init__(self, ctx: OperatorContext, logger: Any) -> None:
        self.ctx, self.logger = ctx, logger
        self.previous: dict[str, Reading] = {}

    async def read(self, session: aiohttp.ClientSession, url: str) -> Reading | None:
        try:
            async with session.get(url) as response:
                if response.status != 200:
                    return None
                return parse_reading(await response.text(), time.monotonic())
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            self.logger.debug(f"Cannot read {url}: {exc}")
            return None

    async def once(self, session: aiohttp.ClientSession) -> int:
        """One round; how many BTJs got a new status.measured."""
        chosen = one_pod_per_job(self.ctx.running_pods())
        live = {str(p["metadata"].get("uid")) for p in chosen.values()}
        self.previous = {uid: r for uid, r in self.previous.items() if uid in live}
        written = 0
        for (namespace, name), pod in chosen.items():
            url, uid = metrics_endpoint(pod), str(pod["metadata"].get("uid"))
            reading = await self.read(session, str(url))
            if reading is None:
                continue
            earlier, self.previous[uid] = self.previous.get(uid), reading
            rate = tokens_per_second_per_gpu(earlier, reading) if earlier else None
            if rate is None:
                continue
            if await asyncio.to_thread(self._write, namespace, name, pod, rate, reading.mfu):
                written += 1
        return written

    def _write(
        self, namespace: str, name: str, pod: Mapping[str, Any], rate: float, mfu: float | None
    ) -> bool:
        now = now_rfc3339()
        try:
            return (
                write_status(
                    self.ctx.api, namespace, name, lambda b: measured_changes(b, pod, rate, mfu, now)
                )
                is not None
            )
        except ApiError as exc:
            self.ctx.metrics.record_error(exc.metric_reason)
            self.logger.warning(f"Cannot write the measured throughput of {namespace}/{name}: {exc}")
            return False


async def measure_forever(ctx: OperatorContext, interval_s: float, logger: Any) -> None:
    """Read every running job's throughput each interval, for the operator's lifetime."""
    measurer = Measurer(ctx, logger)
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await every(interval_s, lambda: measurer.once(session), logger, "Throughput reading")

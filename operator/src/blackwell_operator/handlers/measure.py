"""The measure loop: each running BTJ's throughput and progress, read from one trainer pod's /metrics.

Writes status.measured and status.progress, and gives each job's measured-over-modelled figures to the
cluster calibration (handlers/cluster_calibration.py), which later plans on the instance type apply.

One loop for the operator, fed by the pod watch (OperatorContext.running_pods). Workers of a job step in
lockstep, so one pod per job tells its tokens/s per GPU. The operator must reach the pods' metrics port
(a NetworkPolicy may forbid it): an unreachable pod is logged at debug level and status.measured stays.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from blackwell_operator.calibration.cluster import ImplausibleSample, Sample
from blackwell_operator.handlers import cluster_calibration
from blackwell_operator.handlers.api import ApiError
from blackwell_operator.handlers.btjstatus import write_status
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.periodic import every
from blackwell_operator.handlers.pods import pod_lineage, record_probe
from blackwell_operator.lifecycle.measure import (
    Reading,
    metrics_endpoint,
    parse_reading,
    probe_endpoint,
    tokens_per_second_per_gpu,
)
from blackwell_operator.lifecycle.measured import measured_changes, sample_of
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.lifecycle.progress import progress_of
from blackwell_operator.lifecycle.writers import MEASURE_LOOP
from blackwell_operator.models.status import JobProgress
from blackwell_operator.settings import env_name, operator_environment
from blackwell_operator.timefmt import now_rfc3339
from blackwell_trainer.plan.config import ProbeResult

INTERVAL_ENV = env_name("measure_interval_s")
SCRAPE_TIMEOUT_S = 5.0
# A job's calibration sample is rewritten only when its ratio moved this much (one ConfigMap write per job,
# not one per minute).
SAMPLE_MOVED = 0.02
# The most of a pod's served probe result read: a pod cannot make the operator hold more of it.
PROBE_BYTES = 16 * 1024


def measure_interval() -> float | None:
    """Seconds between readings (`BTJ_MEASURE_INTERVAL_S`, default 60); None when 0 (off)."""
    return operator_environment().measure_interval_s or None


def one_pod_per_job(
    pods: list[Mapping[str, Any]], lineages: Mapping[str, Lineage]
) -> dict[tuple[str, str], tuple[Mapping[str, Any], Lineage]]:
    """(namespace, BTJ name) -> the first running trainer pod by name that has a metrics endpoint and a
    verified owner chain (`lineages`, by pod uid: a pod with the trainer's labels alone is not read)."""
    chosen: dict[tuple[str, str], tuple[Mapping[str, Any], Lineage]] = {}
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        meta = pod.get("metadata") or {}
        found = lineages.get(str(meta.get("uid")))
        if found is None:
            continue
        key = (str(meta.get("namespace")), found.btj_name)
        if key not in chosen and metrics_endpoint(pod):
            chosen[key] = (pod, found)
    return chosen


class Measurer:
    """Reads the chosen pods and writes status.measured; remembers each pod's previous reading."""

    def __init__(self, ctx: OperatorContext, logger: Logger) -> None:
        self.ctx, self.logger = ctx, logger
        self.previous: dict[str, Reading] = {}
        self.sampled: dict[str, float] = {}  # BTJ uid -> the tokens ratio last given to the calibration
        self.probed: set[str] = set()  # pod uids whose served probe result is taken

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
        """One round; how many BTJs got a new status.measured. One job's bad reading or failed write is
        logged and skipped: the round goes on to the other jobs."""
        pods = self.ctx.running_pods()
        chosen = one_pod_per_job(pods, await asyncio.to_thread(self._lineages, pods))
        live = {str(p["metadata"].get("uid")) for p, _ in chosen.values()}
        self.previous = {uid: r for uid, r in self.previous.items() if uid in live}
        self.probed &= live
        known = self.ctx.known_btjs()
        self.sampled = {uid: r for uid, r in self.sampled.items() if uid in known}
        written = 0
        for (namespace, name), (pod, found) in chosen.items():
            try:
                written += await self._one(session, namespace, name, pod, found)
            except Exception as exc:  # one job's surprise must not cost the others their reading
                self.ctx.metrics.record_error("MeasureError")
                self.logger.warning(f"Cannot take the reading of {namespace}/{name}: {exc!r}")
        return written

    async def _one(
        self,
        session: aiohttp.ClientSession,
        namespace: str,
        name: str,
        pod: Mapping[str, Any],
        found: Lineage,
    ) -> int:
        """Read one job's pod; 1 when its status.measured was written."""
        url, uid = metrics_endpoint(pod), str(pod["metadata"].get("uid"))
        reading = await self.read(session, str(url))
        if reading is None:
            return 0
        earlier, self.previous[uid] = self.previous.get(uid), reading
        if reading.probe_winner is not None and uid not in self.probed:
            await self._take_probe(session, str(url), namespace, pod, found)
        rate = tokens_per_second_per_gpu(earlier, reading) if earlier else None
        progress = progress_of(earlier, reading, datetime.datetime.now(datetime.UTC))
        if rate is None and progress is None:
            return 0
        wrote = await asyncio.to_thread(self._write, namespace, name, pod, found, rate, reading, progress)
        if earlier is not None and rate is not None:
            await asyncio.to_thread(self._teach, namespace, name, earlier, reading, rate)
        return int(wrote)

    async def _take_probe(
        self, session: aiohttp.ClientSession, url: str, namespace: str, pod: Mapping[str, Any], found: Lineage
    ) -> None:
        """A probed pod's result, read from its metrics port as soon as it has chosen, taken as the pod
        watcher takes one from a termination message (status.probe, the Event, the samples, the plan's copy)
        instead of when the run ends. Once per pod: taken, or a result the pod watcher already handled."""
        uid = str(pod["metadata"].get("uid"))
        try:
            async with session.get(probe_endpoint(url)) as response:
                if response.status != 200:
                    return  # still probing, or a trainer without the endpoint
                # As much as a termination message holds (Kubernetes keeps 4,096 bytes of one), and some.
                probe = ProbeResult.find((await response.content.read(PROBE_BYTES)).decode())
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            self.logger.debug(f"Cannot read the probe result at {url}: {exc}")
            return
        if probe is None:
            return
        key = ("", probe.to_line())  # the pod watcher's key for the same line without a failure
        if not self.ctx.pod_failure_seen(uid, key):
            taken = await asyncio.to_thread(record_probe, self.ctx, namespace, found, pod, probe, self.logger)
            if not taken:
                return  # logged; the next reading tries again
            self.ctx.remember_pod_failure(uid, key)
        self.probed.add(uid)

    def _lineages(self, pods: list[Mapping[str, Any]]) -> dict[str, Lineage]:
        """The verified owner chains of the running pods that have one (a failed read: not this round)."""
        found: dict[str, Lineage] = {}
        for pod in pods:
            try:
                chain = pod_lineage(self.ctx, pod)
            except ApiError as exc:
                self.ctx.metrics.record_error(exc.metric_reason)
                continue
            if chain is not None:
                found[str(pod["metadata"].get("uid"))] = chain
        return found

    def _write(
        self,
        namespace: str,
        name: str,
        pod: Mapping[str, Any],
        found: Lineage,
        rate: float | None,
        reading: Reading,
        progress: JobProgress | None,
    ) -> bool:
        now = now_rfc3339()
        try:
            return (
                write_status(
                    self.ctx.api,
                    namespace,
                    name,
                    lambda b: measured_changes(
                        b, pod, rate, reading.mfu, now, progress, found=found, reading=reading
                    ),
                    MEASURE_LOOP,
                )
                is not None
            )
        except ApiError as exc:
            self.ctx.metrics.record_error(exc.metric_reason)
            self.logger.warning(f"Cannot write the measured throughput of {namespace}/{name}: {exc}")
            return False

    def _teach(self, namespace: str, name: str, earlier: Reading, later: Reading, rate: float) -> None:
        """Give the job's figures to the cluster calibration, when one is kept and they moved."""
        where = cluster_calibration.calibration_namespace()
        btj = self.ctx.known_btjs().get(self._uid_of(namespace, name) or "")
        if where is None or btj is None:
            return
        try:
            sample = sample_of(btj, earlier, later, rate, now_rfc3339())
            if sample is None or not self._moved(sample):
                return
            cluster_calibration.record(self.ctx.api, where, sample, self.logger)
            self.sampled[sample.uid] = sample.tokens_ratio
        except ImplausibleSample as exc:  # a misreading, or a pod lying about its speed: never stored
            self.ctx.metrics.record_error("ImplausibleSample")
            self.logger.warning(f"Not recording a reading in the cluster calibration: {exc}")
        except ApiError as exc:
            self.ctx.metrics.record_error(exc.metric_reason)
            self.logger.warning(f"Cannot record {namespace}/{name} in the cluster calibration: {exc}")
        except cluster_calibration.UnreadableCalibration as exc:
            self.logger.warning(f"Not recording {namespace}/{name}: {exc}")

    def _moved(self, sample: Sample) -> bool:
        before = self.sampled.get(sample.uid)
        return before is None or abs(sample.tokens_ratio - before) > SAMPLE_MOVED * before

    def _uid_of(self, namespace: str, name: str) -> str | None:
        for uid, btj in self.ctx.known_btjs().items():
            meta = btj.get("metadata") or {}
            if meta.get("namespace") == namespace and meta.get("name") == name:
                return uid
        return None


async def measure_forever(ctx: OperatorContext, interval_s: float, logger: Logger) -> None:
    """Read every running job's throughput each interval, for the operator's lifetime."""
    measurer = Measurer(ctx, logger)
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await every(interval_s, lambda: measurer.once(session), logger, "Throughput reading")

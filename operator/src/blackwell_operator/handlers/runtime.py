"""Operator start-up and shut-down: Kopf settings, the API client, and the /metrics + /healthz server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import Any

import kopf
from aiohttp import web

from blackwell_operator import admission
from blackwell_operator.applabels import MANAGED_BY_LABEL, MANAGER
from blackwell_operator.calibration import load_calibration
from blackwell_operator.catalogs import list_gpus, list_instances, list_presets
from blackwell_operator.discovery.apis import ServedJobApis
from blackwell_operator.discovery.aws import HyperPodCapacityReader, boto3_client_factory
from blackwell_operator.discovery.capacity import NodeCapacityReader, Unreadable
from blackwell_operator.handlers import kopf_patch, watch_gone
from blackwell_operator.handlers.api import ApiError, KubeApi, load_api_client, resource_path
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.diffbase import StatuslessDiffBaseStorage
from blackwell_operator.handlers.elastic import elastic_forever, elastic_interval
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.measure import measure_forever, measure_interval
from blackwell_operator.handlers.resync import resync_forever, resync_interval
from blackwell_operator.handlers.stuck import stuck_pod_timeout, sweep_forever
from blackwell_operator.lifecycle.backends import JOB_RESOURCES
from blackwell_operator.metrics import METRICS_PORT, OperatorMetrics
from blackwell_operator.models.spec import DEFAULT_IMAGE
from blackwell_operator.nodelabels import INSTANCE_TYPE_LABEL
from blackwell_operator.render.labels import JOB_NAME_LABEL
from blackwell_operator.settings import env_name, operator_environment

TRAINER_POD_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGER},{JOB_NAME_LABEL}"
# The trainer image for BTJs that name no spec.image; the chart sets it from its trainerImage value.
DEFAULT_IMAGE_ENV = env_name("default_trainer_image")


def default_trainer_image() -> str:
    """The operator's default trainer image: the setting's, else the built-in name (ValueError, one
    line, for a value that is not an image reference)."""
    return operator_environment().default_trainer_image or DEFAULT_IMAGE


def configure(settings: kopf.OperatorSettings) -> None:
    """Kopf settings the operator relies on."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="training.blackwell.dev")
    settings.persistence.diffbase_storage = StatuslessDiffBaseStorage(
        prefix="training.blackwell.dev", key="last-handled-configuration"
    )
    settings.posting.level = 20  # INFO and above from kopf.info/warn become Events
    settings.execution.max_workers = 16
    settings.watching.server_timeout = 600  # re-list every 10 minutes at most
    settings.networking.request_timeout = 30
    # Server-side filter of the pod watch (track-pods): only the trainer pods of BTJs, not every pod.
    settings.watching.label_selectors["v1", "pods"] = TRAINER_POD_SELECTOR
    # The same for the node watch (track-nodes): the nodes with an instance type, the only ones counted.
    settings.watching.label_selectors["v1", "nodes"] = INSTANCE_TYPE_LABEL
    # An HTTP 410 answer to a watch request restarts that watch instead of stopping the operator.
    watch_gone.install()
    # An empty JSON patch is not built from a copy of the whole object (handlers/kopf_patch.py).
    kopf_patch.install()


# The pods that hold node resources: bound to a node and not finished (filtered by the API server).
PODS_ON_NODES = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def list_pods_on_nodes(api: KubeApi) -> list[dict[str, Any]]:
    """Every namespace's pods on nodes, for the free GPUs (discovery/capacity.py keeps of each only its
    node, namespace, job-name label and GPU requests); Unreadable, in words, when the API refuses."""
    try:
        return api.list(resource_path("v1", "pods", None), field_selector=PODS_ON_NODES)
    except ApiError as exc:
        answer = f"HTTP {exc.status} {exc.reason}" if exc.status else exc.reason
        hint = "; the chart's operator.freeCapacity=true grants it" if exc.status == 403 else ""
        raise Unreadable(f"pods could not be listed in every namespace: {answer}{hint}") from exc


def build_context(api_client: Any | None = None) -> OperatorContext:
    """Context for one operator run."""
    api = KubeApi(api_client if api_client is not None else load_api_client())

    def list_nodes(label_selector: str) -> list[dict[str, Any]]:
        return api.list(resource_path("v1", "nodes", None), label_selector=label_selector)

    settings = operator_environment()
    return OperatorContext(
        api=api,
        capacity=NodeCapacityReader(
            list_nodes,
            list_pods=(lambda: list_pods_on_nodes(api)) if settings.free_capacity else None,
            job_label=JOB_NAME_LABEL,
            off=f"{env_name('free_capacity')} is off; the chart's operator.freeCapacity=true turns it on",
            ttl=settings.capacity_cache_s,
        ),
        metrics=OperatorMetrics(),
        default_image=default_trainer_image(),
        served_apis=ServedJobApis(api.get, JOB_RESOURCES),
        hyperpod_capacity=HyperPodCapacityReader(boto3_client_factory()),
    )


async def start_http(ctx: OperatorContext, bind: str) -> web.AppRunner:
    """Serve /metrics (Prometheus text) and /healthz (200 while the operator's loop answers)."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=ctx.metrics.exposition(), content_type="text/plain", charset="utf-8")

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = bind.rpartition(":")
    await web.TCPSite(runner, host or "0.0.0.0", int(port or METRICS_PORT)).start()
    return runner


def warm_up() -> None:
    """What every reconcile reads, built once before the watches start: the CRD's validator and CEL rules,
    the catalogs and the calibration (else the first burst of BTJs pays for them, in every handler thread
    at once)."""
    admission.warm_up()
    list_gpus()
    list_instances()
    list_presets()
    load_calibration()


def settle_heap() -> None:
    """For `btj run`, the operator's own process, before Kopf starts: build what every reconcile reads
    (warm_up), then take every object alive now out of the cyclic garbage collector's sight (gc.freeze).

    The modules, the CRD's validator, the CEL grammar and programs, the catalogs and the calibration live
    as long as the process (about 120,000 tracked objects); each full collection walked all of them again,
    a third of the event loop's CPU in a burst of BTJs (py-spy, `benchmarks/operator_load.py`). Frozen
    objects are still reference-counted; only cycles among them are never collected, and they have none
    to free. Not for a process that hosts the operator among other work (the tests' KopfRunner).
    """
    warm_up()
    gc.collect()
    gc.freeze()


async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Logger, **_: Any) -> None:
    """Kopf on.startup: settings, API client, metrics server, the stuck-pod, measure and resync loops."""
    configure(settings)
    await asyncio.to_thread(warm_up)
    memo.btj = build_context()
    bind = operator_environment().metrics_bind or f"0.0.0.0:{METRICS_PORT}"
    memo.btj_http = None if bind == "off" else await start_http(memo.btj, bind)
    # Operator-wide loops fed by the pod watch (not per-BTJ Kopf timers: those put Kopf's finalizer on
    # every BTJ they match). Their Events and status writes go through the API client.
    timeout, interval = stuck_pod_timeout(), measure_interval()
    memo.btj_sweep = (
        None if timeout is None else asyncio.create_task(sweep_forever(memo.btj, timeout, logger))
    )
    memo.btj_measure = (
        None if interval is None else asyncio.create_task(measure_forever(memo.btj, interval, logger))
    )
    memo.btj_resync = asyncio.create_task(resync_forever(memo.btj, resync_interval(), logger))
    elastic = elastic_interval()
    memo.btj_elastic = (
        None if elastic is None else asyncio.create_task(elastic_forever(memo.btj, elastic, logger))
    )
    logger.info(f"BlackwellTrainingJob operator started; metrics and health on {bind}")


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Kopf on.cleanup: stop the loops and the server, release connections."""
    loops = ("btj_sweep", "btj_measure", "btj_resync", "btj_elastic")
    for loop in (getattr(memo, name, None) for name in loops):
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
    runner = getattr(memo, "btj_http", None)
    if runner is not None:
        await runner.cleanup()
    ctx = getattr(memo, "btj", None)
    if ctx is not None:
        ctx.api.close()

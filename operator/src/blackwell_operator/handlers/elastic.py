"""The elastic loop: each elastic BTJ's healthy nodes against its plan; a resize re-plans and re-creates.

One loop for the operator, like the resync and stuck-pod loops (no Kopf timer per BTJ). Every
`BTJ_ELASTIC_INTERVAL_S` it reads, for each elastic BTJ the watch has shown, the nodes of its instance type
with since when each has been up or down (the node clock the node watch keeps) and, for a scale-up, the
nodes other workloads leave free (discovery/capacity.py), and lets lifecycle/elastic.py decide; a resize
writes the new plan first, then deletes the child, and the re-create path makes the new one from
status.plan (as after an out-of-memory re-plan); the written resize is the intent every later pass
finishes when a step is lost (docs/operator.md, "Intents"). The per-BTJ lock keeps it apart from the
resync loop and recreate-child.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

from blackwell_operator.admission.job import Rejected, validate_body
from blackwell_operator.calibration.cluster import frozen
from blackwell_operator.errors import SpecError
from blackwell_operator.handlers.api import ApiError, resource_path
from blackwell_operator.handlers.btjstatus import CHILD_DELETED, btj_path, write_status_logged
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import create_event
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.periodic import every
from blackwell_operator.handlers.planning import plan_within
from blackwell_operator.lifecycle.elastic import ELASTIC_PHASES, Action, Room, decide, resize_changes
from blackwell_operator.lifecycle.replan import RESIZED, correction_of, replacing_child
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.lifecycle.writers import ELASTIC_LOOP
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import PlanChange, StatusChange
from blackwell_operator.render.kinds import job_kind
from blackwell_operator.settings import operator_environment
from blackwell_operator.timefmt import format_rfc3339


def elastic_interval() -> float | None:
    """Seconds between checks (`BTJ_ELASTIC_INTERVAL_S`, default 30); None when 0 (off)."""
    return operator_environment().elastic_interval_s or None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _elastic_spec(btj: Mapping[str, Any]) -> BlackwellTrainingJobSpec | None:
    """The spec of an elastic BTJ whose stored plan runs a child (None: nothing to check)."""
    if (btj.get("metadata") or {}).get("deletionTimestamp"):
        return None
    # Read as a user may have written it: any part may be of another type (reconcile says so in status).
    spec, status = _mapping(btj.get("spec")), _mapping(btj.get("status"))
    raw = _mapping(_mapping(spec.get("cluster")).get("elastic"))
    if not raw or status.get("phase") not in ELASTIC_PHASES or not _mapping(status.get("child")).get("uid"):
        return None
    if replacing_child(status):
        return None  # a re-plan replaces the child already; the next check sees the new one
    try:
        return validate_body(btj)
    except Rejected:
        return None  # reconcile reports an invalid spec; nothing is resized from one


def check_job(
    ctx: OperatorContext, btj: Mapping[str, Any], logger: Logger, now: datetime.datetime | None = None
) -> PlanChange | None:
    """One check of one BTJ (in a worker thread): the timeline written, a resize made; the resize's
    history entry, or None."""
    spec = _elastic_spec(btj)
    if spec is None or spec.cluster.elastic is None:
        return None
    meta = btj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    # Each node's own down-since time from the node watch, never the cached LIST: samples 5 s apart cannot
    # tell a node gone all along from one that came back in between (lifecycle/node_loss.py).
    nodes = ctx.nodes.times(spec.cluster.instance_type.value)
    moment = now or datetime.datetime.now(datetime.UTC)
    made: dict[str, PlanChange] = {}

    def update(current: Mapping[str, Any]) -> StatusChange | None:
        if _landed(current, made.get("entry")):
            return None  # an earlier attempt's write landed and its answer was lost: it is done
        made.clear()
        if _elastic_spec(current) is None:
            return None  # changed meanwhile (finished, replaced, deleted): nothing to do
        read = read_status(current.get("status") or {}).status
        if read.plan is None or spec.cluster.elastic is None:
            return None
        room = _room(ctx, spec, current, read.plan.gpus_per_node, logger)
        decision = decide(spec.cluster.elastic, read.plan.nodes, nodes, read.elastic, moment, room)
        if decision.action is not Action.RESIZE and decision.elastic == read.elastic:
            return None  # nothing new to say: no write

        def replan(target: int) -> Any:
            # The same corrections the running plan was made with: only the node count changes.
            return plan_within(
                spec,
                name,
                correction=correction_of(current),
                cluster=frozen(read.plan.cluster_correction) if read.plan else None,
                schedulable=target,
            )

        try:
            change, entry = resize_changes(current, decision, replan, now=format_rfc3339(moment))
        except SpecError as exc:  # no count plans (a correction learned since): keep running as is
            decision.elastic.waiting = f"a resize was due but does not plan: {exc.message}"
            return StatusChange(elastic=decision.elastic)
        if entry is not None:
            made["entry"] = entry
        return change

    done, written = write_status_logged(
        ctx, namespace, name, update, ELASTIC_LOOP, logger, purpose="check the nodes of an elastic job"
    )
    entry = made.get("entry")
    if not done or entry is None:
        return None
    # None: the write landed on an earlier attempt whose answer was lost; read what it wrote.
    landed = written if written is not None else _read(ctx, namespace, name)
    return _resized(ctx, landed, entry, logger) if landed is not None and _landed(landed, entry) else None


# Why an elastic job with spec.queueName is never grown by the loop (docs/elastic.md, "Free nodes").
KUEUE_HOLDS_GROWTH = (
    "spec.queueName is set: Kueue admits the job's size, and the larger job would wait for its admission "
    "after the running child is deleted"
)


def _room(
    ctx: OperatorContext, spec: BlackwellTrainingJobSpec, btj: Mapping[str, Any], gpus: int, logger: Logger
) -> Room | None:
    """The nodes free for a grown job (None: the spec never grows, nothing to read). Free nodes unknown,
    or a Kueue queue named, hold the growth: the running child is never deleted for nodes it may not get."""
    if spec.cluster.elastic is None or not spec.cluster.elastic.scale_up:
        return None
    if spec.queue_name is not None:
        return Room(None, why=KUEUE_HOLDS_GROWTH)
    owner = (str(btj["metadata"].get("namespace")), str(btj["metadata"].get("name")))
    try:
        capacity = ctx.capacity.read(spec.cluster.instance_type.value, owner=owner, gpus=gpus)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot read node capacity: {exc}")
        return Room(None, why="node capacity could not be read")
    if capacity.free is None:
        return Room(None, why=f"free GPUs not read ({capacity.unread})")
    return Room(capacity.free, capacity.held)


def _landed(btj: Mapping[str, Any], entry: PlanChange | None) -> bool:
    """Whether the BTJ's status holds this check's resize (its planHistory entry, by time and child)."""
    if entry is None:
        return False
    history = read_status(btj.get("status") or {}).status.plan_history
    return any(e.at == entry.at and e.failed_child_uid == entry.failed_child_uid for e in history)


def _read(ctx: OperatorContext, namespace: str, name: str) -> Mapping[str, Any] | None:
    try:
        return ctx.api.get(btj_path(namespace, name))
    except ApiError as exc:  # the resync loop finishes the resize (lifecycle/convergence.py)
        ctx.metrics.record_error(exc.metric_reason)
        return None


def _resized(ctx: OperatorContext, btj: Mapping[str, Any], entry: PlanChange, logger: Logger) -> PlanChange:
    """After the resize is written: the metric, the Event, and the child deleted for its re-create."""
    direction = "grow" if (entry.nodes_after or 0) > (entry.nodes_before or 0) else "shrink"
    ctx.metrics.resizes.labels(direction=direction).inc()
    _event(ctx, btj, RESIZED, entry.message, warning=direction == "shrink", logger=logger)
    logger.info(f"{btj['metadata']['namespace']}/{btj['metadata']['name']}: {entry.message}")
    _delete_child(ctx, btj, logger)
    return entry


def _delete_child(ctx: OperatorContext, btj: Mapping[str, Any], logger: Logger) -> None:
    """Delete the child a resize replaces (its uid: never a newer one of the same name). A failure is
    logged only: the resize's planHistory entry is its intent, and the resync loop (or a restarted
    operator's first pass) deletes the stale child and creates the planned one (lifecycle/child_apply.py)."""
    child = (btj.get("status") or {}).get("child") or {}
    kind = job_kind(child.get("kind"))
    if kind is None or not child.get("name"):
        return
    path = resource_path(kind.api_version, kind.plural, btj["metadata"]["namespace"], child["name"])
    try:
        if ctx.api.delete(path, uid=child.get("uid")):
            what = (
                f"Deleted {kind.kind} {child['name']}: the job is resized; it is re-created with the new plan"
            )
            _event(ctx, btj, CHILD_DELETED, f"{what} from the last checkpoint", warning=False, logger=logger)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        if exc.status != 409:
            # A warning, as the docstring says why: the resize is not lost.
            logger.warning(
                f"Cannot delete {kind.kind} {child['name']} for a resize yet, a later pass does: {exc}"
            )


def _event(
    ctx: OperatorContext, btj: Mapping[str, Any], reason: str, message: str, *, warning: bool, logger: Logger
) -> None:
    """An Event through the API (this loop runs outside Kopf's handlers); best effort."""
    try:
        create_event(ctx.api, btj, reason, message, warning=warning)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot post the {reason} Event on {btj['metadata'].get('name')}: {exc}")


def check_all(ctx: OperatorContext, logger: Logger) -> int:
    """One round over the elastic BTJs the watch has shown; how many were resized."""
    resized = 0
    for btj in list(ctx.known_btjs().values()):
        try:
            resized += _check_one(ctx, btj, logger)
        except Exception as exc:  # one BTJ's surprise must not cost the others their resize
            ctx.metrics.record_error("InternalError")
            meta = _mapping(btj.get("metadata"))
            logger.warning(f"Elastic check of {meta.get('namespace')}/{meta.get('name')} failed: {exc!r}")
    return resized


def _check_one(ctx: OperatorContext, btj: Mapping[str, Any], logger: Logger) -> int:
    """1 when this BTJ was resized."""
    if _elastic_spec(btj) is None:
        return 0
    uid = str(btj["metadata"].get("uid") or "")
    with ctx.recreate_lock(uid):
        try:
            current = ctx.api.get(btj_path(btj["metadata"]["namespace"], btj["metadata"]["name"]))
        except ApiError as exc:
            ctx.metrics.record_error(exc.metric_reason)
            return 0
        if current is None or current["metadata"].get("uid") != uid:
            return 0
        return int(check_job(ctx, current, logger) is not None)


async def elastic_forever(ctx: OperatorContext, interval_s: float, logger: Logger) -> None:
    """The loop, for the operator's lifetime."""
    await every(interval_s, lambda: asyncio.to_thread(check_all, ctx, logger), logger, "Elastic check")

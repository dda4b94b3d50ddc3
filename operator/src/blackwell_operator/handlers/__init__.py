"""Kopf handlers of the BlackwellTrainingJob operator; importing this module registers them."""

from __future__ import annotations

import time
from typing import Any

import kopf

from blackwell_operator.applabels import MANAGED_BY_LABEL, MANAGER
from blackwell_operator.handlers import runtime
from blackwell_operator.handlers.children import on_child_event
from blackwell_operator.handlers.context import CHILDREN, OperatorContext
from blackwell_operator.handlers.elastic import elastic_interval
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.measure import measure_interval
from blackwell_operator.handlers.pods import on_pod_event
from blackwell_operator.handlers.reconcile import Reconciler
from blackwell_operator.handlers.resync import resync_interval
from blackwell_operator.handlers.stuck import stuck_pod_timeout
from blackwell_operator.lifecycle.convergence import wants_child_back
from blackwell_operator.lifecycle.status_read import read_keys
from blackwell_operator.models.spec import API_GROUP, API_VERSION, PLURAL
from blackwell_operator.models.status import Phase
from blackwell_operator.nodelabels import INSTANCE_TYPE_LABEL
from blackwell_operator.render.kinds import JOB_KINDS
from blackwell_operator.render.labels import JOB_NAME_LABEL


def _ctx(memo: kopf.Memo) -> OperatorContext:
    ctx: OperatorContext = memo.btj
    return ctx


def reconcile_btj(
    body: kopf.Body, memo: kopf.Memo, retry: int, logger: Logger, reason: str, **_: Any
) -> None:
    """on.resume / on.create / on.update(spec): plan, render, create-or-patch, status.

    A create or update pass of a generation this process has reconciled already is not done again; a
    resume always runs (it repairs what changed while the operator was down).
    """
    skip_done = reason in (kopf.Reason.CREATE, kopf.Reason.UPDATE)
    Reconciler(_ctx(memo)).reconcile(body, retry=retry, logger=logger, skip_done=skip_done)


def reconcile_labels(body: kopf.Body, memo: kopf.Memo, retry: int, logger: Logger, **_: Any) -> None:
    """on.update(metadata.labels): the whole pass, which brings the children's labels to the BTJ's (only
    their labels when the job runs or has finished). Never skipped as done: a label edit leaves the
    generation as it was, so "this generation was reconciled" says nothing about the labels."""
    Reconciler(_ctx(memo)).reconcile(body, retry=retry, logger=logger)


async def track_btj(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """on.event for BTJs: keeps btj_operator_jobs{phase} and the resync loop's view current (async: no
    thread hop for a dict update)."""
    uid = body.get("metadata", {}).get("uid", "")
    stored = read_keys(body.get("status"), "phase").status  # on every BTJ event: not the whole status
    phase = None if type == "DELETED" else (stored.phase or Phase.PENDING).value
    _ctx(memo).metrics.observe_job(uid, phase)
    if type == "DELETED":
        _ctx(memo).forget_btj(uid)  # its lock and its place in the resync loop, kept for its lifetime
    else:
        _ctx(memo).note_btj(dict(body))


def wants_child_back_filter(type: str | None, body: kopf.Body, **_: Any) -> bool:
    """Kopf `when` filter of recreate-child (cheap: runs on every BTJ event)."""
    return type != "DELETED" and wants_child_back(body)


def recreate_child(body: kopf.Body, memo: kopf.Memo, logger: Logger, **_: Any) -> None:
    """on.event for a BTJ whose child was deleted before the job finished: the reconcile path re-creates it.

    An event handler of the BTJ runs in that BTJ's Kopf worker, one event at a time with the reconcile
    handlers; the resync loop takes the same per-BTJ lock. Reconcile GETs the child first (no duplicate
    when it exists again) and honours dryRun, an invalid spec and a BTJ being deleted; what it cannot
    finish now, the resync loop finishes.
    """
    Reconciler(_ctx(memo)).reconcile_now(body, logger=logger)


def track_child(type: str | None, body: kopf.Body, memo: kopf.Memo, logger: Logger, **_: Any) -> None:
    """on.event for the child kinds we label: mirror their status onto the owner BTJ (an event whose write
    failed is kept for the resync loop: a deleted child's end sends no other)."""
    ctx = _ctx(memo)
    done = on_child_event(ctx, type, body, logger)
    ctx.note_unrecorded(
        CHILDREN, str(body.get("metadata", {}).get("uid") or ""), None if done else (type, dict(body))
    )


def track_pod(type: str | None, body: kopf.Body, memo: kopf.Memo, logger: Logger, **_: Any) -> None:
    """on.event for trainer pods: a failed trainer container becomes the owner BTJ's status.lastFailure."""
    on_pod_event(_ctx(memo), type, body, logger)


async def track_node(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """on.event for nodes with an instance type: each change starts or keeps the node's up or down clock,
    which says when an elastic job has lost it (async: no thread hop for a dict update)."""
    at = time.time()
    if type == "DELETED":
        _ctx(memo).nodes.deleted(body, at)
    else:
        _ctx(memo).nodes.observe(body, at)


def register(registry: kopf.OperatorRegistry) -> None:
    """Register every handler on `registry` (tests pass a fresh one per operator run)."""
    kopf.on.startup(registry=registry, id="btj-startup")(runtime.startup)
    kopf.on.cleanup(registry=registry, id="btj-cleanup")(runtime.cleanup)
    btj = (API_GROUP, API_VERSION, PLURAL)
    kopf.on.resume(*btj, registry=registry, id="reconcile")(reconcile_btj)
    kopf.on.create(*btj, registry=registry, id="reconcile")(reconcile_btj)
    kopf.on.update(*btj, field="spec", registry=registry, id="reconcile")(reconcile_btj)
    kopf.on.update(*btj, field="metadata.labels", registry=registry, id="reconcile-labels")(reconcile_labels)
    kopf.on.event(*btj, registry=registry, id="track-phase")(track_btj)
    kopf.on.event(*btj, registry=registry, id="recreate-child", when=wants_child_back_filter)(recreate_child)
    # A bad BTJ_STUCK_POD_TIMEOUT_S or BTJ_MEASURE_INTERVAL_S stops the operator at start, with one line.
    stuck_pod_timeout()
    measure_interval()
    resync_interval()  # a bad BTJ_CHILD_RETRY_INTERVAL_S stops the operator at start too
    elastic_interval()
    for kind in JOB_KINDS.values():
        # A silent event handler: it writes nothing onto the child (update handlers would add Kopf
        # annotations to the training operator's objects).
        kopf.on.event(
            kind.group,
            kind.version,
            kind.plural,
            labels={MANAGED_BY_LABEL: MANAGER},
            registry=registry,
            id=f"track-{kind.plural}",
        )(track_child)
    # Silent too (no Kopf annotations on pods). The API server filters the watch by the same labels
    # (runtime.configure), so the operator never receives the cluster's other pods.
    # Every change of a node, not a sample of them: a node that came back between two samples would look
    # gone all along (lifecycle/node_loss.py). Silent: nothing is written onto nodes.
    kopf.on.event(
        "v1", "nodes", labels={INSTANCE_TYPE_LABEL: kopf.PRESENT}, registry=registry, id="track-nodes"
    )(track_node)
    kopf.on.event(
        "v1",
        "pods",
        labels={MANAGED_BY_LABEL: MANAGER, JOB_NAME_LABEL: kopf.PRESENT},
        registry=registry,
        id="track-pods",
    )(track_pod)


register(kopf.get_default_registry())

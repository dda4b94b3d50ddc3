"""The spec reconciler: validate, plan, render, create-or-patch the children; one status write per pass.

A pass reads the BTJ once (its status typed), decides, making the child calls that decision needs
(handlers/child_calls.py), and gathers everything into one lifecycle.outcome.PassOutcome; `_apply_outcome`
writes the status and posts the Events once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import kopf

from blackwell_operator.admission.job import Rejected, validate_body
from blackwell_operator.calibration.cluster import Corrector, frozen
from blackwell_operator.discovery.aws import AwsCapacity
from blackwell_operator.discovery.capacity import Capacity
from blackwell_operator.errors import SpecError
from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.btjstatus import btj_path, write_status
from blackwell_operator.handlers.child_calls import ChildCalls, ChildConflict
from blackwell_operator.handlers.cluster_calibration import pooled, read_cluster_calibration
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import adopt_children, create_event, post_event
from blackwell_operator.handlers.finalizer import release, with_finalizer
from blackwell_operator.handlers.planning import plan_within
from blackwell_operator.handlers.preflight import check_references
from blackwell_operator.lifecycle import outcome as outcomes
from blackwell_operator.lifecycle.backends import (
    CONCRETE,
    backend_of_kind,
    choose_backend,
    none_served_message,
    with_backend,
)
from blackwell_operator.lifecycle.child_apply import (
    CannotChange,
    Create,
    FinishedChildGone,
    NameConflict,
    Notice,
    PatchInPlace,
    PreviousDeleting,
    UpToDate,
    Wanted,
    decide,
    refusal,
    resume_note,
)
from blackwell_operator.lifecycle.convergence import needs_reconcile
from blackwell_operator.lifecycle.elastic import stored_choice
from blackwell_operator.lifecycle.outcome import PassOutcome, SeenChild
from blackwell_operator.lifecycle.probe import with_probe_result
from blackwell_operator.lifecycle.replan import correction_of
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.lifecycle.writers import RECONCILE
from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.models.status import BlackwellTrainingJobStatus, StatusChange
from blackwell_operator.render import render_children
from blackwell_operator.render.children import labelled_hash
from blackwell_operator.render.kinds import JOB_KINDS, ChildKind
from blackwell_operator.render.pod import resources
from blackwell_operator.timefmt import now_rfc3339
from blackwell_trainer.config import Plan

# Where each backend's job lives in the API (render.kinds.JOB_KINDS, under the name the handlers use).
CHILD_KINDS: dict[Backend, ChildKind] = JOB_KINDS
_LOG = logging.getLogger(__name__)


def parse_spec(body: Mapping[str, Any]) -> BlackwellTrainingJobSpec:
    """The spec judged as the API server judges it (admission.job); a refusal names the first field."""
    try:
        return validate_body(body)
    except Rejected as exc:
        where, _, problem = exc.lines[0].partition(": ")
        more = f" (and {len(exc.lines) - 1} more)" if len(exc.lines) > 1 else ""
        raise SpecError(
            where, problem + more, "correct the field; `btj plan job.yaml` checks it offline"
        ) from exc


def _retry_delay(retry: int) -> float:
    # Exponential backoff from 0.25 s to a minute: quick for a blip, gentle for an outage.
    return float(min(0.25 * 2**retry, 60.0))


class Reconciler:
    """Reconciles one BTJ's spec per call; stateless between calls (everything lives in the API).

    `direct_events`: post Events through the API (for the resync loop, which runs outside Kopf's
    per-object tasks and so has no Kopf event queue).
    """

    def __init__(self, ctx: OperatorContext, *, direct_events: bool = False) -> None:
        self.ctx = ctx
        self.api: KubeApi = ctx.api
        self.direct_events = direct_events
        self._logger: Any = None

    # ----- entry points -----

    def reconcile(self, body: Mapping[str, Any], *, retry: int, logger: Any, skip_done: bool = False) -> None:
        """Kopf's handler path: one pass; raises kopf.TemporaryError for what a later retry can fix.

        skip_done: the pass does nothing when a pass of this process has reconciled the BTJ's current
        generation to its end and the BTJ has converged. In a burst Kopf runs a create handler twice
        when its own annotation patch reaches it more than `consistency_timeout` late, and reaches some
        create events only after the resync loop has done the pass: the same pass twice would plan,
        render and read the child twice.
        """
        with self.ctx.recreate_lock(str(body.get("metadata", {}).get("uid", ""))):
            try:
                self._guarded(body, logger, skip_done=skip_done)
            except ApiError as exc:
                raise kopf.TemporaryError(
                    f"API call failed, retrying: {exc}", delay=_retry_delay(retry)
                ) from exc
            except kopf.TemporaryError:
                raise
            except Exception as exc:  # a bug: counted and logged in _guarded; keep serving other BTJs
                raise kopf.TemporaryError(
                    f"internal error, retrying: {exc!r}", delay=_retry_delay(retry + 4)
                ) from exc

    def reconcile_now(
        self,
        body: Mapping[str, Any],
        *,
        logger: Any,
        attempts: int = retrying.ATTEMPTS,
        wait: bool = True,
    ) -> bool:
        """A pass for callers Kopf does not retry (the recreate-child event handler, the resync loop).

        One pass per BTJ at a time; with `wait=False` (the loop) a call finding another in progress
        does nothing, since that one is already at work. What the retry policy cannot fix is logged in
        one line and left to the resync loop. Returns whether the pass ran to its end.
        """
        lock = self.ctx.recreate_lock(str(body.get("metadata", {}).get("uid", "")))
        if not lock.acquire(blocking=wait):
            logger.debug("A reconcile of this BlackwellTrainingJob is already in progress")
            return False
        try:
            self._guarded(body, logger, attempts=attempts)
            return True
        except (ApiError, kopf.TemporaryError) as exc:
            logger.warning(f"Reconcile failed, the resync loop tries again: {exc}")
        except Exception as exc:  # counted and logged with its traceback in _guarded
            logger.warning(f"Reconcile failed, the resync loop tries again: {exc!r}")
        finally:
            lock.release()
        return False

    def _guarded(
        self,
        body: Mapping[str, Any],
        logger: Any,
        *,
        attempts: int = retrying.ATTEMPTS,
        skip_done: bool = False,
    ) -> None:
        """One pass under the retry policy (a pass is idempotent: create-or-get, conditional writes)."""
        started = time.perf_counter()
        self._logger = logger
        meta = body.get("metadata", {})
        what = f"reconcile of BlackwellTrainingJob {meta.get('namespace')}/{meta.get('name')}"
        try:
            retrying.call(what, logger, lambda: self._reconcile(body, logger, skip_done), attempts=attempts)
        except ApiError as exc:
            self.ctx.metrics.record_error(exc.metric_reason)
            raise
        except kopf.TemporaryError:  # a pass that says when to try again (no job API served yet)
            raise
        except Exception:
            self.ctx.metrics.record_error("InternalError")
            logger.exception("Unexpected error while reconciling")
            raise
        finally:
            self.ctx.metrics.reconcile_duration.observe(time.perf_counter() - started)

    def _event(self, obj: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        if not self.direct_events:
            post_event(obj, reason=reason, message=message, warning=warning)
            return
        try:
            create_event(self.api, obj, reason, message, warning=warning)
        except ApiError as exc:  # an Event is a courtesy: the condition says the same
            self.ctx.metrics.record_error(exc.metric_reason)
            if self._logger is not None:
                self._logger.warning(f"Cannot post Event {reason}: {exc}")

    def _reconcile(self, body: Mapping[str, Any], logger: Any, skip_done: bool = False) -> None:
        """One pass: read the BTJ as it is now, decide (making the child calls), apply the outcome once."""
        meta = body["metadata"]
        # The event that triggered this pass may be stale (the BTJ changed, or was deleted meanwhile): work
        # from the BTJ as it is now, and create nothing for one that is gone or going.
        current = self.api.get(btj_path(meta["namespace"], meta["name"]))
        if (
            current is None
            or current["metadata"].get("uid") != meta["uid"]
            or current["metadata"].get("deletionTimestamp")
        ):
            logger.info("The BlackwellTrainingJob is gone or going; nothing to create.")
            return
        if skip_done and self._done(current):
            logger.info("This generation has been reconciled already; nothing to do.")
            return
        stored = read_status(current.get("status")).status  # the one typed read of this pass
        self._apply_outcome(current, stored, self._decide(current, stored, logger))
        # Kopf's create or update handler, run again for this generation, has nothing left to do.
        self.ctx.note_reconciled(str(meta["uid"]), int(current["metadata"].get("generation") or 1))

    def _done(self, current: Mapping[str, Any]) -> bool:
        """Whether a pass of this process reconciled this generation to its end and the BTJ converged."""
        meta = current["metadata"]
        generation = int(meta.get("generation") or 1)
        return self.ctx.reconciled_at(str(meta.get("uid"))) == generation and needs_reconcile(current) is None

    def _decide(
        self, body: Mapping[str, Any], stored: BlackwellTrainingJobStatus, logger: Any
    ) -> PassOutcome:
        """Validate, plan, read capacity, pick the backend; then the children (`_children`)."""
        meta = body["metadata"]
        generation = int(meta.get("generation") or 1)
        try:
            spec = parse_spec(body)
            # What out-of-memory runs of this spec taught (status.memoryCorrection, lifecycle/replan.py):
            # also after an operator restart, the plan is the corrected one that runs.
            correction = correction_of(body)
            cluster = self._cluster_corrector(stored, spec, generation, str(meta.get("namespace") or ""))
            # An elastic job keeps the count its stored plan chose; its first plan takes the healthy nodes.
            kept = stored_choice(body) if spec.cluster.elastic is not None else None
            schedulable = self._schedulable(spec, logger) if spec.cluster.elastic and not kept else None
            plan = plan_within(
                spec,
                meta["name"],
                correction=correction,
                cluster=cluster,
                schedulable=schedulable,
                current=kept,
            )
        except SpecError as exc:
            return outcomes.invalid(generation, exc.reason, exc.message)
        # The choice this generation's probe made (status.probe): the plan ConfigMap keeps it for a restart.
        plan = with_probe_result(plan, stored, generation)
        outcome = outcomes.planned(
            plan,
            generation,
            replanned=correction is not None,
            nodes=self._capacity(spec, plan, logger),
            aws=self._aws_capacity(spec, logger),
            needed=plan.nodes,  # an elastic job's count may differ from spec.cluster.nodes
            queue_name=spec.queue_name,
        )
        backend = self._backend(stored, spec)
        outcome = replace(outcome, backend=backend)
        if spec.dry_run:
            return outcomes.dry_run(outcome)
        if backend is None:
            return outcomes.no_job_api(outcome, none_served_message(spec))
        return self._children(body, stored, with_backend(spec, backend), plan, outcome, logger)

    def _children(
        self,
        body: Mapping[str, Any],
        stored: BlackwellTrainingJobStatus,
        spec: BlackwellTrainingJobSpec,
        plan: Plan,
        outcome: PassOutcome,
        logger: Any,
    ) -> PassOutcome:
        """Render the children, check what their pods name, then create or patch them (`_apply`)."""
        meta = body["metadata"]
        kind = CHILD_KINDS[spec.backend]
        labels = meta.get("labels") or {}
        config_map, *supporting, job = render_children(
            meta["name"], meta["namespace"], spec, plan, labels=labels, default_image=self.ctx.default_image
        )
        earlier_hash = labelled_hash(job)  # before the owner and the finalizer, as the render was hashed
        adopt_children([config_map, *supporting, job], body)
        # The child keeps its final status until this operator has recorded it (handlers/children.py):
        # a finished job deleted while the operator is down (ttlSecondsAfterFinished: 0) is then still
        # seen finished, and never run again.
        with_finalizer(job)
        # What the pods name must exist before anything is made (handlers/preflight.py): a missing
        # ServiceAccount holds the create, and the resync loop looks again; a missing pull Secret warns.
        job_path = resource_path(kind.api_version, kind.plural, meta["namespace"], job["metadata"]["name"])
        preflight = check_references(self.api, body, spec, job_path, logger)
        warnings = tuple(
            Notice(c.reason, c.message, warning=True, once=c.type)
            for c in preflight.conditions
            if c.status == "False"
        )
        outcome = outcome.adding(*preflight.conditions, events=warnings)
        if preflight.blocked is not None:
            return outcomes.waiting_for_account(outcome, preflight.blocked)
        wanted = Wanted(
            kind=kind,
            job=job,
            config_map=config_map["metadata"]["name"],
            owner_uid=meta["uid"],
            generation=outcome.generation,
            plan_summary=outcomes.plan_summary(plan),
            resume_note=resume_note(spec.training.checkpoint.path),
            earlier_hash=earlier_hash,
        )
        supporting = [config_map, *supporting]
        return self._stopping(outcome, lambda: self._apply(body, stored, wanted, supporting, outcome))

    def _apply_outcome(
        self, body: Mapping[str, Any], before: BlackwellTrainingJobStatus, outcome: PassOutcome
    ) -> None:
        """Post the pass's Events, then write its status once; `requeue` raises kopf.TemporaryError after,
        so that Kopf looks again then.

        The Events go first: once the status says a cause, no later pass posts its Event again, so an
        operator stopped right after the write (Kopf posts its queue asynchronously) must have queued them.
        A write that fails retries the pass, which may post an Event twice; never none.
        """
        meta = body["metadata"]
        if outcome.error is not None:
            self.ctx.metrics.record_error(outcome.error)
        if outcome.recreated:
            self.ctx.metrics.children_recreated.inc()
        for notice in outcomes.events_to_post(outcome, before):
            self._event(body, notice.reason, notice.message, warning=notice.warning)

        def update(current: Mapping[str, Any]) -> StatusChange:
            stored = read_status(current.get("status")).status
            generation = int((current.get("metadata") or {}).get("generation") or outcome.generation)
            return outcomes.status_change(outcome, stored, now_rfc3339(), current_generation=generation)

        # The BTJ this pass read is the first attempt's: a write since then makes it a conflict, re-read.
        write_status(self.api, meta["namespace"], meta["name"], update, RECONCILE, self._logger, read=body)
        if outcome.requeue is not None:
            raise kopf.TemporaryError(outcome.requeue.message, delay=outcome.requeue.after_s)

    def _cluster_corrector(
        self,
        stored: BlackwellTrainingJobStatus,
        spec: BlackwellTrainingJobSpec,
        generation: int,
        namespace: str,
    ) -> Corrector | None:
        """What this cluster measured, for the plan: the factors already planned with when this generation
        was planned before (a resync or a re-created child never re-plans a running job differently), else
        the operator's cluster calibration now."""
        # An unreadable stored plan (lifecycle/status_read.py) is planned anew, with the calibration now.
        if stored.plan is not None and stored.observed_generation == generation:
            return frozen(stored.plan.cluster_correction)
        calibration = read_cluster_calibration(self.ctx, self._logger or _LOG)
        if calibration is None:
            return None
        # This namespace's own runs only, unless the operator pools them (each namespace capped).
        return calibration.corrector(spec.cluster.instance_type, namespace, pooled=pooled())

    def _aws_capacity(self, spec: BlackwellTrainingJobSpec, logger: Any) -> AwsCapacity | None:
        """What AWS says about the named HyperPod cluster (None: no cluster named, or no reader)."""
        reader, cluster = self.ctx.hyperpod_capacity, spec.cluster.hyperpod_cluster
        if reader is None or cluster is None:
            return None
        answer = reader.read(
            cluster, spec.cluster.instance_type.value, spec.cluster.nodes, spec.cluster.training_plan
        )
        if not answer.known:
            logger.warning(answer.message)  # advisory: the job goes on
        return answer

    # ----- backend -----

    def _backend(self, stored: BlackwellTrainingJobStatus, spec: BlackwellTrainingJobSpec) -> Backend | None:
        """spec.backend, or for auto: the kind of the child it has, else the first kind the cluster serves.

        A recorded child's kind wins over discovery, so that a job API installed later never gives a BTJ
        a second child of another kind.
        """
        if spec.backend != Backend.AUTO:
            return spec.backend
        recorded = backend_of_kind(stored.child.kind if stored.child is not None else None)
        if recorded is not None:
            return recorded
        served = self.ctx.served_apis.served() if self.ctx.served_apis is not None else frozenset(CONCRETE)
        return choose_backend(spec, served)

    def _schedulable(self, spec: BlackwellTrainingJobSpec, logger: Any) -> int | None:
        """Healthy schedulable nodes of the spec's instance type (None when they cannot be read)."""
        try:
            return self.ctx.capacity.read(spec.cluster.instance_type.value).schedulable
        except ApiError as exc:  # planned for spec.cluster.nodes then, and the plan says so
            logger.warning(f"Cannot read node capacity: {exc}")
            return None

    def _capacity(self, spec: BlackwellTrainingJobSpec, plan: Plan, logger: Any) -> Capacity | None:
        try:
            # One trainer pod's requests against each node's allocatable: a node that cannot hold it
            # (no EFA device plugin, no hugepages) would leave the worker Pending with no other sign.
            requests = resources(spec, plan)["requests"]
            return self.ctx.capacity.read(spec.cluster.instance_type.value, requests)
        except ApiError as exc:  # capacity is advisory: never block the job on it
            logger.warning(f"Cannot read node capacity: {exc}")
            return None

    # ----- children -----

    def _stopping(self, outcome: PassOutcome, calls: Callable[[], PassOutcome]) -> PassOutcome:
        """`calls()`; or, when a name conflict or an API server refusal stops them, `outcome` (what the
        pass knew before them) ending on it."""
        try:
            return calls()
        except ChildConflict as exc:
            return outcomes.name_conflict(outcome, str(exc))
        except ApiError as exc:
            if not retrying.refused(exc):
                raise
            return outcomes.refused(outcome, refusal(exc.action or "a call", exc.creating, str(exc)))

    def _status_after_child(self, body: Mapping[str, Any]) -> BlackwellTrainingJobStatus:
        """The BTJ's status read again, after its child was found gone: a watcher that recorded the child's
        end (finished, a permanent error) did so before it let the child go, so this read sees it.

        A spec edited since this pass read the BTJ makes the pass start again from the BTJ as it is now:
        a finished job runs again only on an edit made after its child's deletion was recorded
        (child_record.runs_again), and this pass's older generation would read as one.
        """
        meta = body["metadata"]
        fresh = self.api.get(btj_path(meta["namespace"], meta["name"])) or {}
        fresh_meta = fresh.get("metadata") or {}
        if (
            fresh_meta.get("uid") != meta["uid"]
            or fresh_meta.get("deletionTimestamp")
            or fresh_meta.get("generation") != meta.get("generation")
        ):
            raise ApiError(409, "Conflict", "the BlackwellTrainingJob changed while it was reconciled")
        return read_status(fresh.get("status")).status

    def _apply(
        self,
        body: Mapping[str, Any],
        stored: BlackwellTrainingJobStatus,
        wanted: Wanted,
        supporting: list[dict[str, Any]],
        outcome: PassOutcome,
    ) -> PassOutcome:
        """Read the child, decide (lifecycle/child_apply.py), make the decision's calls and add its effects
        to the pass's outcome."""
        calls = ChildCalls(self.api, wanted.owner_uid, self._logger)
        kind = wanted.kind
        job_path = resource_path(kind.api_version, kind.plural, body["metadata"]["namespace"], wanted.name)
        existing = calls.read(kind, job_path, wanted.name)
        decision = decide(wanted, existing, self._status_after_child(body) if existing is None else stored)
        match decision:
            case NameConflict():
                raise ChildConflict(decision.message)
            case PreviousDeleting():
                if decision.release and existing is not None:
                    release(self.api, existing, kind.plural, self._logger or _LOG)
                raise ApiError(409, "Conflict", decision.message)
            case FinishedChildGone():
                calls.drop_supporting(supporting)
                return outcome.recording(decision.effects)
            case Create():
                created, child = calls.create_together(kind, dict(wanted.job), supporting)
                seen = SeenChild(kind, child, wanted.config_map)
                return replace(outcome, child=seen).recording(decision.made(created, seen.uid))
        assert existing is not None  # a Found decision is made from the child read
        found = replace(outcome, child=SeenChild(kind, existing, wanted.config_map)).adding(decision.found)
        return self._stopping(found, lambda: self._update(calls, job_path, supporting, decision, found))

    def _update(
        self,
        calls: ChildCalls,
        job_path: str,
        supporting: list[dict[str, Any]],
        decision: UpToDate | PatchInPlace | CannotChange,
        outcome: PassOutcome,
    ) -> PassOutcome:
        """The calls for a child that exists: hold it, bring its labels to the BTJ's, bring its supporting
        objects and (before it starts) the job to this render."""
        assert outcome.child is not None
        child = outcome.child
        name = str(child.obj["metadata"]["name"])
        if decision.hold:
            child = replace(child, obj=calls.hold(job_path, child.obj))
        if decision.relabel is not None:
            child = replace(child, obj=calls.relabel(child.kind, job_path, name, decision.relabel))
        if isinstance(decision, UpToDate | PatchInPlace):
            calls.ensure_supporting_of(job_path, child.obj, supporting)
        else:  # what a running or finished job reads keeps describing it; only its labels follow the BTJ
            calls.relabel_supporting(supporting)
        if isinstance(decision, PatchInPlace):
            child = replace(child, obj=calls.patch(child.kind, job_path, name, decision.patch))
        return replace(outcome, child=child).recording(decision.effects)

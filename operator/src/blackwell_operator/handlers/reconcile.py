"""The spec reconciler: validate, plan, render, create-or-patch the children; one status write per pass.

A pass reads the BTJ once, its status parsed once, and its inputs into one value
(handlers/pass_inputs.py); it decides from them, making the child calls that decision needs
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

from blackwell_operator.errors import SpecError
from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.btjstatus import CHILD_DELETED, btj_path, write_status
from blackwell_operator.handlers.child_calls import ChildCalls, ChildConflict, update_child
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import adopt_children, create_event, post_event
from blackwell_operator.handlers.finalizer import release, with_finalizer
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.pass_decision import decide_pass, plan_of
from blackwell_operator.handlers.pass_inputs import PassInputs, read_inputs, read_surroundings
from blackwell_operator.handlers.preflight import check_references
from blackwell_operator.lifecycle import outcome as outcomes
from blackwell_operator.lifecycle.child_apply import (
    Create,
    FinishedChildGone,
    NameConflict,
    Notice,
    PreviousDeleting,
    StaleChild,
    Wanted,
    decide,
    refusal,
    resume_note,
)
from blackwell_operator.lifecycle.convergence import needs_reconcile
from blackwell_operator.lifecycle.outcome import PassOutcome, SeenChild
from blackwell_operator.lifecycle.status_read import ReadBtj, read_btj, read_status
from blackwell_operator.lifecycle.writers import RECONCILE
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import BlackwellTrainingJobStatus, StatusChange
from blackwell_operator.render import render_children
from blackwell_operator.render.children import labelled_hash
from blackwell_operator.render.kinds import JOB_KINDS
from blackwell_operator.timefmt import now_rfc3339
from blackwell_trainer.plan.config import Plan

_LOG = logging.getLogger(__name__)


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
        self._logger: Logger | None = None

    # ----- entry points -----

    def reconcile(
        self, body: Mapping[str, Any], *, retry: int, logger: Logger, skip_done: bool = False
    ) -> None:
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
        logger: Logger,
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
        logger: Logger,
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

    def _reconcile(self, body: Mapping[str, Any], logger: Logger, skip_done: bool = False) -> None:
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
        read = read_btj(current)  # the one parse of its status (tests/operator/test_one_read_per_pass.py)
        if skip_done and self._done(read):
            logger.info("This generation has been reconciled already; nothing to do.")
            return
        try:
            inputs = read_inputs(self.ctx, read, logger)
        except SpecError as exc:
            outcome = outcomes.invalid(read.generation, exc.reason, exc.message)
        else:
            outcome = self._planned_pass(inputs, logger)
        self._apply_outcome(read, outcome)
        # Kopf's create or update handler, run again for this generation, has nothing left to do.
        self.ctx.note_reconciled(str(meta["uid"]), read.generation)

    def _done(self, read: ReadBtj) -> bool:
        """Whether a pass of this process reconciled this generation to its end and the BTJ converged."""
        uid = str(read.body["metadata"].get("uid"))
        done = self.ctx.reconciled_at(uid) == read.generation
        return done and needs_reconcile(read.body, read.status) is None

    def _planned_pass(self, inputs: PassInputs, logger: Logger) -> PassOutcome:
        """Plan, read what the cluster offers the plan, decide (handlers/pass_decision.py: no API call),
        then make the children the decision names (`_children`)."""
        plan = plan_of(inputs)
        if isinstance(plan, PassOutcome):
            return plan
        outcome, spec = decide_pass(inputs, plan, read_surroundings(self.ctx, inputs, plan, logger))
        if spec is None:
            return outcome
        return self._children(inputs.read, spec, plan, outcome, logger)

    def _children(
        self,
        read: ReadBtj,
        spec: BlackwellTrainingJobSpec,
        plan: Plan,
        outcome: PassOutcome,
        logger: Logger,
    ) -> PassOutcome:
        """Render the children, check what their pods name, then create or patch them (`_apply`)."""
        body = read.body
        meta = body["metadata"]
        kind = JOB_KINDS[spec.backend]
        labels = meta.get("labels") or {}
        config_map, *supporting, job = render_children(
            meta["name"],
            meta["namespace"],
            spec,
            plan,
            labels=labels,
            default_image=self.ctx.default_image,
            uid=str(meta["uid"]),
        )
        earlier_hash = labelled_hash(job)  # before the owner and the finalizer, as the render was hashed
        adopt_children([config_map, *supporting, job], body)
        # The child keeps its final status until this operator has recorded it (handlers/children.py):
        # a finished job deleted while the operator is down (ttlSecondsAfterFinished: 0) is then still
        # seen finished, and never run again.
        with_finalizer(job)
        # What the pods name before anything is made or changed (handlers/preflight.py): a ServiceAccount
        # missing or not theirs to use holds the child (the resync loop looks again); a pull Secret warns.
        job_path = resource_path(kind.api_version, kind.plural, meta["namespace"], job["metadata"]["name"])
        preflight = check_references(
            self.api, body, spec, job, job_path, logger, stored=read.status, renders=(earlier_hash,)
        )
        warnings = tuple(
            Notice(c.reason, c.message, warning=True, once=c.type)
            for c in preflight.conditions
            if c.status == "False"
        )
        outcome = outcome.adding(*preflight.conditions, events=warnings)
        if preflight.blocked is not None:
            return outcomes.waiting_for_account(outcome, preflight.blocked)
        if preflight.path_in_use is not None:
            return outcomes.checkpoint_path_in_use(outcome, preflight.path_in_use)
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
        return _stopping(outcome, lambda: self._apply(read, wanted, supporting, outcome))

    def _apply_outcome(self, read: ReadBtj, outcome: PassOutcome) -> None:
        """Post the pass's Events, then write its status once; `requeue` raises kopf.TemporaryError after.

        The Events go first: once the status says a cause, no later pass posts its Event again, so an
        operator stopped right after the write (Kopf posts its queue asynchronously) must have queued them.
        A write that fails retries the pass, which may post an Event twice; never none."""
        body = read.body
        meta = body["metadata"]
        if outcome.error is not None:
            self.ctx.metrics.record_error(outcome.error)
        if outcome.recreated:
            self.ctx.metrics.children_recreated.inc()
        for notice in outcomes.events_to_post(outcome, read.status):
            self._event(body, notice.reason, notice.message, warning=notice.warning)

        def update(current: Mapping[str, Any]) -> StatusChange | None:
            # The first attempt computes on the BTJ this pass read (parsed once); one after a conflict reads.
            stored = read.status if current is body else read_status(current.get("status")).status
            if stored.plan != read.status.plan:  # re-planned since by another writer (a resize, an OOM)
                return None  # its plan stands: this pass's is stale, and the next pass starts from it
            generation = int((current.get("metadata") or {}).get("generation") or outcome.generation)
            return outcomes.status_change(outcome, stored, now_rfc3339(), current_generation=generation)

        # The BTJ this pass read is the first attempt's: a write since then makes it a conflict, re-read.
        write_status(self.api, meta["namespace"], meta["name"], update, RECONCILE, self._logger, read=read)
        if outcome.requeue is not None:
            raise kopf.TemporaryError(outcome.requeue.message, delay=outcome.requeue.after_s)

    # ----- children -----

    def _apply(
        self,
        read: ReadBtj,
        wanted: Wanted,
        supporting: list[dict[str, Any]],
        outcome: PassOutcome,
    ) -> PassOutcome:
        """Read the child, decide (lifecycle/child_apply.py), make the decision's calls and add its effects
        to the pass's outcome."""
        calls = ChildCalls(self.api, wanted.owner_uid, self._logger)
        kind, body = wanted.kind, read.body
        job_path = resource_path(kind.api_version, kind.plural, body["metadata"]["namespace"], wanted.name)
        existing = calls.read(kind, job_path, wanted.name)
        stored = _status_after_child(self.api, body) if existing is None else read.status
        decision = decide(wanted, existing, stored)
        match decision:
            case NameConflict():
                raise ChildConflict(decision.message)
            case PreviousDeleting():
                if decision.release and existing is not None:
                    release(self.api, existing, kind.plural, self._logger or _LOG)
                raise ApiError(409, "Conflict", decision.message)
            case StaleChild():
                if calls.delete_stale(job_path, decision.uid):
                    self._event(body, CHILD_DELETED, decision.event(kind.kind, wanted.name))
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
        return _stopping(found, lambda: update_child(calls, job_path, supporting, decision, found))


def _stopping(outcome: PassOutcome, calls: Callable[[], PassOutcome]) -> PassOutcome:
    """`calls()`; or, when a name conflict or an API server refusal stops them, `outcome` (what the pass
    knew before them) ending on it."""
    try:
        return calls()
    except ChildConflict as exc:
        return outcomes.name_conflict(outcome, str(exc))
    except ApiError as exc:
        if not retrying.refused(exc):
            raise
        return outcomes.refused(outcome, refusal(exc.action or "a call", exc.creating, str(exc)))


def _status_after_child(api: KubeApi, body: Mapping[str, Any]) -> BlackwellTrainingJobStatus:
    """The BTJ's status read again, after its child was found gone: a watcher that recorded the child's
    end (finished, a permanent error) did so before it let the child go, so this read sees it.

    A spec edited since this pass read the BTJ makes the pass start again from the BTJ as it is now:
    a finished job runs again only on an edit made after its child's deletion was recorded
    (child_record.runs_again), and this pass's older generation would read as one.
    """
    meta = body["metadata"]
    fresh = api.get(btj_path(meta["namespace"], meta["name"])) or {}
    fresh_meta = fresh.get("metadata") or {}
    if (
        fresh_meta.get("uid") != meta["uid"]
        or fresh_meta.get("deletionTimestamp")
        or fresh_meta.get("generation") != meta.get("generation")
    ):
        raise ApiError(409, "Conflict", "the BlackwellTrainingJob changed while it was reconciled")
    return read_status(fresh.get("status")).status

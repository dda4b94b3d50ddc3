"""The spec reconciler: validate, plan, render, create-or-patch the children, write status and Events."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf

from blackwell_operator.admission.job import Rejected, validate_body
from blackwell_operator.calibration.cluster import Corrector, describe_correction, frozen
from blackwell_operator.discovery.aws import AwsCapacity
from blackwell_operator.discovery.capacity import Capacity
from blackwell_operator.errors import SpecError
from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.btjstatus import btj_path, deleted_child_uid, write_status
from blackwell_operator.handlers.cluster_calibration import read_cluster_calibration
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import adopt_children, create_event, post_event
from blackwell_operator.handlers.finalizer import release, with_finalizer
from blackwell_operator.handlers.planning import plan_within
from blackwell_operator.handlers.preflight import check_references
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
    Effects,
    FinishedChildGone,
    NameConflict,
    PatchInPlace,
    PreviousDeleting,
    UpToDate,
    Wanted,
    conflict_message,
    decide,
    refusal,
    resume_note,
    still_deleting,
    supporting_patch,
)
from blackwell_operator.lifecycle.child_record import owned_by
from blackwell_operator.lifecycle.conditions import (
    ConditionChange,
    ConditionStatus,
    get_condition,
    remove_condition,
    set_condition,
    set_conditions,
)
from blackwell_operator.lifecycle.elastic import stored_choice
from blackwell_operator.lifecycle.message import set_message
from blackwell_operator.lifecycle.patch import plan_document
from blackwell_operator.lifecycle.phase import CHILD_PHASES, child_conditions, child_headline
from blackwell_operator.lifecycle.references import SERVICE_ACCOUNT_MISSING
from blackwell_operator.lifecycle.replan import REPLANNED_REASON, correction_of
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.lifecycle.writers import RECONCILE
from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.models.status import ChildReference, ConditionType, Phase, StatusChange
from blackwell_operator.planner.provenance import plan_event, plan_verified_condition
from blackwell_operator.render import render_children, trainjob
from blackwell_operator.render.kinds import (
    CONFIG_MAP,
    JOB_KINDS,
    SUPPORTING_KINDS,
    TRAINING_RUNTIME,
    ChildKind,
)
from blackwell_operator.render.pod import plan_config_map_name, resources
from blackwell_operator.timefmt import now_rfc3339
from blackwell_operator.units import GIB
from blackwell_trainer.config import Plan

# Where each backend's job lives in the API (render.kinds.JOB_KINDS, under the name the handlers use).
CHILD_KINDS: dict[Backend, ChildKind] = JOB_KINDS
# spec.backend auto and the cluster serves no job API: the condition reason, and when to look again.
NO_JOB_API = "NoJobApi"
NO_JOB_API_RETRY_S = 60.0
# What the child references, created before it and patched with it: the plan ConfigMap, and for a TrainJob
# its TrainingRuntime.
SUPPORTING_PLURALS = {kind: row.plural for kind, row in SUPPORTING_KINDS.items()}


T = TypeVar("T")
_LOG = logging.getLogger(__name__)
DRY_RUN_MESSAGE = "spec.dryRun is true: planned only, nothing created."


class ChildConflict(Exception):
    """An object with the child's name exists and belongs to someone else."""


@dataclass
class Result:
    """What one reconcile decided; turned into status by `_status_update`."""

    plan: Plan | None = None
    phase: Phase | None = None  # set for operator-decided phases (Invalid, Planned, Failed on conflict)
    conditions: list[ConditionChange] = field(default_factory=list)
    child: dict[str, Any] | None = None  # the child object as last seen
    child_kind: ChildKind | None = None
    config_map: str | None = None
    write_plan: bool = True
    message: str = ""
    backend: Backend | None = None  # the concrete backend (spec.backend, or what auto chose)


def supporting_of(namespace: str, btj_name: str, child_kind: str) -> list[tuple[str, str, str]]:
    """(apiVersion, plural, name) of what a BTJ's child references: its plan ConfigMap, and for a
    TrainJob its TrainingRuntime (named like the job)."""
    found = [(CONFIG_MAP.api_version, CONFIG_MAP.plural, plan_config_map_name(btj_name))]
    if child_kind == trainjob.KIND:
        found.append((TRAINING_RUNTIME.api_version, TRAINING_RUNTIME.plural, btj_name))
    return found


def drop_supporting(
    api: KubeApi, namespace: str, objects: list[tuple[str, str, str]], owner_uid: str, logger: Any
) -> None:
    """Delete what a job referenced, when the BTJ owns it (its job is gone or was never made); a failure
    is logged only (the next pass that wants no job tries again)."""
    for api_version, plural, name in objects:
        path = resource_path(api_version, plural, namespace, name)
        try:
            existing = api.get(path)
            if existing is not None and owned_by(existing, owner_uid):
                api.delete(path, uid=existing["metadata"].get("uid"))
        except ApiError as exc:
            logger.warning(f"Cannot delete {plural} {name}: {exc}")


def _reference(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(apiVersion, plural, name) of a rendered supporting object."""
    return (str(obj["apiVersion"]), SUPPORTING_PLURALS[obj["kind"]], obj["metadata"]["name"])


def _named(call: Callable[[], T], what: str, *, create: bool = True) -> T:
    """`call()`, with an ApiError marked with what was asked (for the refusal's message and condition)."""
    try:
        return call()
    except ApiError as exc:
        exc.action, exc.creating = what, create
        raise


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


class ChildRefused(Exception):
    """The API server refused a create or patch of a child (reported on the BTJ; the resync loop retries).

    `condition` is the one that says so: ChildCreated for a create, SpecApplied for a patch in place.
    """

    def __init__(self, message: str, *, condition: str, reason: str) -> None:
        super().__init__(message)
        self.condition = condition
        self.reason = reason


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

    def reconcile(self, body: Mapping[str, Any], *, retry: int, logger: Any) -> None:
        """Kopf's handler path: one pass; raises kopf.TemporaryError for what a later retry can fix."""
        with self.ctx.recreate_lock(str(body.get("metadata", {}).get("uid", ""))):
            try:
                self._guarded(body, logger)
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

    def _guarded(self, body: Mapping[str, Any], logger: Any, *, attempts: int = retrying.ATTEMPTS) -> None:
        """One pass under the retry policy (a pass is idempotent: create-or-get, conditional writes)."""
        started = time.perf_counter()
        self._logger = logger
        meta = body.get("metadata", {})
        what = f"reconcile of BlackwellTrainingJob {meta.get('namespace')}/{meta.get('name')}"
        try:
            retrying.call(what, logger, lambda: self._reconcile(body, logger), attempts=attempts)
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

    def _event_once(
        self,
        obj: Mapping[str, Any],
        condition: str,
        reason: str,
        message: str,
        *,
        warning: bool = True,
        event: tuple[str, str] | None = None,
    ) -> None:
        """An Event for a condition's cause (`event`: its own reason and message, else the condition's),
        unless the stored condition already says it (a restart, a retry, the resync loop): one Event per
        cause, not one per pass. `obj` is the BTJ as read before this pass wrote its status."""
        meta = obj.get("metadata") or {}
        stored = get_condition((obj.get("status") or {}).get("conditions"), condition) or {}
        if (
            stored.get("reason") == reason
            and stored.get("message") == message
            and stored.get("observedGeneration") == int(meta.get("generation") or 1)
        ):
            return
        event_reason, event_message = event or (reason, message)
        self._event(obj, event_reason, event_message, warning=warning)

    def _reconcile(self, body: Mapping[str, Any], logger: Any) -> None:
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        # The event that triggered this pass may be stale (the BTJ changed, or was deleted meanwhile): work
        # from the BTJ as it is now, and create nothing for one that is gone or going.
        current = self.api.get(btj_path(namespace, name))
        if (
            current is None
            or current["metadata"].get("uid") != meta["uid"]
            or current["metadata"].get("deletionTimestamp")
        ):
            logger.info("The BlackwellTrainingJob is gone or going; nothing to create.")
            return
        body = current
        meta = body["metadata"]
        generation = int(meta.get("generation") or 1)
        try:
            spec = parse_spec(body)
            # What out-of-memory runs of this spec taught (status.memoryCorrection, lifecycle/replan.py):
            # also after an operator restart, the plan is the corrected one that runs.
            correction = correction_of(body)
            cluster = self._cluster_corrector(body, spec, generation)
            # An elastic job keeps the count its stored plan chose; its first plan takes the healthy nodes.
            kept = stored_choice(body) if spec.cluster.elastic is not None else None
            schedulable = self._schedulable(spec, logger) if spec.cluster.elastic and not kept else None
            plan = plan_within(
                spec, name, correction=correction, cluster=cluster, schedulable=schedulable, current=kept
            )
        except SpecError as exc:
            self.ctx.metrics.record_error(exc.reason)
            self._report_invalid(body, exc, generation)
            return

        result = Result(plan=plan)
        if correction is not None:  # the last explanation line says what the correction is
            planned = (REPLANNED_REASON, f"{plan_summary(plan)}; {plan.explanation[-1]}")
        else:
            planned = ("Planned", plan_summary(plan))
        result.conditions.append((ConditionType.PLANNED, "True", *planned))
        self._report_provenance(body, plan, result)
        capacity = self._capacity(spec, plan, logger)
        result.conditions.append(
            with_aws_capacity(capacity_condition(capacity, plan.nodes), self._aws_capacity(spec, logger))
        )
        backend = self._backend(body, spec)
        result.backend = backend
        if backend is None and not spec.dry_run:
            self._report_no_job_api(body, spec, result, generation)
        if backend is not None:
            spec = with_backend(spec, backend)
            result.child_kind = CHILD_KINDS[backend]

        if spec.dry_run:
            result.phase = Phase.PLANNED
            result.conditions.append(
                (
                    ConditionType.CHILD_CREATED,
                    "False",
                    "DryRun",
                    DRY_RUN_MESSAGE,
                )
            )
            result.message = f"Planned (dry run): {plan_summary(plan)}"
            self._write(body, result, generation)
            self._event_once(
                body,
                ConditionType.CHILD_CREATED,
                "DryRun",
                DRY_RUN_MESSAGE,
                warning=False,
                event=("Planned", f"Dry run: {plan_summary(plan)}"),
            )
            return

        kind = CHILD_KINDS[spec.backend]
        config_map, *supporting, job = render_children(
            name,
            namespace,
            spec,
            plan,
            labels=meta.get("labels") or {},
            default_image=self.ctx.default_image,
        )
        adopt_children([config_map, *supporting, job], body)
        # The child keeps its final status until this operator has recorded it (handlers/children.py):
        # a finished job deleted while the operator is down (ttlSecondsAfterFinished: 0) is then still
        # seen finished, and never run again.
        with_finalizer(job)
        # What the pods name must exist before anything is made (handlers/preflight.py): a missing
        # ServiceAccount holds the create, and the resync loop looks again; a missing pull Secret warns.
        job_path = resource_path(kind.api_version, kind.plural, namespace, job["metadata"]["name"])
        preflight = check_references(self.api, body, spec, job_path, logger)
        result.conditions.extend(preflight.conditions)
        for type_, cond_status, reason, message in preflight.conditions:
            if cond_status == "False":
                self._event_once(body, type_, reason, message)
        if preflight.blocked is not None:
            result.phase, result.message = (
                Phase.PENDING,
                f"Waiting for its ServiceAccount: {preflight.blocked}",
            )
            result.conditions.append(
                (ConditionType.CHILD_CREATED, "False", SERVICE_ACCOUNT_MISSING, preflight.blocked)
            )
            self._write(body, result, generation)
            self._event_once(body, ConditionType.CHILD_CREATED, SERVICE_ACCOUNT_MISSING, preflight.blocked)
            return
        result.config_map = config_map["metadata"]["name"]
        try:
            self._apply(body, body, spec, kind, [config_map, *supporting], job, result)
        except ChildConflict as exc:
            self.ctx.metrics.record_error("ChildNameConflict")
            result.phase = Phase.FAILED
            result.write_plan = True
            result.conditions.append((ConditionType.CHILD_CREATED, "False", "ChildNameConflict", str(exc)))
            result.message = str(exc)
            self._write(body, result, generation)
            self._event_once(body, ConditionType.CHILD_CREATED, "ChildNameConflict", str(exc))
            return
        except ChildRefused as exc:
            self.ctx.metrics.record_error(exc.reason)
            result.conditions.append((exc.condition, "False", exc.reason, str(exc)))
            if exc.condition == ConditionType.CHILD_CREATED:
                result.phase = Phase.PENDING
                result.message = f"Waiting for the API server to accept the job: {exc}"
            else:
                result.write_plan = False  # status.plan keeps describing what actually runs
            self._write(body, result, generation)
            self._event_once(body, exc.condition, exc.reason, str(exc))
            return
        self._write(body, result, generation)

    def _cluster_corrector(
        self, body: Mapping[str, Any], spec: BlackwellTrainingJobSpec, generation: int
    ) -> Corrector | None:
        """What this cluster measured, for the plan: the factors already planned with when this generation
        was planned before (a resync or a re-created child never re-plans a running job differently), else
        the operator's cluster calibration now."""
        status = body.get("status") or {}
        # An unreadable stored plan (lifecycle/status_read.py) is planned anew, with the calibration now.
        stored = read_status(status).status.plan
        if stored is not None and status.get("observedGeneration") == generation:
            return frozen(stored.cluster_correction)
        calibration = read_cluster_calibration(self.ctx, self._logger or _LOG)
        return calibration.corrector(spec.cluster.instance_type) if calibration else None

    def _report_provenance(self, body: Mapping[str, Any], plan: Plan, result: Result) -> None:
        """Condition PlanVerified and one Event per plan: which choices were measured here, which modelled."""
        _, verified, reason, message = plan_verified_condition(plan.provenance)
        status: ConditionStatus = "True" if verified else "False"
        result.conditions.append((ConditionType.PLAN_VERIFIED, status, reason, message))
        event_reason, event_message, warning = plan_event(plan.provenance)
        self._event_once(
            body,
            ConditionType.PLAN_VERIFIED,
            reason,
            message,
            warning=warning,
            event=(event_reason, event_message),
        )

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

    def _backend(self, body: Mapping[str, Any], spec: BlackwellTrainingJobSpec) -> Backend | None:
        """spec.backend, or for auto: the kind of the child it has, else the first kind the cluster serves.

        A recorded child's kind wins over discovery, so that a job API installed later never gives a BTJ
        a second child of another kind.
        """
        if spec.backend != Backend.AUTO:
            return spec.backend
        recorded = backend_of_kind(((body.get("status") or {}).get("child") or {}).get("kind"))
        if recorded is not None:
            return recorded
        served = self.ctx.served_apis.served() if self.ctx.served_apis is not None else frozenset(CONCRETE)
        return choose_backend(spec, served)

    def _report_no_job_api(
        self, body: Mapping[str, Any], spec: BlackwellTrainingJobSpec, result: Result, generation: int
    ) -> None:
        """auto found no job API: say so in status and an Event, and try again in a minute."""
        message = none_served_message(spec)
        result.phase = Phase.PENDING
        result.conditions.append((ConditionType.CHILD_CREATED, "False", NO_JOB_API, message))
        result.message = message
        self._write(body, result, generation)
        self._event_once(body, ConditionType.CHILD_CREATED, NO_JOB_API, message)
        raise kopf.TemporaryError(message, delay=NO_JOB_API_RETRY_S)

    # ----- children -----

    def _apply(
        self,
        body: Mapping[str, Any],
        current: Mapping[str, Any],
        spec: BlackwellTrainingJobSpec,
        kind: ChildKind,
        supporting: list[dict[str, Any]],
        job: dict[str, Any],
        result: Result,
    ) -> None:
        """Create or patch the children; a refusal by the API server becomes ChildRefused."""
        try:
            self._apply_children(body, current, spec, kind, supporting, job, result)
        except ApiError as exc:
            if not retrying.refused(exc):
                raise
            raise self._refusal(exc) from exc

    def _refusal(self, exc: ApiError) -> ChildRefused:
        condition, _, reason, message = refusal(exc.action or "a call", exc.creating, str(exc))
        return ChildRefused(message, condition=condition, reason=reason)

    def _apply_children(
        self,
        body: Mapping[str, Any],
        current: Mapping[str, Any],
        spec: BlackwellTrainingJobSpec,
        kind: ChildKind,
        supporting: list[dict[str, Any]],
        job: dict[str, Any],
        result: Result,
    ) -> None:
        """Read the child (and, when it is gone, the BTJ again), decide (lifecycle/child_apply.py), make the
        outcome's calls and record its effects in `result`."""
        meta = body["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        job_name = job["metadata"]["name"]
        job_path = resource_path(kind.api_version, kind.plural, namespace, job_name)
        existing = _named(lambda: self.api.get(job_path), f"the read of {kind.kind} {job_name}")
        status = current.get("status") or {}
        if existing is None:
            # Read the BTJ again, after the child: a watcher that recorded the child's end (finished, a
            # permanent error) did so before it let the child go, so this read sees that record.
            fresh = self.api.get(btj_path(namespace, meta["name"])) or {}
            fresh_meta = fresh.get("metadata") or {}
            if fresh_meta.get("uid") != uid or fresh_meta.get("deletionTimestamp"):
                raise ApiError(409, "Conflict", "the BlackwellTrainingJob changed while it was reconciled")
            status = fresh.get("status") or {}
        wanted = Wanted(
            kind=kind,
            job=job,
            config_map=supporting[0]["metadata"]["name"],
            owner_uid=uid,
            generation=int(meta.get("generation") or 1),
            plan_summary=plan_summary(result.plan) if result.plan else "",
            resume_note=resume_note(spec.training.checkpoint.path),
        )
        outcome = decide(wanted, existing, status)
        match outcome:
            case NameConflict():
                raise ChildConflict(outcome.message)
            case PreviousDeleting():
                if outcome.release and existing is not None:
                    release(self.api, existing, kind.plural, self._logger or _LOG)
                raise ApiError(409, "Conflict", outcome.message)
            case FinishedChildGone():
                self._drop_supporting(supporting, uid)
                self._record(body, outcome.effects, result)
            case Create():
                created, child = self._create_together(kind, job, supporting, uid)
                result.child = child
                self._record(body, outcome.made(created, child["metadata"].get("uid")), result)
            case UpToDate() | PatchInPlace() | CannotChange():
                assert existing is not None  # a Found outcome is decided from the child read
                result.child = existing
                result.conditions.append(outcome.found)
                if outcome.hold:
                    result.child = self._hold(job_path, existing)
                if isinstance(outcome, UpToDate | PatchInPlace):
                    self._ensure_supporting(supporting, uid)
                if isinstance(outcome, PatchInPlace):
                    patch = outcome.patch
                    result.child = _named(
                        lambda: self.api.patch(job_path, patch),
                        f"the patch of {kind.kind} {job_name}",
                        create=False,
                    )
                self._record(body, outcome.effects, result)

    def _record(self, body: Mapping[str, Any], effects: Effects, result: Result) -> None:
        """An outcome's effects, once its calls went through: its conditions into `result`, its Events."""
        result.conditions.extend(effects.conditions)
        if not effects.write_plan:
            result.write_plan = False
        if effects.recreated:
            self.ctx.metrics.children_recreated.inc()
        for notice in effects.events:
            if notice.once is None:
                self._event(body, notice.reason, notice.message, warning=notice.warning)
            else:
                self._event_once(body, notice.once, notice.reason, notice.message, warning=notice.warning)

    def _hold(self, job_path: str, job: Mapping[str, Any]) -> dict[str, Any]:
        """Add the final-status finalizer to an existing job (guarded by its resourceVersion)."""
        meta = job["metadata"]
        finalizers = with_finalizer(copy.deepcopy(dict(job)))["metadata"]["finalizers"]
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        return _named(
            lambda: self.api.patch(job_path, patch),
            f"the finalizer patch of {job.get('kind')} {meta['name']}",
            create=False,
        )

    def _create_together(
        self, kind: ChildKind, job: dict[str, Any], supporting: list[dict[str, Any]], owner_uid: str
    ) -> tuple[bool, dict[str, Any]]:
        """What the job references (the ConfigMap, a TrainingRuntime), then the job: all stay, or none.

        A refused job create deletes what was made for it again (no job exists: this pass found none). A
        crash in between leaves them alone for a moment; the next pass (resume, the resync loop) creates
        their job or, when the BTJ wants none, removes them.
        """
        self._ensure_supporting(supporting, owner_uid)
        try:
            return self._create_or_get(kind, job, owner_uid)
        except ApiError as exc:
            if retrying.refused(exc):
                self._drop_supporting(supporting, owner_uid)
            raise

    def _drop_supporting(self, supporting: list[dict[str, Any]], owner_uid: str) -> None:
        """Delete this BTJ's supporting objects, where they exist (their job is gone or was never made)."""
        namespace = supporting[0]["metadata"]["namespace"]
        refs = [_reference(obj) for obj in supporting]
        drop_supporting(self.api, namespace, refs, owner_uid, self._logger or _LOG)

    def _ensure_supporting(self, objects: list[dict[str, Any]], owner_uid: str) -> None:
        for obj in objects:
            self._ensure_owned(obj, owner_uid)

    def _ensure_owned(self, obj: dict[str, Any], owner_uid: str) -> None:
        """One object the child references (the plan ConfigMap, a TrainingRuntime) exists, is ours and
        holds this render (GET first: a resume creates and patches nothing)."""
        kind, meta = obj["kind"], obj["metadata"]
        collection = resource_path(obj["apiVersion"], SUPPORTING_PLURALS[kind], meta["namespace"])
        path = f"{collection}/{meta['name']}"
        existing = _named(lambda: self.api.get(path), f"the read of {kind} {meta['name']}")
        if existing is None:
            try:
                _named(lambda: self.api.create(collection, obj), f"the create of {kind} {meta['name']}")
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
            existing = self.api.get(path)
            if existing is None:  # deleted in between: the retry creates it
                raise ApiError(409, "Conflict", f"{kind} {meta['name']} vanished")
        if not owned_by(existing, owner_uid):
            raise ChildConflict(conflict_message(kind, meta["name"]))
        patch = supporting_patch(existing, obj)
        if patch is not None:
            _named(lambda: self.api.patch(path, patch), f"the patch of {kind} {meta['name']}", create=False)

    def _create_or_get(
        self, kind: ChildKind, job: dict[str, Any], owner_uid: str
    ) -> tuple[bool, dict[str, Any]]:
        """Create the job; on 409 (a retry, a restart, a lost answer) take the existing one if it is ours."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            made = _named(
                lambda: self.api.create(resource_path(kind.api_version, kind.plural, namespace), job),
                f"the create of {kind.kind} {name}",
            )
            return True, made
        except ApiError as exc:
            if exc.status != 409:
                raise
        existing = self.api.get(resource_path(kind.api_version, kind.plural, namespace, name))
        if existing is None:
            raise ApiError(409, "Conflict", f"{kind.kind} {name} vanished after a conflict")
        if not owned_by(existing, owner_uid):
            raise ChildConflict(conflict_message(kind.kind, name))
        if existing["metadata"].get("deletionTimestamp"):
            raise ApiError(409, "Conflict", still_deleting(kind.kind, name))
        return False, existing

    # ----- capacity -----

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

    # ----- status -----

    def _report_invalid(self, body: Mapping[str, Any], exc: SpecError, generation: int) -> None:
        def update(current: Mapping[str, Any]) -> StatusChange:
            status = dict(current.get("status") or {})
            now = now_rfc3339()
            conds = set_condition(
                read_status(status).status.conditions,
                ConditionType.PLANNED,
                "False",
                exc.reason,
                exc.message,
                generation=generation,
                now=now,
            )
            has_child = bool((status.get("child") or {}).get("uid")) and status.get("phase") in CHILD_PHASES
            change = StatusChange(observed_generation=generation)
            if has_child:  # the running job is untouched; say why the new spec is not applied
                conds = set_condition(
                    conds,
                    ConditionType.SPEC_APPLIED,
                    "False",
                    exc.reason,
                    exc.message,
                    generation=generation,
                    now=now,
                )
            else:
                conds = remove_condition(conds, ConditionType.PLAN_VERIFIED)  # no plan: nothing to verify
                change.phase = Phase.INVALID
                set_message(change, exc.message, change.phase)
                change.plan = change.precision = change.micro_batch_size = change.nodes = None
                change.activation_checkpointing = None
            change.conditions = conds
            return change

        meta = body["metadata"]
        write_status(self.api, meta["namespace"], meta["name"], update, RECONCILE, self._logger)
        self._event_once(body, ConditionType.PLANNED, exc.reason, exc.message)

    def _write(self, body: Mapping[str, Any], result: Result, generation: int) -> None:
        meta = body["metadata"]

        def update(current: Mapping[str, Any]) -> StatusChange:
            status = dict(current.get("status") or {})
            now = now_rfc3339()
            # The child watcher saw the very child this pass found or created deleted, after this pass saw it
            # (a race with a hand deletion): keep its report, so that recreate-child brings the child back.
            result_uid = (result.child or {}).get("metadata", {}).get("uid")
            known_gone = result_uid is not None and deleted_child_uid(status) == result_uid
            conds = set_conditions(
                read_status(status).status.conditions,
                (
                    cond
                    for cond in result.conditions
                    if not (known_gone and cond[0] == ConditionType.CHILD_CREATED)
                ),
                generation=generation,
                now=now,
            )
            change = StatusChange(observed_generation=generation)
            if result.backend is not None and status.get("backend") != result.backend.value:
                change.backend = result.backend.value
            if result.plan is not None and (result.write_plan or not status.get("plan")):
                plan = result.plan
                if status.get("plan") != plan_document(plan.to_json()):
                    change.plan = plan  # written as the merge patch from the stored one
                change.nodes = plan.nodes
                change.precision = plan.chosen.precision.value
                change.micro_batch_size = plan.chosen.micro_batch_size
                change.activation_checkpointing = plan.chosen.activation_checkpointing.value
            if result.phase is not None:
                change.phase = result.phase
                set_message(change, result.message, change.phase)  # no worker failure: its own phases
            if result.child is not None and result.child_kind is not None:
                child_meta = result.child["metadata"]
                child_uid = child_meta.get("uid")
                change.child = ChildReference(
                    api_version=result.child_kind.api_version,
                    kind=result.child_kind.kind,
                    name=child_meta["name"],
                    uid=child_uid,
                    config_map=result.config_map,
                )
                recorded_uid = (status.get("child") or {}).get("uid")
                same_child = recorded_uid == child_uid
                if recorded_uid and not same_child and status.get("lastFailure"):
                    # A new child (a spec change after a failure, a re-create): the previous child's worker
                    # failure would read as this one's in the message and the Event trail.
                    change.last_failure = None
                if not (same_child and status.get("phase") in CHILD_PHASES):
                    # First sight of this child: derive phase from it. Afterwards the child watcher owns
                    # phase and the child conditions (it sees every change; this pass may hold an older copy).
                    spec = body.get("spec") or {}
                    phase, conds = child_conditions(
                        conds,
                        result.child.get("status"),
                        generation=generation,
                        now=now,
                        queue_name=spec.get("queueName"),
                        child_kind=result.child_kind.kind,
                    )
                    headline = child_headline(
                        phase, result.child_kind.kind, child_meta["name"], result.child.get("status")
                    )
                    change.phase = phase
                    # First sight: the message is the child's alone (its lastFailure is the child watcher's).
                    set_message(change, headline, phase)
            change.conditions = conds
            return change

        write_status(self.api, meta["namespace"], meta["name"], update, RECONCILE, self._logger)


def plan_summary(plan: Plan) -> str:
    """One line: the chosen settings and the prediction."""
    chosen, predicted = plan.chosen, plan.predicted
    return (
        f"{plan.model_name} on {plan.nodes}x{plan.gpus_per_node} {plan.gpu.name}: {chosen.precision.value}, "
        f"micro-batch {chosen.micro_batch_size}, AC {chosen.activation_checkpointing.value}, "
        f"{chosen.sharding.value} sharding; predicted "
        f"{predicted.tokens_per_second_per_gpu:,.0f} tokens/s/GPU, "
        f"MFU {predicted.model_flops_utilization:.0%} of BF16 dense peak, "
        f"peak {predicted.memory.peak_reserved / GIB:.1f} GiB/GPU"
        + (f"; {describe_correction(plan.cluster_correction)}" if plan.cluster_correction else "")
    )


def with_aws_capacity(
    condition: tuple[str, ConditionStatus, str, str], aws: AwsCapacity | None
) -> tuple[str, ConditionStatus, str, str]:
    """CapacityAvailable with what AWS says appended; an AWS shortfall (a training plan not active yet, an
    instance group short of running nodes) turns a True into False. Unknown AWS capacity changes no status.
    Advisory either way: the job is created and queues."""
    if aws is None:
        return condition
    type_, status, reason, message = condition
    if aws.known and aws.short and status != "False":
        return type_, "False", aws.reason, f"{aws.message} Kubernetes: {message}"
    return type_, status, reason, f"{message} {aws.message}"


def capacity_condition(capacity: Capacity | None, needed: int) -> tuple[str, ConditionStatus, str, str]:
    """CapacityAvailable from a node count (Unknown when nodes could not be read)."""
    if capacity is None:
        return (
            ConditionType.CAPACITY_AVAILABLE,
            "Unknown",
            "NodesUnreadable",
            "Node capacity could not be read.",
        )
    if capacity.schedulable >= needed and not capacity.enough_for(needed):
        return (
            ConditionType.CAPACITY_AVAILABLE,
            "False",
            "InsufficientAllocatable",
            f"{capacity.describe()}; {needed} needed. Its workers would stay Pending on these nodes.",
        )
    if capacity.enough_for(needed):
        return (
            ConditionType.CAPACITY_AVAILABLE,
            "True",
            "Sufficient",
            f"{capacity.describe()}; {needed} needed.",
        )
    return (
        ConditionType.CAPACITY_AVAILABLE,
        "False",
        "InsufficientNodes",
        f"{capacity.describe()}; {needed} needed. The job is created; its workers wait until enough nodes "
        "are healthy.",
    )

"""The API calls that make a BTJ's children: its supporting objects and its job, created, held or patched.

What to call is decided in lifecycle/child_apply.py; these make the calls, and name each one in the
ApiError it raises (for the refusal's message and condition).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.finalizer import with_finalizer
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.lifecycle.child_apply import (
    CannotChange,
    PatchInPlace,
    UpToDate,
    conflict_message,
    label_patch,
    still_deleting,
    supporting_patch,
)
from blackwell_operator.lifecycle.child_record import owned_by
from blackwell_operator.lifecycle.outcome import PassOutcome
from blackwell_operator.render import trainjob
from blackwell_operator.render.kinds import CONFIG_MAP, SUPPORTING_KINDS, TRAINING_RUNTIME, ChildKind
from blackwell_operator.render.pod import plan_config_map_name

T = TypeVar("T")
_LOG = logging.getLogger(__name__)
# What the child references, created before it and patched with it: the plan ConfigMap, and for a TrainJob
# its TrainingRuntime.
SUPPORTING_PLURALS = {kind: row.plural for kind, row in SUPPORTING_KINDS.items()}


class ChildConflict(Exception):
    """An object with the child's name exists and belongs to someone else."""


def supporting_of(namespace: str, btj_name: str, child_kind: str) -> list[tuple[str, str, str]]:
    """(apiVersion, plural, name) of what a BTJ's child references: its plan ConfigMap, and for a
    TrainJob its TrainingRuntime (named like the job)."""
    found = [(CONFIG_MAP.api_version, CONFIG_MAP.plural, plan_config_map_name(btj_name))]
    if child_kind == trainjob.KIND:
        found.append((TRAINING_RUNTIME.api_version, TRAINING_RUNTIME.plural, btj_name))
    return found


def drop_supporting(
    api: KubeApi, namespace: str, objects: list[tuple[str, str, str]], owner_uid: str, logger: Logger
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


def named(call: Callable[[], T], what: str, *, create: bool = True) -> T:
    """`call()`, with an ApiError marked with what was asked (for the refusal's message and condition)."""
    try:
        return call()
    except ApiError as exc:
        exc.action, exc.creating = what, create
        raise


def _reference(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(apiVersion, plural, name) of a rendered supporting object."""
    return (str(obj["apiVersion"]), SUPPORTING_PLURALS[obj["kind"]], obj["metadata"]["name"])


class ChildCalls:
    """The calls for one BTJ's children (its uid owns them)."""

    def __init__(self, api: KubeApi, owner_uid: str, logger: Logger | None = None) -> None:
        self.api, self.owner_uid = api, owner_uid
        self.logger = logger if logger is not None else _LOG

    def read(self, kind: ChildKind, job_path: str, name: str) -> dict[str, Any] | None:
        """The job under its name, or None."""
        return named(lambda: self.api.get(job_path), f"the read of {kind.kind} {name}")

    def hold(self, job_path: str, job: Mapping[str, Any]) -> dict[str, Any]:
        """Add the final-status finalizer to an existing job (guarded by its resourceVersion)."""
        meta = job["metadata"]
        finalizers = with_finalizer(copy.deepcopy(dict(job)))["metadata"]["finalizers"]
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        return named(
            lambda: self.api.patch(job_path, patch),
            f"the finalizer patch of {job.get('kind')} {meta['name']}",
            create=False,
        )

    def delete_stale(self, job_path: str, uid: str) -> bool:
        """Delete the child a re-plan replaces, by its uid (never a newer one of its name); whether this
        call deleted it (False: gone already, or another child has the name, which the retried pass
        reads)."""
        try:
            return self.api.delete(job_path, uid=uid)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return False

    def patch(self, kind: ChildKind, job_path: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Patch the job in place (it has not started)."""
        return named(
            lambda: self.api.patch(job_path, patch), f"the patch of {kind.kind} {name}", create=False
        )

    def relabel(self, kind: ChildKind, job_path: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Bring the job's labels to the BTJ's (lifecycle/child_apply.label_patch), whatever its phase."""
        self.logger.info(f"The labels of {kind.kind} {name} follow the BlackwellTrainingJob's")
        return named(
            lambda: self.api.patch(job_path, patch), f"the label patch of {kind.kind} {name}", create=False
        )

    def relabel_supporting(self, objects: list[dict[str, Any]]) -> None:
        """Bring the labels of each supporting object that exists and is ours to the render's, and nothing
        else: beside a job that cannot take this render, they keep describing what runs."""
        for obj in objects:
            self._relabel_supporting(obj)

    def _relabel_supporting(self, obj: Mapping[str, Any]) -> None:
        kind, meta = obj["kind"], obj["metadata"]
        path = resource_path(obj["apiVersion"], SUPPORTING_PLURALS[kind], meta["namespace"], meta["name"])
        existing = named(lambda: self.api.get(path), f"the read of {kind} {meta['name']}")
        if existing is None or not owned_by(existing, self.owner_uid):
            return  # gone with a finished job, or not ours (reported when a job is made)
        patch = label_patch(existing, obj)
        if patch is not None:
            named(
                lambda: self.api.patch(path, patch), f"the label patch of {kind} {meta['name']}", create=False
            )

    def create_together(
        self, kind: ChildKind, job: dict[str, Any], supporting: list[dict[str, Any]]
    ) -> tuple[bool, dict[str, Any]]:
        """What the job references (the ConfigMap, a TrainingRuntime), then the job: all stay, or none.

        A refused job create deletes what was made for it again (no job exists: this pass found none). A
        crash in between leaves them alone for a moment; the next pass (resume, the resync loop) creates
        their job or, when the BTJ wants none, removes them.
        """
        self.ensure_supporting(supporting, absent=True)
        try:
            return self._create_or_get(kind, job)
        except ApiError as exc:
            if retrying.refused(exc):
                self.drop_supporting(supporting)
            raise

    def drop_supporting(self, supporting: list[dict[str, Any]]) -> None:
        """Delete this BTJ's supporting objects, where they exist (their job is gone or was never made)."""
        namespace = supporting[0]["metadata"]["namespace"]
        refs = [_reference(obj) for obj in supporting]
        drop_supporting(self.api, namespace, refs, self.owner_uid, self.logger)

    def ensure_supporting(self, objects: list[dict[str, Any]], *, absent: bool = False) -> bool:
        """Each object the child references exists, is ours and holds this render; whether one was made.

        absent: they are expected not to exist (a pass creating the job it found missing), so each is
        created first and read only when the create says it exists (409); else each is read first.
        """
        made = [self._ensure_owned(obj, absent=absent) for obj in objects]
        return any(made)

    def ensure_supporting_of(
        self, job_path: str, job: Mapping[str, Any], objects: list[dict[str, Any]]
    ) -> None:
        """ensure_supporting for `job`, a job this pass read earlier, which may have finished and gone since.

        The child watcher drops a finished job's supporting objects when the job goes: one missing now may
        have been dropped after this pass's read, so one made again is dropped again unless the job is
        still there and not going (if it goes later, the watcher's drop comes after this create).
        """
        if not self.ensure_supporting(objects):
            return
        current = named(lambda: self.api.get(job_path), f"the read of {job.get('kind')}")
        uid = job["metadata"].get("uid")
        if current is not None and current["metadata"].get("uid") != uid:
            return  # another job took the name (its own pass made what it references)
        if current is None or current["metadata"].get("deletionTimestamp"):
            self.logger.info("The job went while this pass ran: what it referenced is removed again")
            self.drop_supporting(objects)

    def _ensure_owned(self, obj: dict[str, Any], *, absent: bool = False) -> bool:
        """One object the child references (the plan ConfigMap, a TrainingRuntime) exists, is ours and
        holds this render (GET first: a resume creates and patches nothing; with `absent`, the create
        first, which saves the read that finds nothing); whether it was made."""
        kind, meta = obj["kind"], obj["metadata"]
        collection = resource_path(obj["apiVersion"], SUPPORTING_PLURALS[kind], meta["namespace"])
        path = f"{collection}/{meta['name']}"
        existing = None if absent else named(lambda: self.api.get(path), f"the read of {kind} {meta['name']}")
        if existing is None:
            try:
                named(lambda: self.api.create(collection, obj), f"the create of {kind} {meta['name']}")
                return True
            except ApiError as exc:
                if exc.status != 409:
                    raise
            existing = self.api.get(path)
            if existing is None:  # deleted in between: the retry creates it
                raise ApiError(409, "Conflict", f"{kind} {meta['name']} vanished")
        if not owned_by(existing, self.owner_uid):
            raise ChildConflict(conflict_message(kind, meta["name"]))
        patch = supporting_patch(existing, obj)
        if patch is not None:
            named(lambda: self.api.patch(path, patch), f"the patch of {kind} {meta['name']}", create=False)
        return False

    def _create_or_get(self, kind: ChildKind, job: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Create the job; on 409 (a retry, a restart, a lost answer) take the existing one if it is ours."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            made = named(
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
        if not owned_by(existing, self.owner_uid):
            raise ChildConflict(conflict_message(kind.kind, name))
        if existing["metadata"].get("deletionTimestamp"):
            raise ApiError(409, "Conflict", still_deleting(kind.kind, name))
        return False, existing


def update_child(
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

"""Letting every child go without the operator: its end recorded on its BTJ first, then its finalizer off.

With the operator uninstalled, a child deleted later (by hand, by ttlSecondsAfterFinished, by the garbage
collector when its BTJ goes) would stay Terminating for ever: nothing is left to release the final-status
finalizer. `btj release-children` (and the chart's pre-delete hook) runs this instead: for each child
still carrying it, the child watcher's own path (children.on_child_event) writes what it would write on
the owner BTJ, then the finalizer is removed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from blackwell_operator.handlers import finalizer
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.btjstatus import btj_path
from blackwell_operator.handlers.children import on_child_event
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import create_event
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.lifecycle.child_mirror import owner_reference
from blackwell_operator.lifecycle.phase import child_phase
from blackwell_operator.render.kinds import JOB_KINDS, ChildKind


@dataclass(frozen=True)
class Outcome:
    """What was done (or, in a dry run, would be done) with one child; `ok` False: it still holds."""

    kind: str
    namespace: str
    name: str
    ok: bool
    says: str

    def line(self) -> str:
        """One line for the command's output."""
        return f"{self.kind} {self.namespace}/{self.name}: {self.says}"


def held_children(
    api: KubeApi, namespaces: Sequence[str] | None
) -> Iterator[tuple[ChildKind, dict[str, Any]]]:
    """Every child job (of the three kinds) that carries the final-status finalizer, in `namespaces` (None:
    all). A kind whose CRD the cluster does not serve (404) has none."""
    for kind in JOB_KINDS.values():
        where: Sequence[str | None] = list(namespaces) if namespaces else [None]
        for namespace in where:
            try:
                items = api.list(resource_path(kind.api_version, kind.plural, namespace))
            except ApiError as exc:
                if exc.status == 404:
                    break  # not served: the same answer in every namespace
                raise
            for item in items:
                if finalizer.holds(item):
                    item.setdefault("apiVersion", kind.api_version)
                    item.setdefault("kind", kind.kind)
                    yield kind, item


def _state(child: Mapping[str, Any]) -> str:
    """The child as the watcher sees it: Terminating, or the phase its status maps to."""
    if child["metadata"].get("deletionTimestamp"):
        return "Terminating"
    return child_phase(child.get("status")).value


def _owner_btj(api: KubeApi, child: Mapping[str, Any]) -> str | None:
    """namespace/name of the child's BTJ when that BTJ (the same one: uid) still exists."""
    owner, namespace = owner_reference(child), child["metadata"].get("namespace")
    if owner is None:
        return None
    btj = api.get(btj_path(str(namespace), str(owner["name"])))
    if btj is None or btj["metadata"].get("uid") != owner.get("uid"):
        return None
    return f"{namespace}/{owner['name']}"


def _owner_name(child: Mapping[str, Any]) -> str:
    """namespace/name of the BTJ the child's owner reference names."""
    owner = owner_reference(child) or {}
    return f"{child['metadata'].get('namespace')}/{owner.get('name')}"


def _api_poster(ctx: OperatorContext, logger: Logger) -> Any:
    """Events through the API (no Kopf event queue here); a refused Event is logged, not fatal."""

    def post(obj: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        try:
            create_event(ctx.api, obj, reason, message, warning=warning)
        except ApiError as exc:
            logger.warning(f"Cannot post Event {reason}: {exc}")

    return post


def release_child(
    ctx: OperatorContext, kind: ChildKind, child: dict[str, Any], logger: Logger, *, dry_run: bool
) -> Outcome:
    """Record one child's state on its BTJ as the child watcher would, then remove the finalizer."""
    meta = child["metadata"]
    namespace, name = str(meta.get("namespace")), str(meta["name"])
    state = _state(child)
    try:
        btj = _owner_btj(ctx.api, child)
    except ApiError as exc:
        return Outcome(kind.kind, namespace, name, False, f"not released: cannot read its BTJ ({exc})")
    where = f"recorded on BlackwellTrainingJob {btj}" if btj else "its BlackwellTrainingJob is gone"
    if dry_run:
        recorded = f"would be recorded on BlackwellTrainingJob {btj}" if btj else where
        return Outcome(kind.kind, namespace, name, True, f"would be released ({state}; {recorded})")
    # The child as listed, no event type: a Terminating one is a deletion to the watcher, as it is when
    # the operator (re)starts and lists it.
    if not on_child_event(ctx, None, child, logger, post=_api_poster(ctx, logger)):
        return Outcome(
            kind.kind,
            namespace,
            name,
            False,
            f"not released: its state ({state}) could not be written on BlackwellTrainingJob "
            f"{btj or _owner_name(child)} (see the log line above); run the command again",
        )
    try:
        finalizer.release(ctx.api, child, kind.plural, logger)
    except ApiError as exc:
        return Outcome(kind.kind, namespace, name, False, f"not released: {exc}")
    return Outcome(kind.kind, namespace, name, True, f"released ({state}; {where})")


def release_all(
    ctx: OperatorContext, namespaces: Sequence[str] | None, logger: Logger, *, dry_run: bool
) -> Iterator[Outcome]:
    """release_child for every held child in `namespaces` (None: all), one outcome each."""
    for kind, child in held_children(ctx.api, namespaces):
        yield release_child(ctx, kind, child, logger, dry_run=dry_run)

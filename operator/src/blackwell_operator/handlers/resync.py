"""The resync loop: every BTJ that has not converged is reconciled again, with backoff, until it has.

Kopf reacts to events; an event whose processing failed is not offered again (its own patches refused
with a conflict, an outage longer than the retries), and a create the API server refused has no event to
wait for once the cause is lifted. This loop is the level-triggered net under those: it looks at the
BTJs the watch has shown (OperatorContext.note_btj) and reconciles each one that has not converged, once
it has been quiet (no change seen) for its backoff, doubling from one second to the retry interval.
One loop for the operator, not a Kopf timer per BTJ: timers add Kopf's finalizer to every object they
match and remove it again, patches that race the operator's own status writes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.handlers.btjstatus import btj_path
from blackwell_operator.handlers.context import CHILDREN, PODS, OperatorContext
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.periodic import every
from blackwell_operator.handlers.reconcile import Reconciler
from blackwell_operator.handlers.redeliver import offer_again
from blackwell_operator.lifecycle.convergence import needs_reconcile
from blackwell_operator.settings import operator_environment

FIRST_BACKOFF_S = 1.0
# How often the watchers' events that did not go through are offered again (while there are any).
REOFFER_S = 2 * FIRST_BACKOFF_S


@dataclass
class _Waiting:
    """A BTJ that has not converged: since when it has been quiet, and how many passes it has had."""

    resource_version: str
    since: float
    attempts: int = 0


class Resync:
    """The loop's state: the BTJs waiting, by uid."""

    def __init__(self, ctx: OperatorContext, interval_s: float, logger: Logger) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self.logger = logger
        self._waiting: dict[str, _Waiting] = {}
        # uid -> (resourceVersion, needs_reconcile's answer): a round every half second asks about every
        # BTJ, and a BTJ that has not changed since the last round has the same answer.
        self._verdicts: dict[str, tuple[str, str | None]] = {}
        self._offered_at = 0.0  # when the watchers' kept events were last offered again

    def backoff(self, attempts: int) -> float:
        """Seconds of quiet before pass number `attempts + 1`: 1 s doubling up to the interval."""
        return float(min(self.interval_s, FIRST_BACKOFF_S * 2**attempts))

    def due(self, now: float) -> list[Mapping[str, Any]]:
        """The BTJs to reconcile now (and the bookkeeping of the others)."""
        seen = self.ctx.known_btjs()
        for uid in set(self._waiting) - set(seen):
            del self._waiting[uid]
        for uid in set(self._verdicts) - set(seen):
            del self._verdicts[uid]
        ready = []
        for uid, btj in seen.items():
            rv = str((btj.get("metadata") or {}).get("resourceVersion") or "")
            if self._why(uid, rv, btj) is None:
                self._waiting.pop(uid, None)
                continue
            waiting = self._waiting.get(uid)
            if waiting is None or waiting.resource_version != rv:
                # New, or changed since: something is at work on it (Kopf's handlers, a watcher).
                attempts = waiting.attempts if waiting is not None else 0
                self._waiting[uid] = _Waiting(rv, now, attempts)
                continue
            if now - waiting.since >= self.backoff(waiting.attempts):
                ready.append(btj)
        return ready

    def _why(self, uid: str, rv: str, btj: Mapping[str, Any]) -> str | None:
        """needs_reconcile(btj), asked once per resourceVersion of the BTJ (a version never changes)."""
        verdict = self._verdicts.get(uid)
        if verdict is None or verdict[0] != rv or not rv:
            verdict = self._verdicts[uid] = (rv, needs_reconcile(btj))
        return verdict[1]

    def pass_for(self, btj: Mapping[str, Any]) -> None:
        """One reconcile of a BTJ (in a worker thread), from the BTJ as it is now."""
        meta = btj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        current = self.ctx.api.get(btj_path(meta["namespace"], meta["name"]))
        if current is None or current["metadata"].get("uid") != uid:
            return
        self.ctx.note_btj(current)
        why = needs_reconcile(current)
        waiting = self._waiting.get(uid)
        if why is None:
            self._waiting.pop(uid, None)
            return
        if waiting is not None:
            waiting.attempts += 1
            waiting.since = time.monotonic()
            waiting.resource_version = str(current["metadata"].get("resourceVersion") or "")
        self.logger.info(f"Resync: reconciling {meta['namespace']}/{meta['name']}: {why}")
        Reconciler(self.ctx, direct_events=True).reconcile_now(current, logger=self.logger, wait=False)

    async def round(self) -> None:
        """Reconcile every BTJ that is due, one at a time (a pass is short; the API is shared); then the
        watchers' events that did not go through (handlers/redeliver.py), at most every REOFFER_S."""
        for btj in self.due(time.monotonic()):
            try:
                await asyncio.to_thread(self.pass_for, btj)
            except Exception as exc:  # one BTJ's failure must not skip the others
                self.ctx.metrics.record_error("ResyncError")
                self.logger.warning(f"Resync of {btj['metadata'].get('name')} failed: {exc!r}")
        now = time.monotonic()
        kept = self.ctx.unrecorded(PODS) or self.ctx.unrecorded(CHILDREN)
        if kept and now - self._offered_at >= REOFFER_S:
            self._offered_at = now
            try:
                await asyncio.to_thread(offer_again, self.ctx, self.logger)
            except Exception as exc:  # the next round offers them again
                self.ctx.metrics.record_error("ResyncError")
                self.logger.warning(f"Offering the watchers' failed events again failed: {exc!r}")


def resync_interval() -> float:
    """The resync loop's longest backoff (`BTJ_CHILD_RETRY_INTERVAL_S`, default 60)."""
    return operator_environment().child_retry_interval_s


def tick(interval_s: float) -> float:
    """How often the loop looks: often enough for the first backoff, never more than the interval."""
    return min(FIRST_BACKOFF_S / 2, interval_s)


async def resync_forever(ctx: OperatorContext, interval_s: float, logger: Logger) -> None:
    """The loop, for the operator's lifetime."""
    resync = Resync(ctx, interval_s, logger)
    await every(tick(interval_s), resync.round, logger, "Resync")

"""A watch request answered with HTTP 410 is restarted like the in-stream 410 event, not fatal.

Kopf restarts a watch when a `410 Gone` ERROR event arrives inside the stream (the resourceVersion it
resumes from is too old: it lists again and watches from there). An API server, or a proxy before it,
may instead answer the watch request itself with HTTP 410; Kopf 1.45 (and its main branch, read
2026-12-01) raises that out of the watcher as an APIClientError, and the whole operator stops. This
wrapper turns that answer into the ERROR event Kopf already handles, so the same restart path runs:
back off `settings.watching.reconnect_backoff`, list, watch. It wraps Kopf's `watch_objs`, an internal
function (through handlers/kopf_private.py), which is why the project pins `kopf<2`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from blackwell_operator.handlers.kopf_private import errors, watching

GONE = 410
_original = watching.watch_objs


async def watch_objs_surviving_gone(**kwargs: Any) -> AsyncIterator[Any]:
    """Kopf's watch_objs, with an HTTP 410 answer yielded as the in-stream ERROR event of code 410."""
    try:
        async for raw_input in _original(**kwargs):
            yield raw_input
    except errors.APIClientError as exc:
        if exc.status != GONE:
            raise
        yield {
            "type": "ERROR",
            "object": {"code": GONE, "status": "Failure", "reason": "Expired", "message": str(exc)},
        }


def install() -> None:
    """Put the wrapper in place of Kopf's watch_objs (once; continuous_watch looks it up at each call)."""
    watching.watch_objs = watch_objs_surviving_gone

"""Operator-wide background loops: one round every interval, for the operator's lifetime."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from blackwell_operator.handlers.logs import Logger


async def every(interval_s: float, round_: Callable[[], Awaitable[Any]], logger: Logger, what: str) -> None:
    """Await `round_()` every `interval_s` until cancelled; a failed round is logged, not fatal."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await round_()
        except Exception as exc:  # one bad round must not end the loop for the operator's lifetime
            logger.error(f"{what} failed: {type(exc).__name__}: {exc}")

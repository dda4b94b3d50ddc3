"""The one retry policy for the operator's API calls: what to try again, how long to wait, what to log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import tenacity

from blackwell_operator.handlers.api import ApiError
from blackwell_operator.handlers.logs import Logger

T = TypeVar("T")

# A blip (a lost race, a restarting API server, throttling) clears within seconds: a few quick tries with
# jittered exponential waits, then the caller's own slower path (Kopf's handler retry, the resync loop,
# the object's next event) takes over. Bounded, so that no worker is held through an outage.
ATTEMPTS = 5
# A conflict is someone else's write landing first: progress, not trouble. Counting it against ATTEMPTS
# lost writes whenever several writers raced one object (four writers of the cluster calibration lost a
# sample under load: a writer can lose once to every other writer's every write). Conflicts get their own,
# larger budget; MAX_TOTAL_S bounds both.
CONFLICT_ATTEMPTS = 40
FIRST_WAIT_S = 0.1
MAX_WAIT_S = 2.0
MAX_TOTAL_S = 10.0
CONFLICT_JITTER_S = 0.02


def transient(exc: BaseException) -> bool:
    """Whether waiting and trying again can help: a conflict, a 5xx, throttling, no answer at all."""
    return isinstance(exc, ApiError) and exc.retryable


def refused(exc: BaseException) -> bool:
    """A 4xx that no retry of the same request fixes by itself (admission webhook, RBAC, quota, schema).

    It may still land later, once the cause is lifted: the operator reports it and tries again slowly.
    """
    return isinstance(exc, ApiError) and 400 <= exc.status < 500 and not exc.retryable


def _log_retry(what: str, logger: Logger) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        # Conflicts are expected (two writers share a BTJ's status): one INFO line, no traceback.
        level = logging.INFO if isinstance(exc, ApiError) and exc.status == 409 else logging.WARNING
        logger.log(level, f"{what}: {exc}; try {state.attempt_number + 1} in {wait:.2f} s")

    return before_sleep


_BACKOFF = tenacity.wait_exponential(multiplier=FIRST_WAIT_S, max=MAX_WAIT_S) + tenacity.wait_random(
    0.0, FIRST_WAIT_S
)
_CONFLICT = tenacity.wait_random(0.0, CONFLICT_JITTER_S)


def _wait(state: tenacity.RetryCallState) -> float:
    # A conflict says newer data is there to read: re-read at once (a little jitter keeps two writers
    # from colliding again). Anything else is the server's trouble: back off.
    exc = state.outcome.exception() if state.outcome is not None else None
    if _conflict(exc):
        return float(_CONFLICT(state))
    return float(_BACKOFF(state))


def _conflict(exc: BaseException | None) -> bool:
    return isinstance(exc, ApiError) and exc.status == 409


def _stop(attempts: int) -> Callable[[tenacity.RetryCallState], bool]:
    """Stop after `attempts` tries that failed on something other than a conflict, after `attempts` x
    CONFLICT_ATTEMPTS / ATTEMPTS conflicts (attempts=1, no retry, stays no retry), or after MAX_TOTAL_S."""
    conflict_budget = max(1, attempts * CONFLICT_ATTEMPTS // ATTEMPTS)
    failed = {"conflicts": 0, "other": 0}

    def stop(state: tenacity.RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome is not None else None
        failed["conflicts" if _conflict(exc) else "other"] += 1
        if attempts <= 1:
            return True
        return (
            failed["other"] >= attempts
            or failed["conflicts"] >= conflict_budget
            or (state.seconds_since_start or 0.0) >= MAX_TOTAL_S
        )

    return stop


def retrying(what: str, logger: Logger, *, attempts: int = ATTEMPTS) -> tenacity.Retrying:
    """The policy: retry transient API errors (conflicts at once, the rest with jittered exponential
    backoff), then re-raise the last."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(transient),
        wait=_wait,
        stop=_stop(attempts),
        before_sleep=_log_retry(what, logger),
        reraise=True,
    )


def call(what: str, logger: Logger, fn: Callable[[], T], *, attempts: int = ATTEMPTS) -> T:
    """`fn()` under the policy: an idempotent unit (one request, or a read-modify-write) retried whole."""
    return retrying(what, logger, attempts=attempts)(fn)

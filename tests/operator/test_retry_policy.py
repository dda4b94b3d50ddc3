"""The one retry policy: conflicts are progress and get their own budget; other errors stop at five."""

from __future__ import annotations

import logging

import pytest
import tenacity

from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError

LOG = logging.getLogger("test")


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    # The waits are the policy's business, not these tests': what is retried, and how often, is.
    monkeypatch.setattr(retrying, "_BACKOFF", tenacity.wait_none())
    monkeypatch.setattr(retrying, "_CONFLICT", tenacity.wait_none())


def failing(errors: list[ApiError]) -> tuple[list[int], object]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "done"

    return calls, fn


def test_a_run_of_conflicts_longer_than_the_attempts_still_lands() -> None:
    # Four writers racing one object: one writer can lose to each other writer's every write.
    calls, fn = failing([ApiError(409, "Conflict", "modified")] * 12)
    assert retrying.call("write", LOG, fn) == "done"  # type: ignore[arg-type]
    assert len(calls) == 13


def test_other_transient_errors_stop_after_the_attempts() -> None:
    calls, fn = failing([ApiError(503, "Unavailable", "down")] * 10)
    with pytest.raises(ApiError) as raised:
        retrying.call("write", LOG, fn)  # type: ignore[arg-type]
    assert raised.value.status == 503 and len(calls) == retrying.ATTEMPTS


def test_conflicts_have_a_bound_too() -> None:
    calls, fn = failing([ApiError(409, "Conflict", "modified")] * 1000)
    with pytest.raises(ApiError):
        retrying.call("write", LOG, fn)  # type: ignore[arg-type]
    assert len(calls) == retrying.CONFLICT_ATTEMPTS


def test_conflicts_do_not_spend_the_other_errors_budget() -> None:
    errors = [ApiError(409, "Conflict", "m")] * 8 + [ApiError(500, "Internal", "e")] * (retrying.ATTEMPTS - 1)
    calls, fn = failing(errors)
    assert retrying.call("write", LOG, fn) == "done"  # type: ignore[arg-type]
    assert len(calls) == len(errors) + 1


def test_one_attempt_means_no_retry_even_on_a_conflict() -> None:
    calls, fn = failing([ApiError(409, "Conflict", "modified")])
    with pytest.raises(ApiError):
        retrying.call("write", LOG, fn, attempts=1)  # type: ignore[arg-type]
    assert len(calls) == 1


def test_a_refusal_is_never_retried() -> None:
    calls, fn = failing([ApiError(422, "Invalid", "webhook said no")])
    with pytest.raises(ApiError):
        retrying.call("write", LOG, fn)  # type: ignore[arg-type]
    assert len(calls) == 1

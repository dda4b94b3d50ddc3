"""metav1.Time: RFC 3339 in UTC at second precision, the one format every time in status and Events uses."""

from __future__ import annotations

import datetime
from typing import Any

# What the API server writes for metav1.Time (Go's time.RFC3339 in UTC, no fraction).
RFC3339_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_rfc3339(moment: datetime.datetime) -> str:
    """A moment as metav1.Time."""
    return moment.astimezone(datetime.UTC).strftime(RFC3339_FORMAT)


def now_rfc3339() -> str:
    """The current time as metav1.Time (second precision, UTC)."""
    return format_rfc3339(datetime.datetime.now(datetime.UTC))


def rfc3339_seconds(timestamp: Any) -> float | None:
    """A metav1.Time (or any RFC 3339 time) as Unix seconds; None when absent or unreadable."""
    try:
        return datetime.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

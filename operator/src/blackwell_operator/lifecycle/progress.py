"""Progress and time left: step, planned steps, percent and an ETA from the step time between two readings."""

from __future__ import annotations

import datetime
from typing import Any

from blackwell_operator.lifecycle.measure import Reading
from blackwell_operator.timefmt import format_rfc3339


def short_duration(seconds: float) -> str:
    """1d2h, 3h04m, 12m, 45s: the printer column's and the health message's time left."""
    s = max(0, round(seconds))
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m" if minutes else f"{secs}s"


def progress_of(earlier: Reading | None, later: Reading, now: datetime.datetime) -> dict[str, Any] | None:
    """status.progress from the latest reading (and the one before it, for the step time), else None.

    The step time is measured, not planned: the wall time between the two readings over the steps taken
    in it (checkpoints and data stalls included, as the time left will include them). Without two readings
    that moved (the first reading, a stalled or restarted container) only the step and percent are given.
    `now` is timezone-aware; the ETA is written as metav1.Time (UTC).
    """
    if later.step is None or not later.planned_steps:
        return None
    step, total = min(later.step, later.planned_steps), later.planned_steps
    out: dict[str, Any] = {"step": step, "totalSteps": total, "percent": round(100.0 * step / total, 1)}
    if earlier is None or earlier.step is None or later.step <= earlier.step or later.at <= earlier.at:
        return out
    step_time = (later.at - earlier.at) / (later.step - earlier.step)
    left = (total - step) * step_time
    eta = format_rfc3339(now + datetime.timedelta(seconds=left))
    out.update(
        stepTimeSeconds=round(step_time, 3),
        remainingSeconds=round(left),
        remaining=short_duration(left),
        eta=eta,
    )
    return out


def finished(total_steps: int) -> dict[str, Any]:
    """status.progress of a job that succeeded: the trainer only ends well after its last step."""
    return {
        "step": total_steps,
        "totalSteps": total_steps,
        "percent": 100.0,
        "remainingSeconds": 0,
        "remaining": "0s",
    }

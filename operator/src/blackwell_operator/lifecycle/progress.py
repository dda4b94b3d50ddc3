"""Progress and time left: step, planned steps, percent and an ETA from the step time between two readings."""

from __future__ import annotations

import datetime

from blackwell_operator.lifecycle.measure import Reading
from blackwell_operator.models.status import JobProgress
from blackwell_operator.timefmt import format_rfc3339

# A time left beyond a century is no estimate (a pod reporting an absurd planned-step count), and beyond
# the year 9999 no datetime holds its ETA: computing one raised and cost the job its whole reading.
MAX_LEFT_S = 100 * 365 * 86400


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


def progress_of(earlier: Reading | None, later: Reading, now: datetime.datetime) -> JobProgress | None:
    """status.progress from the latest reading (and the one before it, for the step time), else None.

    The step time is measured, not planned: the wall time between the two readings over the steps taken
    in it (checkpoints and data stalls included, as the time left will include them). Without two readings
    that moved (the first reading, a stalled or restarted container) only the step and percent are given.
    `now` is timezone-aware; the ETA is written as metav1.Time (UTC).
    """
    if later.step is None or not later.planned_steps:
        return None
    step, total = min(later.step, later.planned_steps), later.planned_steps
    out = JobProgress(step=step, total_steps=total, percent=round(100.0 * step / total, 1))
    if earlier is None or earlier.step is None or later.step <= earlier.step or later.at <= earlier.at:
        return out
    step_time = (later.at - earlier.at) / (later.step - earlier.step)
    left = (total - step) * step_time
    out.step_time_seconds = round(step_time, 3)
    if left > MAX_LEFT_S:
        return out  # no job has that long left: the pod's planned steps are not a plan's
    out.remaining_seconds = round(left)
    out.remaining = short_duration(left)
    out.eta = format_rfc3339(now + datetime.timedelta(seconds=left))
    return out


def finished(total_steps: int) -> JobProgress:
    """status.progress of a job that succeeded: the trainer only ends well after its last step."""
    return JobProgress(
        step=total_steps, total_steps=total_steps, percent=100.0, remaining_seconds=0, remaining="0s"
    )


def as_status(progress: JobProgress) -> dict[str, object]:
    """`progress` as status.progress stores it (the keys it has), to compare with the stored one."""
    return progress.model_dump(by_alias=True, exclude_unset=True, mode="json")

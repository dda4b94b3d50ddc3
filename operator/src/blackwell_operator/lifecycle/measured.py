"""status.measured and status.progress from a reading of a running trainer pod (pure; the measure loop,
handlers/measure.py, reads the pods and writes what this returns)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.lifecycle.failures import belongs_to
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.lifecycle.progress import as_status
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.models.status import JobProgress, MeasuredThroughput, Phase, StatusChange

# A reading this close to the stored one is not written (a status write per job per minute otherwise).
UNCHANGED = 0.01


def _close(stored: MeasuredThroughput | None, tokens_per_s: float, mfu: float | None) -> bool:
    """Whether a reading is within 1% (tokens/s) and 0.01 (MFU) of the stored one."""
    if stored is None:
        return False
    before, before_mfu = stored.tokens_per_second_per_gpu, stored.model_flops_utilization
    if not before or abs(tokens_per_s - before) > UNCHANGED * before:
        return False
    if mfu is None or before_mfu is None:
        return mfu is None and before_mfu is None
    return abs(mfu - before_mfu) <= UNCHANGED


def measured_changes(
    btj: Mapping[str, Any],
    pod: Mapping[str, Any],
    tokens_per_s: float | None,
    mfu: float | None,
    now: str,
    progress: JobProgress | None = None,
    *,
    found: Lineage | None,
) -> StatusChange | None:
    """status.measured (when it moved) and status.progress (when it changed) from a reading of `pod`, when
    it is this BTJ's running worker (`found`: the pod's verified owner chain). The progress replaces the
    stored one whole: a time left from before a restart is never shown beside a newer step."""
    stored = read_status(btj.get("status")).status
    if stored.phase != Phase.RUNNING or not belongs_to(pod, btj, found):
        return None
    change = StatusChange()
    if progress is not None and (
        stored.progress is None or as_status(stored.progress) != as_status(progress)
    ):
        change.progress = progress
    if tokens_per_s is not None and not _close(stored.measured, tokens_per_s, mfu):
        measured = MeasuredThroughput(tokens_per_second_per_gpu=round(tokens_per_s, 1), observed_at=now)
        if mfu is not None:
            measured.model_flops_utilization = round(mfu, 4)
        change.measured = measured
    return change if change.model_fields_set else None

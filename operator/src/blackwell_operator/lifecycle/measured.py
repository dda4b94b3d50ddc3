"""What a reading of a running trainer pod teaches: status.measured and status.progress (and a probed job's
printer columns while only its pods know the winner), and the job's measured-over-modelled sample for the
cluster calibration (pure; the measure loop, handlers/measure.py, reads the pods, writes the status and
records the sample)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from blackwell_operator.calibration.cluster import ImplausibleSample, Sample, unphysical
from blackwell_operator.lifecycle.failures import belongs_to
from blackwell_operator.lifecycle.measure import Reading
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.lifecycle.plan_columns import put_columns
from blackwell_operator.lifecycle.progress import as_status
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.models.status import JobProgress, MeasuredThroughput, Phase, StatusChange
from blackwell_operator.planner.cluster_figures import candidate_figures, figures_of, probe_winner
from blackwell_trainer.plan.config import Plan, ProbeCandidate

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
    reading: Reading | None = None,
) -> StatusChange | None:
    """status.measured (when it moved) and status.progress (when it changed) from a reading of `pod`, when
    it is this BTJ's running worker (`found`: the pod's verified owner chain). The progress replaces the
    stored one whole: a time left from before a restart is never shown beside a newer step. While a probed
    job's result is not recorded yet, the printer columns follow the winner `reading` names
    (`exported_option`)."""
    stored = read_status(btj.get("status")).status
    if stored.phase != Phase.RUNNING or not belongs_to(pod, btj, found):
        return None
    change = StatusChange()
    plan = stored.plan
    if plan is not None and reading is not None and probe_winner(plan) is None:
        exported = exported_option(plan, reading)
        if exported is not None:
            put_columns(change, stored, exported.candidate, exported.prediction)
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


# Readings before this many steps of a container include torch.compile and allocator warm-up: not what
# the plan predicts, so they teach the cluster calibration nothing.
WARMUP_STEPS = 3


def sample_of(
    btj: Mapping[str, Any], earlier: Reading, later: Reading, tokens_per_s: float, now: str
) -> Sample | None:
    """The job's measured over modelled figures for the cluster calibration, once past its warm-up.

    The plan's prediction already carries any correction it was planned with; the ratios are taken against
    the model's own figures (planner/cluster_figures.py), so the calibration never chases its own
    corrections. An unreadable stored plan teaches nothing; ImplausibleSample for a reading no GPU can
    give (`unphysical`).
    """
    meta, stored = btj.get("metadata") or {}, read_status(btj.get("status")).status
    if stored.phase != Phase.RUNNING or earlier.pod_steps < WARMUP_STEPS:
        return None
    plan = stored.plan
    if plan is None:
        return None
    figures = figures_of(plan)
    if plan.probe is not None and plan.probe.enabled:
        # A probed job trains with the probe's winner: its figures are the ones to compare with. The
        # operator's own copy of the result (from a termination message) first; while the first run goes
        # on, the winner its pod exports; neither known, the reading teaches nothing.
        won = probe_winner(plan) or reported_winner(plan, earlier, later)
        if won is None:
            return None
        figures = candidate_figures(won)
        plan = plan.model_copy(update={"chosen": won.candidate, "predicted": won.prediction})
    modelled, peak = figures.modelled_tokens_per_second_per_gpu, figures.modelled_peak_reserved
    if modelled <= 0:
        return None
    problem = unphysical(plan, tokens_per_s, later.reserved_bytes)
    if problem is not None:
        raise ImplausibleSample(f"{meta.get('namespace')}/{meta.get('name')}: {problem}")
    return Sample(
        job=f"{meta.get('namespace')}/{meta.get('name')}",
        uid=str(meta.get("uid")),
        instance_type=plan.instance_type,
        precision_recipe=plan.chosen.precision_recipe,
        activation_checkpointing=plan.chosen.activation_checkpointing,
        tokens_ratio=round(tokens_per_s / modelled, 4),
        memory_ratio=round(later.reserved_bytes / peak, 4) if later.reserved_bytes and peak else None,
        observed_at=now,
    )


def exported_option(plan: Plan, reading: Reading) -> ProbeCandidate | None:
    """The probe option a running pod says it trains with (btj_trainer_probe_winner), when the prediction it
    exports beside it is that option's: a pod of another plan's candidates (a re-planned job's old pod), one
    that has not finished probing, or a plan without a probe names none."""
    probe, index = plan.probe, reading.probe_winner
    if probe is None or not probe.enabled or index is None or index >= len(probe.options):
        return None
    won = probe.options[index]
    tokens, peak = reading.predicted_tokens_per_second, reading.predicted_peak_reserved
    if tokens is None or peak is None:
        return None
    # Exported as the trainer's float and int: the same figures to the last bit, but for the gauge's float.
    same_tokens = math.isclose(tokens, won.prediction.tokens_per_second_per_gpu, rel_tol=1e-9)
    return won if same_tokens and peak == won.prediction.memory.peak_reserved else None


def reported_winner(plan: Plan, earlier: Reading, later: Reading) -> ProbeCandidate | None:
    """`exported_option` of a pair of readings that both name it: a rate between them is that option's."""
    won = exported_option(plan, later)
    return won if won is not None and earlier.probe_winner == later.probe_winner else None

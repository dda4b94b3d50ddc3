"""The plan in status and its printer-column copies, which name what the job trains: the probe's winner once
the plan records it (or, during its first run, its pods say it), else the planner's pick."""

from __future__ import annotations

from blackwell_operator.models.status import BlackwellTrainingJobStatus, StatusChange
from blackwell_operator.planner.cluster_figures import probe_winner
from blackwell_trainer.plan.config import Candidate, Plan, Prediction


def trained(plan: Plan) -> tuple[Candidate, Prediction]:
    """The configuration the job trains with and its prediction: the probe's winner where the plan holds its
    result (the trainer's own rule, `probe_winner`), else the planner's pick."""
    won = probe_winner(plan)
    return (plan.chosen, plan.predicted) if won is None else (won.candidate, won.prediction)


def put_plan(change: StatusChange, plan: Plan) -> None:
    """Write `plan` into `change` with the copies `kubectl get btj` shows (Nodes, Precision, MBS, AC, and with
    -o wide the predicted tokens/s and MFU), taken from what the job trains: a probe that chose another
    candidate must not leave the pick's there."""
    change.plan = plan  # written as the merge patch from the stored one (lifecycle/status_patch.py)
    change.nodes = plan.nodes
    put_columns(change, None, *trained(plan))


def put_columns(
    change: StatusChange, stored: BlackwellTrainingJobStatus | None, won: Candidate, prediction: Prediction
) -> None:
    """The printer columns of `won` and its prediction; with `stored`, only those that say otherwise there."""
    columns = {
        "precision": won.precision.value,
        "micro_batch_size": won.micro_batch_size,
        "activation_checkpointing": won.activation_checkpointing.value,
        "predicted_tokens_per_second_per_gpu": round(prediction.tokens_per_second_per_gpu, 1),
        "predicted_model_flops_utilization": round(prediction.model_flops_utilization, 4),
    }
    for field, value in columns.items():
        if stored is None or getattr(stored, field) != value:
            setattr(change, field, value)


def missing_columns(change: StatusChange, stored: BlackwellTrainingJobStatus) -> None:
    """The copies a status written by an older operator lacks (the predicted ones), from its stored plan:
    `kubectl get btj -o wide` shows them without waiting for the next plan."""
    if stored.plan is not None and stored.predicted_tokens_per_second_per_gpu is None:
        put_columns(change, stored, *trained(stored.plan))

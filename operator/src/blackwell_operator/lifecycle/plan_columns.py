"""The plan in status and its printer-column copies, which name what the job trains: the probe's winner once
the plan records it, else the planner's pick."""

from __future__ import annotations

from blackwell_operator.models.status import StatusChange
from blackwell_operator.planner.cluster_figures import probe_winner
from blackwell_trainer.plan.config import Candidate, Plan


def trained(plan: Plan) -> Candidate:
    """The configuration the job trains with: the probe's winner where the plan holds its result (the
    trainer's own rule, `probe_winner`), else the planner's pick."""
    won = probe_winner(plan)
    return plan.chosen if won is None else won.candidate


def put_plan(change: StatusChange, plan: Plan) -> None:
    """Write `plan` into `change` with the copies `kubectl get btj` shows (Nodes, Precision, MBS, AC), taken
    from what the job trains: a probe that chose another candidate must not leave the pick's there."""
    won = trained(plan)
    change.plan = plan  # written as the merge patch from the stored one (lifecycle/status_patch.py)
    change.nodes = plan.nodes
    change.precision = won.precision.value
    change.micro_batch_size = won.micro_batch_size
    change.activation_checkpointing = won.activation_checkpointing.value

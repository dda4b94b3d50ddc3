"""Plans for render tests, from the real planner (pure and fast, so no hand-built fixtures)."""

from __future__ import annotations

from blackwell_operator.models import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_trainer.config import Plan


def plan_for(spec: BlackwellTrainingJobSpec, job_name: str = "btj") -> Plan:
    """The plan the operator would write to status for this spec."""
    return plan_job(spec, job_name=job_name)

"""The printer-column copies of the plan in status name what the job trains: the probe's winner once the
plan records it, the planner's pick before and when the recorded result is not this plan's."""

from __future__ import annotations

from blackwell_operator.lifecycle.plan_columns import put_plan, trained
from blackwell_operator.models.status import StatusChange
from blackwell_trainer.plan.config import Plan, ProbeResult
from tests.support.plans import probed_plan


def _with(plan: Plan, result: ProbeResult) -> Plan:
    assert plan.probe is not None
    return plan.model_copy(update={"probe": plan.probe.model_copy(update={"result": result})})


def test_the_columns_follow_the_recorded_winner() -> None:
    plan = probed_plan()
    assert plan.probe is not None
    won = plan.probe.options[1].candidate
    assert trained(plan) == plan.chosen  # no result yet: the pick
    change = StatusChange()
    put_plan(change, _with(plan, ProbeResult(winner=1, chosen=won, seconds=90.0)))
    assert (change.precision, change.micro_batch_size, change.activation_checkpointing) == (
        won.precision.value,
        won.micro_batch_size,
        won.activation_checkpointing.value,
    )
    assert change.plan is not None and change.plan.chosen == plan.chosen  # the plan itself keeps its pick
    assert change.nodes == plan.nodes


def test_a_result_that_is_not_this_plan_s_leaves_the_pick() -> None:
    # A re-plan made other candidates: the old result's configuration is not the option at its index.
    plan = probed_plan()
    assert plan.probe is not None
    other = plan.probe.options[1].candidate.model_copy(update={"micro_batch_size": 99})
    assert trained(_with(plan, ProbeResult(winner=1, chosen=other, seconds=90.0))) == plan.chosen
    assert trained(_with(plan, ProbeResult(winner=len(plan.probe.options), seconds=90.0))) == plan.chosen

"""The printer-column copies of the plan in status name what the job trains: the probe's winner once the
plan records it, the planner's pick before and when the recorded result is not this plan's."""

from __future__ import annotations

from blackwell_operator.lifecycle.plan_columns import missing_columns, put_plan, trained
from blackwell_operator.models.status import BlackwellTrainingJobStatus, StatusChange
from blackwell_trainer.plan.config import Plan, ProbeResult
from tests.support.plans import probed_plan


def _with(plan: Plan, result: ProbeResult) -> Plan:
    assert plan.probe is not None
    return plan.model_copy(update={"probe": plan.probe.model_copy(update={"result": result})})


def test_the_columns_follow_the_recorded_winner() -> None:
    plan = probed_plan()
    assert plan.probe is not None
    option = plan.probe.options[1]
    won = option.candidate
    assert trained(plan) == (plan.chosen, plan.predicted)  # no result yet: the pick
    change = StatusChange()
    put_plan(change, _with(plan, ProbeResult(winner=1, chosen=won, seconds=90.0)))
    assert (change.precision, change.micro_batch_size, change.activation_checkpointing) == (
        won.precision.value,
        won.micro_batch_size,
        won.activation_checkpointing.value,
    )
    assert change.predicted_tokens_per_second_per_gpu == round(option.prediction.tokens_per_second_per_gpu, 1)
    assert change.predicted_model_flops_utilization == round(option.prediction.model_flops_utilization, 4)
    assert change.plan is not None and change.plan.chosen == plan.chosen  # the plan itself keeps its pick
    assert change.nodes == plan.nodes


def test_a_result_that_is_not_this_plan_s_leaves_the_pick() -> None:
    # A re-plan made other candidates: the old result's configuration is not the option at its index.
    plan = probed_plan()
    assert plan.probe is not None
    other = plan.probe.options[1].candidate.model_copy(update={"micro_batch_size": 99})
    assert trained(_with(plan, ProbeResult(winner=1, chosen=other, seconds=90.0)))[0] == plan.chosen
    assert trained(_with(plan, ProbeResult(winner=len(plan.probe.options), seconds=90.0)))[0] == plan.chosen


def test_a_status_from_an_older_operator_gets_the_predicted_copies_from_its_stored_plan() -> None:
    plan = probed_plan()
    stored = BlackwellTrainingJobStatus(
        plan=plan,
        precision=plan.chosen.precision.value,
        micro_batch_size=plan.chosen.micro_batch_size,
        activation_checkpointing=plan.chosen.activation_checkpointing.value,
    )
    change = StatusChange()
    missing_columns(change, stored)
    assert change.model_fields_set == {
        "predicted_tokens_per_second_per_gpu",
        "predicted_model_flops_utilization",
    }
    assert change.predicted_tokens_per_second_per_gpu == round(plan.predicted.tokens_per_second_per_gpu, 1)
    assert change.plan is None  # the stored plan stays as it is
    filled = stored.model_copy(update={"predicted_tokens_per_second_per_gpu": 1.0})
    untouched = StatusChange()
    missing_columns(untouched, filled)
    assert not untouched.model_fields_set

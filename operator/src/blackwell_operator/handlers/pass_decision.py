"""A reconcile pass's decision from what it read: its plan, then what it does with it; no API call here.

The pass reads its inputs once (pass_inputs.read_inputs), plans from them (`plan_of`), reads what the
cluster offers that plan (pass_inputs.read_surroundings), then decides (`decide_pass`): the outcome to
write and, when children are to be made or kept, the spec to render them from. Reconciler makes the calls.
"""

from __future__ import annotations

from dataclasses import replace

from blackwell_operator.errors import SpecError
from blackwell_operator.handlers.pass_inputs import PassInputs, Surroundings, spec_refusal
from blackwell_operator.handlers.planning import plan_within
from blackwell_operator.lifecycle import outcome as outcomes
from blackwell_operator.lifecycle.backends import none_served_message, with_backend
from blackwell_operator.lifecycle.global_batch import recorded
from blackwell_operator.lifecycle.outcome import PassOutcome
from blackwell_operator.lifecycle.probe import with_probe_result
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_trainer.plan.config import Plan


def plan_of(inputs: PassInputs) -> Plan | PassOutcome:
    """The pass's plan, with this generation's probe choice (status.probe); the Invalid outcome when the
    spec does not plan."""
    try:
        plan = plan_within(
            inputs.spec,
            inputs.body["metadata"]["name"],
            correction=inputs.correction,
            cluster=inputs.cluster,
            schedulable=inputs.schedulable,
            current=inputs.kept,
            global_batch=inputs.batch,
        )
    except SpecError as exc:
        return outcomes.invalid(inputs.generation, exc.reason, spec_refusal(exc, inputs.body))
    # The choice this generation's probe made: the plan ConfigMap keeps it for a restart.
    return with_probe_result(plan, inputs.stored, inputs.generation)


def decide_pass(
    inputs: PassInputs, plan: Plan, seen: Surroundings
) -> tuple[PassOutcome, BlackwellTrainingJobSpec | None]:
    """The planned outcome, and the spec to make the children from (None: a dry run, or no job API served
    to make them with)."""
    spec = inputs.spec
    outcome = outcomes.planned(
        plan,
        inputs.generation,
        replanned=inputs.correction is not None,
        nodes=seen.nodes,
        aws=seen.aws,
        needed=plan.nodes,  # an elastic job's count may differ from spec.cluster.nodes
        queue_name=spec.queue_name,
    )
    batch = recorded(spec, plan, inputs.stored, inputs.generation)  # status.globalBatch, with the plan
    outcome = replace(outcome, backend=seen.backend, global_batch=batch)
    if spec.dry_run:
        return outcomes.dry_run(outcome), None
    if seen.backend is None:
        return outcomes.no_job_api(outcome, none_served_message(spec)), None
    return outcome, with_backend(spec, seen.backend)

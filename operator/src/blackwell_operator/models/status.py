"""The BlackwellTrainingJob status: phase, metav1.Condition-shaped conditions, the plan and the child."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from blackwell_trainer.plan.config import Candidate, OomResult, Plan, ProbeMeasurement, WireModel


class Phase(StrEnum):
    """Lifecycle of a BTJ, as printed by `kubectl get btj`."""

    PLANNING = "Planning"
    PLANNED = "Planned"
    PENDING = "Pending"
    QUEUED = "Queued"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"


class ConditionType(StrEnum):
    """Condition types the operator maintains."""

    PLANNED = "Planned"
    PLAN_VERIFIED = "PlanVerified"  # whether every choice of the plan was measured here (provenance)
    CHILD_CREATED = "ChildCreated"
    CAPACITY_AVAILABLE = "CapacityAvailable"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SPEC_APPLIED = "SpecApplied"
    KUEUE_MANAGED = "KueueManaged"  # only while spec.queueName is set
    # Only with BTJ_CHECK_IMAGE_PULL_SECRETS (reading Secrets is opt-in: lifecycle/references.py).
    IMAGE_PULL_SECRETS_FOUND = "ImagePullSecretsFound"


class Condition(WireModel):
    """A metav1.Condition."""

    type: str = Field(description="Condition type, e.g. Planned.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", description="CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str = Field(description="RFC 3339 time the status last changed.")
    observed_generation: int | None = Field(default=None, description="Generation this was computed for.")


class ChildReference(WireModel):
    """The job the operator created for this BTJ."""

    api_version: str = Field(description="API version of the child.")
    kind: str = Field(description="PyTorchJob, HyperPodPyTorchJob or TrainJob.")
    name: str = Field(description="Child name (same namespace).")
    uid: str | None = Field(default=None, description="Child UID.")
    config_map: str | None = Field(default=None, description="ConfigMap carrying the plan file.")


class MeasuredThroughput(WireModel):
    """The latest throughput the operator read back, beside the prediction."""

    tokens_per_second_per_gpu: float = Field(ge=0, description="Measured tokens/s per GPU.")
    model_flops_utilization: float | None = Field(default=None, ge=0, description="Measured MFU.")
    observed_at: str = Field(description="RFC 3339 time of the reading.")


class JobProgress(WireModel):
    """How far the running job is and how long it has left, from the trainer's step and its step time."""

    step: int = Field(ge=0, description="The job's last completed optimizer step (resumes included).")
    total_steps: int = Field(ge=1, description="Steps the plan runs (spec.training.steps).")
    percent: float = Field(ge=0, le=100, description="step / totalSteps, in percent.")
    step_time_seconds: float | None = Field(
        default=None, ge=0, description="Measured seconds per step between the last two readings."
    )
    remaining_seconds: int | None = Field(default=None, ge=0, description="Steps left times the step time.")
    remaining: str | None = Field(default=None, description="The same, short (e.g. 3h04m; printer column).")
    eta: str | None = Field(default=None, description="RFC 3339 time the last step should end.")


# status.lastFailure.message is cut to this many characters (the CRD's maxLength).
FAILURE_MESSAGE_LIMIT = 512


class WorkerFailure(WireModel):
    """The latest trainer container that ended with a non-zero exit code, as its pod reported it."""

    pod: str = Field(description="Pod name (same namespace).")
    container: str = Field(description="Container name (the trainer's, pytorch).")
    exit_code: int = Field(description="Exit code (137 with reason OOMKilled: host memory, not GPU).")
    reason: str = Field(default="", description="The kubelet's reason, e.g. Error or OOMKilled.")
    message: str = Field(
        default="",
        max_length=FAILURE_MESSAGE_LIMIT,
        description="First non-empty line of the termination message (the trainer's one-line error, else "
        "the log's tail); may be empty.",
    )
    finished_at: str | None = Field(default=None, description="RFC 3339 time the container ended.")
    out_of_memory: OomResult | None = Field(
        default=None,
        description="The trainer's out-of-memory result (its termination message's btj-oom line), if it ran "
        "out of GPU memory.",
    )


# status.planHistory keeps this many re-plans, the oldest dropped first.
PLAN_HISTORY_LIMIT = 8


class MemoryCorrection(WireModel):
    """What out-of-memory runs taught the planner about this job: applied to every later plan of the spec
    generation it was learned on, and of later ones that keep the fields it was learned for."""

    generation: int = Field(ge=1, description="The spec generation it was learned on.")
    activation_scale: float = Field(
        default=1.0, ge=1.0, description="Factor on the predicted activation, loss and recompute bytes."
    )
    reserve_bytes: int = Field(default=0, ge=0, description="Bytes added to every candidate's peak.")
    excluded: list[Candidate] = Field(
        default_factory=list,
        description="Configurations that ran out of memory: never planned again, nor any larger micro-batch "
        "of the same family.",
    )
    replans: int = Field(default=0, ge=0, description="Re-plans made for this generation.")
    learned_for: str | None = Field(
        default=None,
        description="SHA-256 of the spec fields it was learned for (model, instance type, nodes, sequence "
        "length, precision, image): a later spec generation with the same fields keeps it.",
    )


class PlanChange(WireModel):
    """One re-plan: the plan that failed (or was resized), the plan that replaced it, and why."""

    at: str = Field(description="RFC 3339 time of the re-plan.")
    generation: int = Field(ge=1, description="The spec generation.")
    reason: str = Field(
        description="Why: OutOfMemory, Resized (an elastic job's node count changed), or SpecEdit (a user's "
        "edit changed the global batch: globalBatchBefore, globalBatchAfter)."
    )
    nodes_before: int | None = Field(default=None, ge=1, description="Nodes of the replaced plan (Resized).")
    nodes_after: int | None = Field(default=None, ge=1, description="Nodes of the new plan (Resized).")
    message: str = Field(default="", description="What was measured and what the correction is.")
    failed: Candidate | None = Field(
        default=None, description="The configuration that failed (SpecEdit: the one planned before)."
    )
    failed_summary: str = Field(default="", description="The failed plan in one line.")
    failed_child_uid: str | None = Field(default=None, description="UID of the child that ran it.")
    replacement: Candidate | None = Field(
        default=None, description="The configuration planned instead; none when nothing fits any more."
    )
    replacement_summary: str = Field(default="", description="The new plan in one line.")
    global_batch_before: int | None = Field(
        default=None, ge=1, description="Tokens per optimizer step before (SpecEdit)."
    )
    global_batch_after: int | None = Field(default=None, ge=1, description="Tokens per optimizer step after.")


class BatchSource(StrEnum):
    """Where a job's global batch came from."""

    PINNED = "Pinned"  # spec.training.globalBatchTokens
    RULE = "Rule"  # the planner's rule (docs/global-batch.md), from the model and the sequence length
    EARLIER_PLAN = "EarlierPlan"  # status.plan of an operator that did not store status.globalBatch yet


class GlobalBatch(WireModel):
    """The tokens per optimizer step the job trains, stored with it: every later plan of the job keeps
    them (an out-of-memory re-plan, a probe, a calibration change, a resize, an operator restart, an edit
    of other fields); only a user's edit of globalBatchTokens, the model or the sequence length changes
    them, and status.planHistory records that (docs/global-batch.md)."""

    tokens: int = Field(ge=1, description="Tokens per optimizer step.")
    source: BatchSource = Field(description="Pinned (spec.training.globalBatchTokens), Rule or EarlierPlan.")
    rule: str | None = Field(default=None, description="The rule and its version, when the rule chose it.")
    chosen_for: str = Field(
        description="SHA-256 of the spec fields the rule chose it for (the model and the sequence length): "
        "an edit of either chooses again."
    )
    generation: int = Field(ge=1, description="The spec generation it was set on.")


class ElasticStatus(WireModel):
    """What an elastic job's operator saw of the healthy nodes, and when it last resized (rate limit)."""

    schedulable: int | None = Field(default=None, ge=0, description="Healthy schedulable nodes last seen.")
    fewer_since: str | None = Field(
        default=None,
        description="With fewer schedulable nodes than the plan's: RFC 3339 time since when the node nearest "
        "to being lost has been gone (lost gracePeriodSeconds later, unless it comes back).",
    )
    more_since: str | None = Field(
        default=None,
        description="With more schedulable nodes than the plan's and scaleUp: RFC 3339 time since when the "
        "node nearest to counting for a scale-up has been up (it counts gracePeriodSeconds later).",
    )
    last_resize_at: str | None = Field(default=None, description="RFC 3339 time of the latest resize.")
    resizes: int = Field(default=0, ge=0, description="Resizes of this job so far.")
    waiting: str = Field(default="", description="Why a resize waits (grace period, cooldown, minNodes).")


class ProbedCandidate(ProbeMeasurement):
    """One configuration the trainer's probe timed: the planner's prediction beside the measurement."""

    configuration: Candidate = Field(description="The configuration (plan.probe's candidate or growth).")


class ProbeStatus(WireModel):
    """What the trainer's probe measured before the first step, and what the job trains with."""

    winner: int = Field(ge=0, description="Index of the candidate the job trains with (candidates[].index).")
    chosen: Candidate = Field(description="The configuration the job trains with.")
    pick_behind: float | None = Field(
        default=None,
        ge=0,
        description="How far the planner's pick measured behind the winner (0.03: 3% slower); none when the "
        "pick won or was not measured.",
    )
    candidates: list[ProbedCandidate] = Field(
        default_factory=list, description="Each candidate's prediction and measurement, in probe order."
    )
    seconds: float = Field(ge=0, description="Wall time of the whole probe.")
    stopped_early: bool = Field(default=False, description="The time budget ran out before every candidate.")
    child_uid: str | None = Field(default=None, description="UID of the child whose workers probed.")
    generation: int | None = Field(
        default=None,
        description="The spec generation it was probed for: a later plan of it keeps the choice.",
    )
    observed_at: str = Field(description="RFC 3339 time the operator read it from the pod.")
    summary: str | None = Field(
        default=None,
        description="What the operator concluded, in the words of its Event (every candidate out of memory, "
        "the figures refused, or the winner and how far the planner's pick was behind it).",
    )
    refused: str | None = Field(
        default=None,
        description="Why the probe's figures were refused (beyond what the GPU can do, or not numbers): none "
        "is kept, and the job trains the planner's pick (winner 0).",
    )


class BlackwellTrainingJobStatus(WireModel):
    """What the operator decided and observed."""

    phase: Phase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = Field(default=None, description="Last generation fully reconciled.")
    message: str | None = Field(default=None, description="One-line summary of the current state.")
    headline: str | None = Field(
        default=None,
        description="status.message without the latest worker failure the operator folds into it while the "
        "job restarts or has failed (what the phase's writer said).",
    )
    conditions: list[Condition] = Field(default_factory=list, description="metav1.Conditions.")
    plan: Plan | None = Field(default=None, description="The resolved plan.")
    child: ChildReference | None = Field(default=None, description="The child job.")
    backend: str | None = Field(
        default=None,
        description="The job kind in use: spec.backend, or the one `auto` chose from the APIs the cluster "
        "serves (PyTorchJob, HyperPodPyTorchJob or TrainJob).",
    )
    measured: MeasuredThroughput | None = Field(default=None, description="Latest measured throughput.")
    progress: JobProgress | None = Field(default=None, description="Step, percent and time left.")
    last_failure: WorkerFailure | None = Field(
        default=None, description="The latest worker failure (non-zero exit of the trainer container)."
    )
    memory_correction: MemoryCorrection | None = Field(
        default=None, description="Learned from out-of-memory runs; the planner applies it (docs/replan.md)."
    )
    plan_history: list[PlanChange] = Field(
        default_factory=list,
        max_length=PLAN_HISTORY_LIMIT,
        description=f"The latest re-plans (at most {PLAN_HISTORY_LIMIT}), oldest first.",
    )
    global_batch: GlobalBatch | None = Field(
        default=None,
        description="The global batch the job trains and where it came from; kept by every later plan "
        "(docs/global-batch.md).",
    )
    elastic: ElasticStatus | None = Field(
        default=None, description="An elastic job's view of the nodes and its resizes (docs/elastic.md)."
    )
    probe: ProbeStatus | None = Field(
        default=None, description="The trainer's probe of the top candidates and its winner (docs/probe.md)."
    )
    # Short copies for printer columns (JSONPath cannot reach into status.plan comfortably and
    # `kubectl get` should stay readable).
    nodes: int | None = Field(default=None, description="Nodes of the current plan (printer column).")
    precision: str | None = Field(default=None, description="Chosen precision (printer column).")
    micro_batch_size: int | None = Field(default=None, description="Chosen micro-batch (printer column).")
    activation_checkpointing: str | None = Field(default=None, description="Chosen AC mode (printer column).")
    predicted_tokens_per_second_per_gpu: float | None = Field(
        default=None,
        ge=0,
        description="Predicted tokens/s per GPU of the configuration the job trains (printer column): the "
        "plan's, or a probe's winner's once it is known (docs/probe.md).",
    )
    predicted_model_flops_utilization: float | None = Field(
        default=None, ge=0, description="Predicted MFU of the configuration the job trains (printer column)."
    )


class StatusChange(WireModel):
    """What one writer changes in a BTJ's status: a field left unset leaves its key alone, an explicit None
    deletes the key, anything else replaces it (lifecycle/status_patch.py turns it into the merge patch).

    Every field of BlackwellTrainingJobStatus, all optional; `conditions` is the whole list after the
    writer's upserts (the API server replaces lists in a merge patch).
    """

    phase: Phase | None = None
    observed_generation: int | None = None
    message: str | None = None
    headline: str | None = None
    conditions: list[Condition] | None = None
    plan: Plan | None = None
    child: ChildReference | None = None
    backend: str | None = None
    measured: MeasuredThroughput | None = None
    progress: JobProgress | None = None
    last_failure: WorkerFailure | None = None
    memory_correction: MemoryCorrection | None = None
    plan_history: list[PlanChange] | None = Field(default=None, max_length=PLAN_HISTORY_LIMIT)
    global_batch: GlobalBatch | None = None
    elastic: ElasticStatus | None = None
    probe: ProbeStatus | None = None
    nodes: int | None = None
    precision: str | None = None
    micro_batch_size: int | None = None
    activation_checkpointing: str | None = None
    predicted_tokens_per_second_per_gpu: float | None = None
    predicted_model_flops_utilization: float | None = None

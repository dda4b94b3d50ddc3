"""One reconcile pass's inputs, read once into one typed value (PassInputs) before anything is decided.

The BTJ's status is parsed once (lifecycle/status_read.read_btj) and everything the pass reads of it comes
from that parse: the memory correction of a re-plan, an elastic job's kept node count, the probe's choice,
the cluster correction a running generation keeps. The cluster reads that need the plan (node capacity for
its pod requests, then AWS's word, then the job API served) come after planning (`Surroundings`), in that
order, and only when the spec plans.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.admission.accounts import refuse_operators_account
from blackwell_operator.admission.job import Rejected, validate_body
from blackwell_operator.admission.redact import redacted
from blackwell_operator.calibration.cluster import Corrector, frozen
from blackwell_operator.catalogs import get_instance
from blackwell_operator.discovery.aws import AwsCapacity
from blackwell_operator.discovery.capacity import Capacity
from blackwell_operator.errors import SpecError
from blackwell_operator.handlers.api import ApiError
from blackwell_operator.handlers.cluster_calibration import pooled, read_cluster_calibration
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.preflight import account_policy
from blackwell_operator.lifecycle.backends import CONCRETE, backend_of_kind, choose_backend
from blackwell_operator.lifecycle.elastic import stored_choice
from blackwell_operator.lifecycle.global_batch import kept_tokens
from blackwell_operator.lifecycle.replan import correction_of
from blackwell_operator.lifecycle.status_read import ReadBtj
from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.models.status import BlackwellTrainingJobStatus, MemoryCorrection
from blackwell_operator.render.pod import resources
from blackwell_trainer.plan.config import NodeChoice, Plan


def parse_spec(body: Mapping[str, Any]) -> BlackwellTrainingJobSpec:
    """The spec judged as the API server judges it (admission.job); a refusal names the first field, and
    the status and Events that carry it never the field's value (admission.redact)."""
    try:
        return validate_body(body)
    except Rejected as exc:
        where, _, problem = redacted(exc.lines[0], body).partition(": ")
        more = f" (and {len(exc.lines) - 1} more)" if len(exc.lines) > 1 else ""
        raise SpecError(
            where, problem + more, "correct the field; `btj plan job.yaml` checks it offline"
        ) from exc


def spec_refusal(exc: SpecError, body: Mapping[str, Any]) -> str:
    """The message of a spec the planner refused, for status and Events: a string at the field it names
    becomes its type (a preset name may be anything the author typed); counts stay, they are the
    reasoning."""
    return redacted(exc.message, body, strings_only=True)


@dataclass(frozen=True)
class PassInputs:
    """What one pass plans from, each read once: the BTJ and its parsed status (which also holds this
    generation's probe choice, lifecycle/probe.with_probe_result), the spec, the memory correction that
    applies to it, the cluster correction, and for an elastic job the node count its stored plan chose
    (`kept`) or, on its first plan, the healthy nodes (`schedulable`); and the global batch stored with
    the job that a spec leaving globalBatchTokens unset keeps (`batch`, lifecycle/global_batch.py)."""

    read: ReadBtj
    spec: BlackwellTrainingJobSpec
    correction: MemoryCorrection | None
    cluster: Corrector | None
    kept: NodeChoice | None
    schedulable: int | None
    batch: int | None = None

    @property
    def body(self) -> Mapping[str, Any]:
        return self.read.body

    @property
    def stored(self) -> BlackwellTrainingJobStatus:
        return self.read.status

    @property
    def generation(self) -> int:
        return self.read.generation


def read_inputs(ctx: OperatorContext, read: ReadBtj, logger: Logger) -> PassInputs:
    """The pass's inputs from the BTJ `read`; SpecError for a spec the API server would refuse."""
    body, stored = read.body, read.status
    spec = parse_spec(body)
    # What out-of-memory runs of this spec taught (status.memoryCorrection, lifecycle/replan.py): also
    # after an operator restart, the plan is the corrected one that runs.
    correction = correction_of(body, stored)
    namespace = str(body["metadata"].get("namespace") or "")
    # The operator's own account is refused as a spec error: no admin's mark makes it a trainer's.
    refuse_operators_account(namespace, spec, account_policy())
    cluster = cluster_corrector(ctx, stored, spec, read.generation, namespace, logger)
    # An elastic job keeps the count its stored plan chose; its first plan takes the healthy nodes.
    kept = stored_choice(body, stored) if spec.cluster.elastic is not None else None
    owner = (namespace, str(body["metadata"].get("name") or ""))
    schedulable = schedulable_nodes(ctx, spec, owner, logger) if spec.cluster.elastic and not kept else None
    # The global batch chosen before (status.globalBatch): every later plan of the job keeps it.
    batch = kept_tokens(spec, stored, read.generation)
    return PassInputs(read, spec, correction, cluster, kept, schedulable, batch)


def cluster_corrector(
    ctx: OperatorContext,
    stored: BlackwellTrainingJobStatus,
    spec: BlackwellTrainingJobSpec,
    generation: int,
    namespace: str,
    logger: Logger,
) -> Corrector | None:
    """What this cluster measured, for the plan: the factors already planned with when this generation
    was planned before (a resync or a re-created child never re-plans a running job differently), else
    the operator's cluster calibration now."""
    # An unreadable stored plan (lifecycle/status_read.py) is planned anew, with the calibration now.
    if stored.plan is not None and stored.observed_generation == generation:
        return frozen(stored.plan.cluster_correction)
    calibration = read_cluster_calibration(ctx, logger)
    if calibration is None:
        return None
    # This namespace's own runs only, unless the operator pools them (each namespace capped).
    return calibration.corrector(spec.cluster.instance_type, namespace, pooled=pooled())


def schedulable_nodes(
    ctx: OperatorContext, spec: BlackwellTrainingJobSpec, owner: tuple[str, str], logger: Logger
) -> int | None:
    """Healthy schedulable nodes of the spec's instance type that other workloads leave free for the job
    `owner` (namespace, name); all the schedulable ones when pods cannot be read (None: nodes unreadable)."""
    gpus = spec.cluster.gpus_per_node or get_instance(spec.cluster.instance_type.value).gpus_per_node
    try:
        return ctx.capacity.read(spec.cluster.instance_type.value, owner=owner, gpus=gpus).placeable()
    except ApiError as exc:  # planned for spec.cluster.nodes then, and the plan says so
        logger.warning(f"Cannot read node capacity: {exc}")
        return None


@dataclass(frozen=True)
class Surroundings:
    """What the cluster says once the spec has planned: the nodes that hold one trainer pod, AWS's word on
    the named HyperPod cluster, and the backend (None: no job API served for `auto`)."""

    nodes: Capacity | None
    aws: AwsCapacity | None
    backend: Backend | None


def read_surroundings(ctx: OperatorContext, inputs: PassInputs, plan: Plan, logger: Logger) -> Surroundings:
    """The cluster reads a planned pass makes, in this order: node capacity, AWS capacity, the backend."""
    meta = inputs.body["metadata"]
    owner = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    nodes = _node_capacity(ctx, inputs.spec, plan, owner, logger)
    aws = _aws_capacity(ctx, inputs.spec, logger)
    return Surroundings(nodes, aws, _backend(ctx, inputs.stored, inputs.spec))


def _node_capacity(
    ctx: OperatorContext, spec: BlackwellTrainingJobSpec, plan: Plan, owner: tuple[str, str], logger: Logger
) -> Capacity | None:
    try:
        # One trainer pod's requests against each node's allocatable: a node that cannot hold it
        # (no EFA device plugin, no hugepages) would leave the worker Pending with no other sign. Its GPUs
        # against what other workloads' pods there request: the nodes free for this job, its own pods apart.
        requests = resources(spec, plan)["requests"]
        return ctx.capacity.read(spec.cluster.instance_type.value, requests, owner=owner)
    except ApiError as exc:  # capacity is advisory: never block the job on it
        logger.warning(f"Cannot read node capacity: {exc}")
        return None


def _aws_capacity(ctx: OperatorContext, spec: BlackwellTrainingJobSpec, logger: Logger) -> AwsCapacity | None:
    """What AWS says about the named HyperPod cluster (None: no cluster named, or no reader)."""
    reader, cluster = ctx.hyperpod_capacity, spec.cluster.hyperpod_cluster
    if reader is None or cluster is None:
        return None
    answer = reader.read(
        cluster, spec.cluster.instance_type.value, spec.cluster.nodes, spec.cluster.training_plan
    )
    if not answer.known:
        logger.warning(answer.message)  # advisory: the job goes on
    return answer


def _backend(
    ctx: OperatorContext, stored: BlackwellTrainingJobStatus, spec: BlackwellTrainingJobSpec
) -> Backend | None:
    """spec.backend, or for auto: the kind of the child it has, else the first kind the cluster serves.

    A recorded child's kind wins over discovery, so that a job API installed later never gives a BTJ
    a second child of another kind.
    """
    if spec.backend != Backend.AUTO:
        return spec.backend
    recorded = backend_of_kind(stored.child.kind if stored.child is not None else None)
    if recorded is not None:
        return recorded
    served = ctx.served_apis.served() if ctx.served_apis is not None else frozenset(CONCRETE)
    return choose_backend(spec, served)

"""Elastic jobs: the node count of the spec's range that the healthy nodes hold and a plan reaches."""

from __future__ import annotations

from collections.abc import Callable

from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec, ElasticSpec
from blackwell_operator.planner.inputs import hardware_for
from blackwell_trainer.plan.config import NodeChoice, Plan

ELASTIC_FIELD = "spec.cluster.elastic"
# Refused counts named in full in a plan's reason or an error; the rest are counted.
NAMED_REFUSALS = 3


def _summary(refused: list[str]) -> str:
    named = "; ".join(refused[:NAMED_REFUSALS])
    more = len(refused) - NAMED_REFUSALS
    return f"{named}; and {more} more" if more > 0 else named


def at_nodes(spec: BlackwellTrainingJobSpec, nodes: int) -> BlackwellTrainingJobSpec:
    """The spec with spec.cluster.nodes set to `nodes` (inside its elastic range, so still valid)."""
    return spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"nodes": nodes})})


def highest_count(elastic: ElasticSpec, nodes: int, schedulable: int | None) -> tuple[int, str]:
    """The largest count to try, and why: the most the nodes free for the job hold in the range, else nodes.

    `schedulable`: the healthy schedulable nodes of the instance type that other workloads leave free for
    this job (all the schedulable ones where pods cannot be read), so the reason says "free"."""
    low, high = elastic.min_nodes, elastic.max_nodes
    if schedulable is None:
        return nodes, f"the healthy nodes are unknown here: spec.cluster.nodes {nodes}"
    if schedulable >= high:
        return high, f"{schedulable} nodes free for this job hold maxNodes {high}"
    if schedulable >= low:
        return schedulable, f"{schedulable} nodes free for this job, fewer than maxNodes {high}"
    plural = "" if schedulable == 1 else "s"
    return low, (
        f"only {schedulable} node{plural} free for this job, fewer than minNodes {low}: planned for {low}, "
        "and the job waits for nodes"
    )


def batch_refusal(spec: BlackwellTrainingJobSpec, nodes: int) -> str | None:
    """Why `nodes` nodes cannot train the global batch in whole sequences per data-parallel rank (None:
    they can). The global batch never changes with the count: a count it does not divide is skipped."""
    tokens = spec.training.global_batch_tokens
    assert tokens is not None  # an elastic spec has one (models/spec.py)
    sequences = tokens // spec.training.sequence_length
    hw = hardware_for(spec, nodes)
    pinned = spec.tuning.context_parallel
    cp = pinned if isinstance(pinned, int) else 1
    ranks = hw.world // cp if hw.world % cp == 0 else 0
    if ranks and sequences % ranks == 0:
        return None
    where = f"{nodes} x {hw.gpus_per_node} GPUs" + (f" / context parallel {cp}" if cp > 1 else "")
    return (
        f"the global batch of {sequences:,} sequences does not divide over {ranks or hw.world} data-parallel "
        f"ranks ({where})"
    )


def plan_elastic(
    spec: BlackwellTrainingJobSpec,
    schedulable: int | None,
    plan_at: Callable[[BlackwellTrainingJobSpec], Plan],
    current: NodeChoice | None = None,
) -> Plan:
    """The plan for the largest count from the highest the healthy nodes hold down to minNodes that both
    divides the global batch and plans (`plan_at` plans one fixed count); the plan says which and why.
    `current` (the stored plan's choice) is kept while it still plans: only a resize changes the count.

    Raises PlanningError naming spec.cluster.elastic when no count in the range can be planned.
    """
    elastic = spec.cluster.elastic
    assert elastic is not None
    if current is not None and elastic.min_nodes <= current.nodes <= elastic.max_nodes:
        # The count chosen before (status.plan): kept until a resize changes it, so every pass plans
        # the child that runs.
        try:
            kept = plan_at(at_nodes(spec, current.nodes))
        except PlanningError:
            pass  # no longer plans (a correction learned since): choose again below
        else:
            kept.elastic = current.model_copy(deep=True)
            kept.explanation.insert(
                1, f"elastic [{elastic.min_nodes}, {elastic.max_nodes}]: {current.reason}"
            )
            return kept
    top, why_top = highest_count(elastic, spec.cluster.nodes, schedulable)
    refused: list[str] = []
    for nodes in range(top, elastic.min_nodes - 1, -1):
        refusal = batch_refusal(spec, nodes)
        if refusal is None:
            try:
                plan = plan_at(at_nodes(spec, nodes))
            except PlanningError as exc:
                refusal = exc.message
            else:
                reason = f"planned for {nodes} nodes; highest count {top} ({why_top})"
                if refused:
                    reason += f"; larger counts refused ({_summary(refused)})"
                plan.elastic = NodeChoice(
                    nodes=nodes,
                    min_nodes=elastic.min_nodes,
                    max_nodes=elastic.max_nodes,
                    schedulable=schedulable,
                    reason=reason,
                    refused=refused,
                )
                plan.explanation.insert(1, f"elastic [{elastic.min_nodes}, {elastic.max_nodes}]: {reason}")
                return plan
        refused.append(f"{nodes} nodes: {refusal}")
    raise PlanningError(
        ELASTIC_FIELD,
        f"no node count from {top} down to minNodes {elastic.min_nodes} can be planned: {_summary(refused)}",
        "choose spec.training.globalBatchTokens as a multiple of sequenceLength x GPUs per node x the node "
        "counts you allow (e.g. their least common multiple), or narrow the range",
    )

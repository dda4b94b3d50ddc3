"""Elastic specs: the node range is validated offline, and the planner picks the largest count the healthy
nodes hold that trains the same global batch exactly, saying which count it chose and why."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job

SEQUENCE = 4096


def spec(
    nodes: int = 4, low: int = 2, high: int = 4, sequences: int = 768, **elastic: Any
) -> BlackwellTrainingJobSpec:
    """Llama 3.2 1B on P5en nodes (8 H200 each) with a node range and a global batch of `sequences`."""
    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": "llama3.2-1b"},
            "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
            "cluster": {
                "instanceType": "ml.p5en.48xlarge",
                "nodes": nodes,
                "elastic": {"minNodes": low, "maxNodes": high, **elastic},
            },
            "training": {
                "sequenceLength": SEQUENCE,
                "globalBatchTokens": sequences * SEQUENCE,
                "steps": 100,
                "checkpoint": {"path": "/fsx/checkpoints/elastic"},
            },
        }
    )


@pytest.mark.parametrize(
    ("schedulable", "nodes", "why"),
    [
        (None, 4, "the healthy nodes are unknown here: spec.cluster.nodes 4"),
        (9, 4, "9 nodes free for this job hold maxNodes 4"),
        (3, 3, "3 nodes free for this job, fewer than maxNodes 4"),
        (2, 2, "2 nodes free for this job, fewer than maxNodes 4"),
        (
            1,
            2,
            "only 1 node free for this job, fewer than minNodes 2: planned for 2, and the job waits for "
            "nodes",
        ),
    ],
)
def test_the_largest_count_the_healthy_nodes_hold_is_planned_and_said(
    schedulable: int | None, nodes: int, why: str
) -> None:
    plan = plan_job(spec(), schedulable=schedulable)
    assert plan.nodes == nodes and plan.elastic is not None
    assert plan.elastic.nodes == nodes and plan.elastic.schedulable == schedulable
    assert plan.elastic.reason == f"planned for {nodes} nodes; highest count {nodes} ({why})"
    assert f"elastic [2, 4]: {plan.elastic.reason}" in plan.explanation


def test_every_count_trains_the_same_global_batch_exactly() -> None:
    # 768 sequences over 16, 24 and 32 GPUs: micro-batch and accumulation absorb the change.
    plans = [plan_job(spec(), schedulable=n) for n in (2, 3, 4)]
    assert {p.global_batch_tokens for p in plans} == {768 * SEQUENCE}
    for p in plans:
        data_parallel = p.world_size // p.chosen.context_parallel
        assert p.chosen.micro_batch_size * p.chosen.gradient_accumulation_steps * data_parallel == 768
    # The same learning-rate schedule: steps and optimizer settings are the spec's on every count.
    assert len({(p.steps, p.optimizer.model_dump_json()) for p in plans}) == 1


def test_a_count_the_global_batch_does_not_divide_is_refused_with_the_reason() -> None:
    # 1,024 sequences do not divide over 3 x 8 GPUs: with 3 healthy nodes the job runs on 2.
    plan = plan_job(spec(sequences=1024), schedulable=3)
    assert plan.nodes == 2 and plan.global_batch_tokens == 1024 * SEQUENCE
    assert plan.elastic is not None
    assert plan.elastic.refused == [
        "3 nodes: the global batch of 1,024 sequences does not divide over 24 data-parallel ranks "
        "(3 x 8 GPUs)"
    ]
    assert "larger counts refused (3 nodes: the global batch of 1,024" in plan.elastic.reason


def test_no_count_in_the_range_plans_is_an_error_naming_the_field_and_the_fix() -> None:
    with pytest.raises(PlanningError) as caught:
        plan_job(spec(nodes=3, low=3, high=3, sequences=1024), schedulable=3)
    assert caught.value.field == "spec.cluster.elastic"
    assert "no node count from 3 down to minNodes 3 can be planned" in caught.value.message
    assert "least common multiple" in caught.value.fix


def test_a_fixed_job_and_an_elastic_one_both_refuse_a_batch_they_cannot_reach_exactly() -> None:
    # 1,000 sequences on 32 GPUs: no whole micro-batches reach them. A fixed job was once planned at a
    # rounded batch within 5%; now both refuse, naming the field (and the fixed one the nearest values).
    fixed = BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": "llama3.2-1b"},
            "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 4},
            "training": {"sequenceLength": SEQUENCE, "globalBatchTokens": 1000 * SEQUENCE},
        }
    )
    with pytest.raises(PlanningError) as caught:
        plan_job(fixed)
    assert caught.value.field == "spec.training.globalBatchTokens"
    assert f"globalBatchTokens: {992 * SEQUENCE} or {1024 * SEQUENCE}" in caught.value.fix
    with pytest.raises(PlanningError, match="does not divide over 32 data-parallel ranks"):
        plan_job(spec(nodes=4, low=4, high=4, sequences=1000), schedulable=4)


@pytest.mark.parametrize(
    ("cluster", "training", "message"),
    [
        ({"nodes": 2, "elastic": {"minNodes": 3, "maxNodes": 2}}, {}, "minNodes 3 is more than maxNodes 2"),
        ({"nodes": 8, "elastic": {"minNodes": 2, "maxNodes": 4}}, {}, "spec.cluster.nodes 8 is outside"),
        (
            {"nodes": 2, "elastic": {"minNodes": 1, "maxNodes": 2}},
            None,
            "needs spec.training.globalBatchTokens",
        ),
        (
            {"nodes": 2, "elastic": {"minNodes": 1, "maxNodes": 2}},
            {"globalBatchTokens": 1000},
            "must be a multiple of spec.training.sequenceLength",
        ),
        (
            {"nodes": 2, "elastic": {"minNodes": 1, "maxNodes": 2}},
            {"sequenceLength": SEQUENCE},
            "spec.cluster.elastic needs spec.training.checkpoint.path",
        ),
    ],
)
def test_bad_ranges_are_refused_offline_with_the_fix(
    cluster: dict[str, Any], training: dict[str, Any] | None, message: str
) -> None:
    body: dict[str, Any] = {"model": {"preset": "llama3.2-1b"}, "cluster": cluster}
    if training is not None:
        body["training"] = {"globalBatchTokens": 64 * SEQUENCE, **training}
    with pytest.raises(ValidationError, match=message) as caught:
        BlackwellTrainingJobSpec.model_validate(body)
    assert "Fix:" in str(caught.value)

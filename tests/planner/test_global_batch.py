"""The global batch: the user's, or the planner's rule from the model and sequence length, and the same
tokens per step on every node count (docs/global-batch.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from blackwell_operator.calibration.cluster import MIN_RUNS
from blackwell_operator.calibration.learned_memory import MEMORY_BOUNDS
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.correction import learn
from blackwell_operator.planner.global_batch import choose_global_batch, target_tokens
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import OomPhase, OomResult, Plan
from tests.planner.test_cluster_correction import calibration, sample
from tests.support.specs import make_spec

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "operator/src/blackwell_operator/examples/default.yaml"
EXAMPLES = [*sorted((ROOT / "examples").glob("*.yaml")), DEFAULT]


def _jobs() -> list[tuple[str, dict[str, Any]]]:
    jobs = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "BlackwellTrainingJob":
                jobs.append((path.name, doc["spec"]))
    return jobs


def _at(spec: dict[str, Any], nodes: int) -> BlackwellTrainingJobSpec:
    cluster = {**spec["cluster"], "nodes": nodes}
    if "elastic" in cluster:  # the count is the question here: a range that holds it
        cluster["elastic"] = {**cluster["elastic"], "minNodes": 1, "maxNodes": 4}
    return BlackwellTrainingJobSpec.model_validate({**spec, "cluster": cluster})


@pytest.mark.parametrize(("name", "spec"), _jobs(), ids=[name for name, _ in _jobs()])
def test_every_example_trains_the_same_tokens_per_step_on_1_2_and_4_nodes(
    name: str, spec: dict[str, Any]
) -> None:
    tokens = {}
    for nodes in (1, 2, 4):
        try:
            plan = plan_job(_at(spec, nodes))
        except PlanningError:
            continue  # too few GPUs for the model (70B on one node): refused, never a smaller batch
        c = plan.chosen
        dp = plan.nodes * plan.gpus_per_node // c.context_parallel
        reached = c.micro_batch_size * c.gradient_accumulation_steps * dp * plan.sequence_length
        assert reached == plan.global_batch_tokens
        tokens[nodes] = plan.global_batch_tokens
    assert len(tokens) >= 2, name
    # The user's value exactly where there is one (never rounded to suit the micro-batch), else the rule's.
    pinned = spec["training"].get("globalBatchTokens")
    assert len(set(tokens.values())) == 1, (name, tokens)
    assert pinned is None or set(tokens.values()) == {pinned}, (name, tokens)


def test_the_rule_follows_model_size_and_sequence_length_only() -> None:
    assert target_tokens(1_240_000_000) == 2**19
    assert target_tokens(3_210_000_000) == 2**20
    assert target_tokens(8_030_000_000) == 2**21
    assert target_tokens(70_600_000_000) == 2**22
    for dp in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        chosen = choose_global_batch(8_030_000_000, 8192, dp)
        assert (chosen.tokens, chosen.sequences) == (2**21, 256)
    # A GPU count that does not divide it: rounded up to whole sequences on every rank, and said.
    six = choose_global_batch(8_030_000_000, 8192, 6)
    assert six.sequences == 258 and six.tokens == 258 * 8192 and "rounded up to 258" in six.reason
    assert choose_global_batch(70_600_000_000, 1 << 20, 16).sequences == 16


def test_the_plan_says_where_the_batch_came_from_and_how_to_pin_it() -> None:
    plan = plan_job(make_spec(seq=8192, nodes=2))
    assert plan.global_batch_tokens == 2**21
    line = next(x for x in plan.explanation if x.startswith("global batch"))
    assert "chosen by the planner" in line and "spec.training.globalBatchTokens: 2097152" in line


@pytest.mark.parametrize("mbs", [1, 2, 4])
def test_the_micro_batch_never_moves_the_global_batch(mbs: int) -> None:
    assert plan_job(make_spec(seq=8192, nodes=2, microBatchSize=mbs)).global_batch_tokens == 2**21


def _oom(plan: Plan) -> OomResult:
    peak = plan.predicted.memory.peak_reserved
    return OomResult(
        phase=OomPhase.BACKWARD,
        step=1,
        requested_bytes=GIB,
        allocated_bytes=peak + 5 * GIB,
        peak_allocated_bytes=peak + 5 * GIB,
        peak_reserved_bytes=peak + 5 * GIB,
        predicted_peak_reserved_bytes=peak,
        candidate=plan.chosen,
    )


def test_an_oom_correction_and_a_cluster_calibration_keep_the_global_batch() -> None:
    spec = make_spec(seq=8192, nodes=2)
    first = plan_job(spec)
    correction = learn(None, _oom(first), first, generation=1)
    replanned = plan_job(spec, correction=correction)
    assert replanned.chosen != first.chosen
    assert replanned.global_batch_tokens == first.global_batch_tokens
    # A cluster that measured this family slower and hungrier than predicted: corrected, the same batch.
    spec = make_spec(seq=8192, nodes=2, precision="bf16", activationCheckpointing="selective")
    before = plan_job(spec)
    runs = (sample(f"j{i}", 0.8, MEMORY_BOUNDS[1]) for i in range(MIN_RUNS))
    measured = plan_job(spec, cluster=calibration(*runs).corrector(spec.cluster.instance_type))
    assert measured.cluster_correction is not None and measured.predicted != before.predicted
    assert measured.global_batch_tokens == before.global_batch_tokens == first.global_batch_tokens


def test_the_rule_s_batch_is_reached_exactly_where_a_rounded_one_would_be_faster() -> None:
    # 8B on one B200 node at 4096: 512 sequences over 8 GPUs; a micro-batch that does not divide 64 is
    # never chosen, though the search would take one for a pinned value within 5%.
    chosen = plan_job(make_spec(seq=4096, nodes=1))
    assert chosen.global_batch_tokens == 2**21
    assert 64 % chosen.chosen.micro_batch_size == 0


def test_a_pinned_batch_is_trained_exactly_where_a_rounded_one_would_be_faster() -> None:
    # The same spec with the rule's value pinned: the user's number is trained, not one within 5% of it.
    spec = make_spec(seq=4096, nodes=1)
    spec.training.global_batch_tokens = 2**21
    plan = plan_job(spec)
    assert plan.global_batch_tokens == 2**21
    assert 64 % plan.chosen.micro_batch_size == 0
    assert f"pinned (spec.training.globalBatchTokens: {2**21})" in "\n".join(plan.explanation)


def test_a_pinned_batch_no_micro_batch_reaches_is_refused_with_the_nearest_values() -> None:
    spec = make_spec(seq=8192, nodes=1)
    spec.training.global_batch_tokens = 2**21 + 8192  # 257 sequences over 8 GPUs
    with pytest.raises(PlanningError) as caught:
        plan_job(spec)
    assert caught.value.field == "spec.training.globalBatchTokens"
    assert f"globalBatchTokens: {2**21} or {2**21 + 8 * 8192}" in caught.value.fix


def test_the_batch_stored_with_the_job_is_kept_over_the_rule() -> None:
    # status.globalBatch from an earlier rule (or an earlier plan): kept, and the plan says so.
    spec = make_spec(seq=8192, nodes=2)
    plan = plan_job(spec, global_batch=2**20)
    assert plan.global_batch_tokens == 2**20
    line = next(x for x in plan.explanation if x.startswith("global batch"))
    assert "kept" in line and "status.globalBatch" in line and "globalBatchTokens: 1048576" in line
    # The spec's own value wins over a stored one.
    spec.training.global_batch_tokens = 2**22
    assert plan_job(spec, global_batch=2**20).global_batch_tokens == 2**22


def test_a_stored_batch_the_job_s_gpus_cannot_reach_is_refused_never_chosen_again() -> None:
    # Chosen on 2 nodes (256 sequences), then the node count edited to 3: 24 GPUs do not divide it.
    with pytest.raises(PlanningError) as caught:
        plan_job(make_spec(seq=8192, nodes=3), global_batch=2**21)
    assert caught.value.field == "spec.training.globalBatchTokens"
    assert "status.globalBatch" in caught.value.message
    assert f"globalBatchTokens: {240 * 8192} or {264 * 8192}" in caught.value.fix

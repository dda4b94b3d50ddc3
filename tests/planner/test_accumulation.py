"""Planning time does not grow with the gradient accumulation count: the size walk is solved, not stepped."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from blackwell_operator.calibration import load_calibration
from blackwell_operator.models.spec import MAX_GLOBAL_BATCH_TOKENS, BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.candidates import Pins, families
from blackwell_operator.planner.search import SIZES_PER_FAMILY, Problem, sizes_to_time
from tests.support.specs import fsdp_on_one_gpu, hardware, shapes

BTJ = load_calibration("btj-trainer")


def walked(problem: Problem, family: object, max_fit: int) -> list[int]:
    """The sizes as the planner used to find them, one accumulation step at a time (the reference)."""
    assert problem.global_batch_tokens is not None
    per_sequence = problem.tokens_per_micro_step(family, 1)  # type: ignore[arg-type]
    sizes: list[int] = []
    accumulation = max(1, problem.global_batch_tokens // (max_fit * per_sequence))
    while len(sizes) < SIZES_PER_FAMILY:
        exact = problem.global_batch_tokens / (accumulation * per_sequence)
        if exact < 0.5:
            break
        for mbs in (math.floor(exact), math.ceil(exact)):
            if 1 <= mbs <= max_fit and mbs not in sizes and problem.batch_ok(family, mbs):  # type: ignore[arg-type]
                sizes.append(mbs)
        accumulation += 1
    return sizes


def problem_for(tokens: int, nodes: int = 1, seq: int = 4096) -> tuple[Problem, list[object]]:
    hw = hardware("ml.p6-b200.48xlarge", nodes)
    problem = Problem(shapes("llama3.2-1b"), hw, BTJ, seq, tokens, hw.gpu.memory_bytes * 0.95)
    return problem, list(families(Pins(), hw, BTJ, seq))


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    # Up to 2^10 sequences per data-parallel rank: the step-by-step reference still ends quickly there.
    sequences=st.integers(1, 2**10),
    extra=st.integers(0, 4095),
    max_fit=st.integers(1, 64),
    nodes=st.sampled_from([1, 2]),
    pick=st.integers(0, 1000),
)
def test_the_solved_walk_picks_the_same_sizes_as_the_stepped_one(
    sequences: int, extra: int, max_fit: int, nodes: int, pick: int
) -> None:
    tokens = sequences * 4096 * 8 * nodes + extra
    problem, fams = problem_for(tokens, nodes)
    family = fams[pick % len(fams)]
    assert sizes_to_time(problem, family, max_fit) == walked(problem, family, max_fit)  # type: ignore[arg-type]


def test_a_huge_accumulation_count_plans_as_fast_as_a_small_one() -> None:
    # 10^18 tokens per step: some 3 * 10^13 accumulation steps. The stepped walk never finished.
    problem, fams = problem_for(10**18)
    started = time.perf_counter()
    for family in fams:
        assert sizes_to_time(problem, family, 64)  # type: ignore[arg-type]
    assert time.perf_counter() - started < 0.5


def test_planning_at_the_global_batch_bound_is_fast() -> None:
    def seconds(tokens: int) -> float:
        spec = BlackwellTrainingJobSpec.model_validate(
            {
                "model": {"preset": "llama3.1-8b"},
                "cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 2},
                "training": {"sequenceLength": 8192, "globalBatchTokens": tokens},
            }
        )
        started = time.perf_counter()
        plan = plan_job(spec, job_name="big")
        assert plan.chosen.gradient_accumulation_steps >= 1
        return time.perf_counter() - started

    small, huge = seconds(2**22), seconds(MAX_GLOBAL_BATCH_TOKENS)
    # 2^40 tokens took 1.6 s before (16M accumulation steps walked one by one); now it is like any plan.
    assert huge < 1.0 and huge < 5 * small + 0.2, (small, huge)


def test_the_global_batch_has_a_bound_the_model_states() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 1099511627776"):
        BlackwellTrainingJobSpec.model_validate(
            {"model": {"preset": "llama3.1-8b"}, "training": {"globalBatchTokens": 10**18}}
        )


def test_a_micro_batch_that_ends_accumulation_is_found_past_one_that_does_not_fit() -> None:
    """Memory grows with the micro-batch except where accumulation ends: 8B on one H200 at a global batch of
    two sequences does not fit as 1 x 2 (gradients held across micro-steps) but fits as 2 x 1; the search
    used to stop at the first size and answer 'nothing fits'."""

    def spec(mbs: int | str) -> BlackwellTrainingJobSpec:
        return BlackwellTrainingJobSpec.model_validate(
            {
                "model": {"preset": "llama3.1-8b"},
                "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 1},
                "training": {"sequenceLength": 4096, "globalBatchTokens": 2 * 4096, "steps": 100},
                "tuning": {"precision": "bf16", "memoryHeadroom": 0.0, "microBatchSize": mbs},
            }
        )

    # With FSDP2 on one rank: the gradients' stream pool is what puts 1 x 2 over the budget (the
    # single-device path frees it, and then 1 x 2 fits too).
    fsdp = fsdp_on_one_gpu(BTJ)
    with pytest.raises(ValueError, match="microBatchSize"):
        plan_job(spec(1), calibration=fsdp)  # the accumulating size alone: over the budget
    pinned = plan_job(spec(2), calibration=fsdp)
    found = plan_job(spec("auto"), calibration=fsdp)
    assert (found.chosen.micro_batch_size, found.chosen.gradient_accumulation_steps) == (2, 1)
    assert found.chosen == pinned.chosen

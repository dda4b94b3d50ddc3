"""One search of a spec as plan_job makes it: the families, the global-batch checks, and context
parallelism where nothing without it fits on the spec's nodes.

plan_job builds the Plan from it; the refusals (rejections.py) ask it whether an advised change makes a
spec plan, so the advice and the planner can never disagree on what fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blackwell_operator.calibration import Calibration
from blackwell_operator.calibration.cluster import Corrector
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.candidates import Pins, families
from blackwell_operator.planner.inputs import hardware_for, problem_for
from blackwell_operator.planner.layout import Hardware, Setting
from blackwell_operator.planner.search import Problem, SearchResult, run_search


@dataclass(frozen=True)
class Context:
    """What one plan_job call fixes besides the spec: the calibration and what the cluster taught."""

    cal: Calibration
    correct: Corrector | None = None
    # Per family, the largest micro-batch allowed (planner.correction), as Problem.mbs_limits.
    mbs_limits: dict[tuple[str, str, str, str, int], int] = field(default_factory=dict)

    def problem(self, spec: BlackwellTrainingJobSpec, hw: Hardware) -> Problem:
        """The search problem of `spec` on `hw`, with this context's corrections."""
        problem = problem_for(spec, self.cal, hw)
        problem.correct = self.correct
        problem.mbs_limits = self.mbs_limits
        return problem


@dataclass
class Solved:
    """The search of one spec: its winner (if any), and the search without context parallelism."""

    problem: Problem
    pins: Pins
    families: list[Setting]
    result: SearchResult
    plain: SearchResult
    cp_fallback: bool = False


def solve(spec: BlackwellTrainingJobSpec, ctx: Context) -> Solved:
    """Search a spec; raises PlanningError for a pinned value or global batch no candidate can obey.

    Under contextParallel auto with a calibration that keeps CP out of the ordinary search (its speed is
    unmeasured), the search is made again with CP degrees where nothing without them fits on these
    nodes: a modelled plan on the nodes the user has beats a refusal, and the plan says so.
    """
    hw = hardware_for(spec)
    problem = ctx.problem(spec, hw)
    pins = Pins.of(spec.tuning)
    seq = spec.training.sequence_length
    fams = families(pins, hw, ctx.cal, seq, spec.tuning.compile)
    check_global_batch(problem, fams, pins)
    result = run_search(problem, fams, pins.micro_batch_size)
    solved = Solved(problem, pins, fams, result, result)
    if result.best is not None or unreachable_global_batch(problem, pins, result) is not None:
        return solved
    if pins.context_parallel is not None or ctx.cal.trainer.offers_auto_context_parallel:
        return solved
    if not ctx.cal.trainer.context_parallel:
        return solved
    pinned = pins.micro_batch_size
    if pinned is not None and all(problem.max_mbs(f) < pinned for f in fams):
        return solved  # the pin is past what the batch or the job's out-of-memory history allow, not memory
    offered = families(pins, hw, ctx.cal, seq, spec.tuning.compile, auto_cp=True)
    split = [f for f in offered if f.context_parallel > 1]
    if not split:
        return solved
    fallback = run_search(problem, split, pins.micro_batch_size)
    if fallback.best is None:
        return solved
    return Solved(problem, pins, split, fallback, result, cp_fallback=True)


def accepts(spec: BlackwellTrainingJobSpec, ctx: Context) -> bool:
    """Whether plan_job finds a plan for `spec` (its memory and batch search; no weights or storage)."""
    try:
        return solve(spec, ctx).result.best is not None
    except PlanningError:
        return False


def _within(problem: Problem) -> str:
    """How close the global batch must be reached, in words."""
    if problem.exact_batch:
        return "exactly (an elastic job trains the same global batch on every node count)"
    return f"within {problem.batch_tolerance:.0%}"


def check_global_batch(problem: Problem, fams: list[Setting], pins: Pins) -> None:
    """Reject a global batch that no micro-batch (or the pinned one) can reach."""
    gbt = problem.global_batch_tokens
    if gbt is None:
        return
    mbs = pins.micro_batch_size
    if mbs is not None and all(problem.max_mbs(f) < mbs for f in fams):
        least = min(problem.tokens_per_micro_step(f, mbs) for f in fams)
        # A smaller pin that reaches the global batch exactly (whole micro-batches), if there is one.
        smaller = max((k for f in fams for k in range(1, mbs) if problem.batch_ok(f, k)), default=0)
        use = f"spec.tuning.microBatchSize: {smaller} or auto" if smaller else "microBatchSize auto"
        raise PlanningError(
            "spec.tuning.microBatchSize",
            f"micro-batch {mbs} puts {least:,} tokens in one micro-step over all GPUs, more than "
            f"globalBatchTokens {gbt:,}",
            f"use {use}, or spec.training.globalBatchTokens: {least:,}",
        )
    if mbs is not None and not any(problem.batch_ok(f, mbs) for f in fams):
        step = min(problem.tokens_per_micro_step(f, mbs) for f in fams)
        raise PlanningError(
            "spec.tuning.microBatchSize",
            f"whole micro-batches of {mbs} ({step:,} tokens per micro-step) cannot reach globalBatchTokens "
            f"{gbt:,} {_within(problem)}",
            f"use auto, or a globalBatchTokens that is a multiple of {step:,}",
        )
    if all(problem.max_mbs(f) < 1 for f in fams):
        least = min(problem.tokens_per_micro_step(f, 1) for f in fams)
        raise PlanningError(
            "spec.training.globalBatchTokens",
            f"{gbt:,} tokens is less than one sequence per data-parallel rank ({least:,} tokens)",
            f"use a multiple of {least:,} or leave it unset",
        )


def unreachable_global_batch(problem: Problem, pins: Pins, result: SearchResult) -> PlanningError | None:
    """Memory allowed some micro-batch, but none reaches the global batch within the tolerance."""
    if problem.global_batch_tokens is None or pins.micro_batch_size is not None:
        return None
    if not any(f.max_fitting_mbs > 0 for f in result.families):
        return None
    step = min(problem.tokens_per_micro_step(f.family, 1) for f in result.families)
    return PlanningError(
        "spec.training.globalBatchTokens",
        f"{problem.global_batch_tokens:,} tokens cannot be reached {_within(problem)} by whole "
        "micro-batches that fit",
        f"use a multiple of {step:,} (sequence length x data-parallel GPUs)",
    )

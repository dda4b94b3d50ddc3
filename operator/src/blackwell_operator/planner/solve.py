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
    # The global batch stored with the job (status.globalBatch), for a spec that leaves it unset.
    kept_batch: int | None = None

    def problem(self, spec: BlackwellTrainingJobSpec, hw: Hardware) -> Problem:
        """The search problem of `spec` on `hw`, with this context's corrections."""
        problem = problem_for(spec, self.cal, hw, self.kept_batch)
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
    # The search with CP offered where it was made and found nothing either (for the refusal's figures).
    split: SearchResult | None = None


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
    split = _split_families(spec, ctx, pins, hw)
    # Where nothing without CP fits in memory, the global batch is out of reach only if the split
    # candidates cannot reach it either (splitting a sequence also makes fewer data-parallel ranks share
    # it); where something does, CP is no fix for batch arithmetic and the refusal names the batch.
    memory_blocked = bool(split) and not _any_fits(spec, ctx, hw, fams, pins.micro_batch_size or 1)
    check_global_batch(problem, fams + split if memory_blocked else fams, pins)
    result = run_search(problem, fams, pins.micro_batch_size)
    solved = Solved(problem, pins, fams, result, result)
    if result.best is not None or unreachable_global_batch(problem, pins, result) is not None:
        return solved
    pinned = pins.micro_batch_size
    if pinned is not None and ctx.mbs_limits and all(problem.max_mbs(f) < pinned for f in fams):
        return solved  # the pin is past what the job's out-of-memory history allows: not a memory question
    if not split:
        return solved
    fallback = run_search(problem, split, pinned)
    if fallback.best is None:
        solved.split = fallback
        return solved
    return Solved(problem, pins, split, fallback, result, cp_fallback=True)


def _any_fits(
    spec: BlackwellTrainingJobSpec, ctx: Context, hw: Hardware, fams: list[Setting], mbs: int
) -> bool:
    """Whether one of the families fits in memory at micro-batch `mbs`, whatever the global batch."""
    problem = ctx.problem(spec, hw)
    problem.global_batch_tokens = None
    return any(problem.max_mbs(f) >= mbs and problem.fits(f.with_mbs(mbs)) for f in fams)


def _split_families(spec: BlackwellTrainingJobSpec, ctx: Context, pins: Pins, hw: Hardware) -> list[Setting]:
    """The families with CP above 1 that auto falls back to (none where CP is pinned, already in the
    ordinary search, or not in the trainer)."""
    if pins.context_parallel is not None or ctx.cal.trainer.offers_auto_context_parallel:
        return []
    if not ctx.cal.trainer.context_parallel:
        return []
    seq = spec.training.sequence_length
    offered = families(pins, hw, ctx.cal, seq, spec.tuning.compile, auto_cp=True)
    return [f for f in offered if f.context_parallel > 1]


# How a global batch is reached: exactly, never rounded to suit the micro-batch.
_EXACTLY = "exactly (docs/global-batch.md)"


def _which(problem: Problem) -> str:
    """The global batch named in a refusal: the spec's, or the one stored with the job."""
    if problem.kept_batch:
        return "the global batch this job trains (status.globalBatch, kept while globalBatchTokens is unset)"
    return "globalBatchTokens"


def nearest_reachable(tokens: int, step: int) -> list[int]:
    """The multiples of `step` nearest to `tokens`, below and above (one where it is below one step)."""
    below = tokens // step * step
    return [v for v in (below, below + step) if v > 0]


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
            f"{gbt:,} {_EXACTLY}",
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
    """Memory allowed some micro-batch, but none reaches the global batch exactly."""
    if problem.global_batch_tokens is None or pins.micro_batch_size is not None:
        return None
    if not any(f.max_fitting_mbs > 0 for f in result.families):
        return None
    # Micro-batches of one reach any multiple of the largest micro-step of the families that fit.
    step = max(problem.tokens_per_micro_step(f.family, 1) for f in result.families if f.max_fitting_mbs > 0)
    values = " or ".join(str(v) for v in nearest_reachable(problem.global_batch_tokens, step))
    return PlanningError(
        "spec.training.globalBatchTokens",
        f"{_which(problem)} {problem.global_batch_tokens:,} tokens cannot be reached {_EXACTLY} by "
        f"whole micro-batches that fit on {problem.hw.world} GPUs",
        f"use spec.training.globalBatchTokens: {values} (the nearest multiples of {step:,}: sequence length "
        "x data-parallel GPUs)",
    )

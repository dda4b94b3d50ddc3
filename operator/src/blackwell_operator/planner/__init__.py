"""The planner: a pure function from a BTJ spec and the catalogs to a tuned, explained Plan."""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_operator.calibration import Calibration, load_calibration
from blackwell_operator.catalogs import get_gpu, get_instance, resolve_model
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.candidates import Pins, families
from blackwell_operator.planner.explain import describe, explain, gib, loss_reason
from blackwell_operator.planner.layout import Hardware, Layout, Setting
from blackwell_operator.planner.memory import MemoryEstimate
from blackwell_operator.planner.search import (
    GLOBAL_BATCH_TOLERANCE,
    Problem,
    Scored,
    SearchResult,
    run_search,
)
from blackwell_operator.planner.shapes import Shapes
from blackwell_trainer.config import (
    Alternative,
    Candidate,
    GpuInfo,
    Plan,
    Prediction,
    Sharding,
)

__all__ = ["Evaluation", "evaluate", "plan_job"]

ALTERNATIVES = 5
MAX_NODES_SEARCHED = 1024


@dataclass(frozen=True)
class Evaluation:
    """The planner's prediction for one given candidate."""

    candidate: Candidate
    prediction: Prediction
    memory: MemoryEstimate
    fits: bool
    budget_bytes: int


def _hardware(spec: BlackwellTrainingJobSpec, nodes: int | None = None) -> Hardware:
    instance = get_instance(spec.cluster.instance_type)
    gpu = get_gpu(instance.gpu)
    gpn = spec.cluster.gpus_per_node or instance.gpus_per_node
    if gpn > instance.gpus_per_node:
        raise PlanningError(
            "spec.cluster.gpusPerNode",
            f"{gpn} GPUs per node, but {instance.instance_type} has {instance.gpus_per_node}",
            f"use at most {instance.gpus_per_node} or leave it unset",
        )
    return Hardware(gpu, instance, nodes or spec.cluster.nodes, gpn)


def _problem(spec: BlackwellTrainingJobSpec, cal: Calibration, hw: Hardware) -> Problem:
    _, arch = resolve_model(spec.model)
    budget = hw.gpu.memory_bytes * (1.0 - spec.tuning.memory_headroom)
    return Problem(
        Shapes.of(arch), hw, cal, spec.training.sequence_length, spec.training.global_batch_tokens, budget
    )


def _candidate(s: Scored, hw: Hardware, cal: Calibration) -> Candidate:
    st = s.setting
    layout = Layout.of(st, hw)
    return Candidate(
        precision=st.precision,
        precision_recipe=st.recipe,
        activation_checkpointing=st.activation_checkpointing,
        micro_batch_size=st.micro_batch_size,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        sharding=st.sharding,
        shard_degree=layout.shard_degree,
        replicate_degree=layout.replicate_degree,
        context_parallel=st.context_parallel,
        compile=st.compile,
        loss_chunk_tokens=cal.trainer.loss_chunk_tokens,
    )


def _prediction(s: Scored) -> Prediction:
    assert s.time is not None
    return Prediction(
        tokens_per_second_per_gpu=round(s.time.tokens_per_second_per_gpu, 1),
        step_time_seconds=round(s.time.step_time_seconds, 6),
        model_flops_utilization=round(s.time.model_flops_utilization, 4),
        memory=s.memory.to_breakdown(),
        time_breakdown_seconds={k: round(v, 6) for k, v in s.time.breakdown.items()},
    )


def evaluate(
    spec: BlackwellTrainingJobSpec, candidate: Candidate, *, calibration: Calibration | None = None
) -> Evaluation:
    """Score one given candidate for a spec's model and hardware (no search)."""
    cal = calibration or load_calibration()
    hw = _hardware(spec)
    problem = _problem(spec, cal, hw)
    setting = Setting(
        candidate.precision,
        candidate.precision_recipe,
        candidate.activation_checkpointing,
        candidate.micro_batch_size,
        candidate.sharding,
        candidate.context_parallel,
        candidate.compile and cal.trainer.compile,
    )
    # Without a global batch, score the accumulation the candidate asks for (not one micro-batch).
    ga = None if spec.training.global_batch_tokens is not None else candidate.gradient_accumulation_steps
    scored = problem.score(setting, ga)
    return Evaluation(
        candidate=_candidate(scored, hw, cal),
        prediction=_prediction(scored),
        memory=scored.memory,
        fits=scored.fits,
        budget_bytes=int(problem.budget_bytes),
    )


def plan_job(
    spec: BlackwellTrainingJobSpec, *, job_name: str = "btj", calibration: Calibration | None = None
) -> Plan:
    """Resolve a spec into the fastest plan that fits, with alternatives and reasons.

    Raises PlanningError (field, problem, fix) when a pinned value is impossible or nothing fits.
    """
    cal = calibration or load_calibration()
    model_name, arch = resolve_model(spec.model)
    hw = _hardware(spec)
    problem = _problem(spec, cal, hw)
    pins = Pins.of(spec.tuning)
    seq = spec.training.sequence_length
    fams = families(pins, hw, cal, seq, spec.tuning.compile)
    _check_global_batch(problem, fams, pins)
    result = run_search(problem, fams, pins.micro_batch_size)
    best = result.best
    if best is None and _batch_unreachable(problem, pins, result):
        step = min(problem.tokens_per_micro_step(f.family, 1) for f in result.families)
        raise PlanningError(
            "spec.training.globalBatchTokens",
            f"{problem.global_batch_tokens:,} tokens cannot be reached within "
            f"{GLOBAL_BATCH_TOLERANCE:.0%} by whole micro-batches that fit",
            f"use a multiple of {step:,} (sequence length x data-parallel GPUs)",
        )
    if best is None:
        raise _no_plan(spec, cal, pins, result, problem)

    alternatives = _alternatives(best, result, problem.budget_bytes, hw, cal)
    chosen = _candidate(best, hw, cal)
    gpu = hw.gpu
    headline = (
        f"{model_name} ({problem.shapes.total_params / 1e9:.2f}B params) on {hw.world} x {gpu.name} "
        f"({hw.nodes} x {hw.instance.instance_type}), sequence {seq}: {describe(best)} -> "
        f"{best.tokens_per_second:,.0f} tokens/s per GPU predicted"
    )
    return Plan(
        job_name=job_name,
        model_name=model_name,
        architecture=arch,
        parameter_count=problem.shapes.total_params,
        gpu=GpuInfo(
            name=gpu.name,
            compute_capability=gpu.compute_capability,
            memory_bytes=gpu.memory_bytes,
            peak_bf16_flops=gpu.peak_flops["bf16"],
        ),
        instance_type=hw.instance.instance_type,
        nodes=hw.nodes,
        gpus_per_node=hw.gpus_per_node,
        sequence_length=seq,
        global_batch_tokens=problem.tokens_per_micro_step(best.setting, best.setting.micro_batch_size)
        * best.gradient_accumulation_steps,
        steps=spec.training.steps,
        chosen=chosen,
        predicted=_prediction(best),
        alternatives=alternatives,
        candidates_evaluated=result.evaluations,
        explanation=[headline, *explain(best, result, problem.budget_bytes), *_batch_note(problem, best)],
        calibration=f"{cal.name} ({cal.status})",
        dataset=spec.training.dataset.model_copy(deep=True),
        checkpoint=spec.training.checkpoint.model_copy(deep=True),
        optimizer=spec.training.optimizer.model_copy(deep=True),
    )


def _batch_unreachable(problem: Problem, pins: Pins, result: SearchResult) -> bool:
    """Memory allowed some micro-batch, but none reaches the global batch within the tolerance."""
    if problem.global_batch_tokens is None or pins.micro_batch_size is not None:
        return False
    return any(f.max_fitting_mbs > 0 for f in result.families)


def _batch_note(problem: Problem, best: Scored) -> list[str]:
    """Say when the global batch had to be rounded up to whole micro-batches."""
    asked = problem.global_batch_tokens
    got = problem.tokens_per_micro_step(best.setting, best.setting.micro_batch_size)
    got *= best.gradient_accumulation_steps
    if asked is None or got == asked:
        return []
    return [f"global batch {got:,} tokens: {asked:,} requested, rounded to whole micro-batches"]


def _check_global_batch(problem: Problem, fams: list[Setting], pins: Pins) -> None:
    gbt = problem.global_batch_tokens
    if gbt is None:
        return
    mbs = pins.micro_batch_size
    if mbs is not None and all(problem.max_mbs(f) < mbs for f in fams):
        least = min(problem.tokens_per_micro_step(f, mbs) for f in fams)
        raise PlanningError(
            "spec.tuning.microBatchSize",
            f"micro-batch {mbs} puts {least:,} tokens in one micro-step over all GPUs, more than "
            f"globalBatchTokens {gbt:,}",
            "use a smaller micro-batch, auto, or a larger globalBatchTokens",
        )
    if mbs is not None and not any(problem.batch_ok(f, mbs) for f in fams):
        step = min(problem.tokens_per_micro_step(f, mbs) for f in fams)
        raise PlanningError(
            "spec.tuning.microBatchSize",
            f"whole micro-batches of {mbs} ({step:,} tokens per micro-step) cannot reach globalBatchTokens "
            f"{gbt:,} within {GLOBAL_BATCH_TOLERANCE:.0%}",
            f"use auto, or a globalBatchTokens that is a multiple of {step:,}",
        )
    if all(problem.max_mbs(f) < 1 for f in fams):
        least = min(problem.tokens_per_micro_step(f, 1) for f in fams)
        raise PlanningError(
            "spec.training.globalBatchTokens",
            f"{gbt:,} tokens is less than one sequence per data-parallel rank ({least:,} tokens)",
            f"use a multiple of {least:,} or leave it unset",
        )


def _alternatives(
    best: Scored, result: SearchResult, budget: float, hw: Hardware, cal: Calibration
) -> list[Alternative]:
    """The best candidate of each other family, plus faster ones that did not fit, best first."""
    picks: list[Scored] = []
    seen = {best.setting.family}
    for s in result.ranked:
        if s.setting.family not in seen:
            seen.add(s.setting.family)
            picks.append(s)
        if len(picks) >= ALTERNATIVES:
            break
    too_big = [
        f.first_too_big
        for f in result.families
        if f.first_too_big is not None
        and f.first_too_big.time is not None
        and f.first_too_big.tokens_per_second > best.tokens_per_second
    ]
    too_big.sort(key=lambda s: -s.tokens_per_second)
    chosen = picks[: ALTERNATIVES - min(2, len(too_big))] + too_big[:2]
    chosen.sort(key=lambda s: (not s.fits, -s.tokens_per_second))
    return [
        Alternative(
            candidate=_candidate(s, hw, cal), prediction=_prediction(s), reason=loss_reason(best, s, budget)
        )
        for s in chosen
    ]


def _no_plan(
    spec: BlackwellTrainingJobSpec, cal: Calibration, pins: Pins, result: SearchResult, problem: Problem
) -> PlanningError:
    """The most useful error when nothing fits."""
    budget = problem.budget_bytes
    if pins.micro_batch_size is not None:
        tried = [f.first_too_big for f in result.families if f.first_too_big is not None]
        smallest = min(tried, key=lambda s: s.memory.peak_reserved)
        unpinned = Pins(
            pins.precision, pins.activation_checkpointing, None, pins.sharding, pins.context_parallel
        )
        fams = families(unpinned, problem.hw, cal, problem.sequence_length, spec.tuning.compile)
        fit_problem = _problem(spec, cal, problem.hw)
        fits = run_search(fit_problem, fams)
        largest = max((f.max_fitting_mbs for f in fits.families), default=0)
        hint = f"the largest micro-batch that fits is {largest}" if largest else "no micro-batch fits"
        return PlanningError(
            "spec.tuning.microBatchSize",
            f"micro-batch {pins.micro_batch_size} needs {gib(smallest.memory.peak_reserved)} per GPU at best "
            f"({describe(smallest)}) > {gib(budget)} budget",
            f"use auto or {largest}" if largest else f"use more nodes; {hint}",
        )
    scored = [f.first_too_big for f in result.families if f.first_too_big is not None]
    smallest_mem = min((s.memory.peak_reserved for s in scored), default=0)
    nodes = _smallest_node_count(spec, cal, pins)
    fix = (
        f"use at least {nodes} nodes" if nodes else "use a larger GPU, a shorter sequence or fewer parameters"
    )
    hw = problem.hw
    return PlanningError(
        "spec.cluster.nodes",
        f"nothing fits: the smallest candidate needs {gib(smallest_mem)} per GPU > {gib(budget)} budget on "
        f"{hw.nodes} x {hw.instance.instance_type}",
        fix,
    )


def _smallest_node_count(spec: BlackwellTrainingJobSpec, cal: Calibration, pins: Pins) -> int | None:
    """Fewest nodes at which some candidate fits at micro-batch 1 (doubling, then bisection)."""

    def fits(nodes: int) -> bool:
        hw = _hardware(spec, nodes)
        problem = _problem(spec, cal, hw)
        problem.global_batch_tokens = None
        for fam in families(pins, hw, cal, spec.training.sequence_length, spec.tuning.compile):
            if fam.sharding is not Sharding.NONE and problem.fits(fam):
                return True
        return False

    lo, hi = spec.cluster.nodes, spec.cluster.nodes * 2
    while not fits(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_NODES_SEARCHED:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi

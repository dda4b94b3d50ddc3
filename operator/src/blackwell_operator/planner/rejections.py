"""Why a spec cannot be planned: global-batch conflicts, pinned sizes that do not fit, too few nodes."""

from __future__ import annotations

import math

from blackwell_operator.calibration import Calibration
from blackwell_operator.catalogs import get_instance
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.candidates import CP_DEGREES, Pins, families
from blackwell_operator.planner.explain import describe
from blackwell_operator.planner.figures import limit, need
from blackwell_operator.planner.inputs import hardware_for, problem_for
from blackwell_operator.planner.layout import Setting
from blackwell_operator.planner.search import Problem, SearchResult, run_search
from blackwell_trainer.config import Sharding

MAX_NODES_SEARCHED = 1024


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


def no_plan(
    spec: BlackwellTrainingJobSpec, cal: Calibration, pins: Pins, result: SearchResult, problem: Problem
) -> PlanningError:
    """The most useful error when nothing fits: what the pinned size needs, or the nodes it would take."""
    budget = problem.budget_bytes
    if pins.micro_batch_size is not None:
        tried = [f.first_too_big for f in result.families if f.first_too_big is not None]
        smallest = min(tried, key=lambda s: s.memory.peak_reserved)
        unpinned = Pins(
            pins.precision, pins.activation_checkpointing, None, pins.sharding, pins.context_parallel
        )
        fams = families(unpinned, problem.hw, cal, problem.sequence_length, spec.tuning.compile)
        fit_problem = problem_for(spec, cal, problem.hw)
        fits = run_search(fit_problem, fams)
        largest = max((f.max_fitting_mbs for f in fits.families), default=0)
        hint = f"the largest micro-batch that fits is {largest}" if largest else "no micro-batch fits"
        return PlanningError(
            "spec.tuning.microBatchSize",
            f"micro-batch {pins.micro_batch_size} needs {need(smallest.memory.peak_reserved)} per GPU at "
            f"best ({describe(smallest)}) > {limit(budget)} budget",
            f"use auto or {largest}" if largest else f"use more nodes; {hint}",
        )
    scored = [f.first_too_big for f in result.families if f.first_too_big is not None]
    smallest_mem = min((s.memory.peak_reserved for s in scored), default=0)
    field = "spec.cluster.nodes"
    gpus = smallest_gpus_per_node(spec, cal, pins)
    nodes = None if gpus else smallest_node_count(spec, cal, pins)
    if nodes == spec.cluster.nodes:  # more nodes is not what is missing
        nodes = None
    cp_fix = None if gpus or nodes else smallest_context_parallel_layout(spec, cal, pins)
    if gpus:
        # The nodes have GPUs the spec leaves idle: sharding over them is the cheapest fix.
        field = "spec.cluster.gpusPerNode"
        fix = f"use gpusPerNode: {gpus} or more (the instance has {problem.hw.instance.gpus_per_node})"
    elif nodes:
        fix = f"use at least {nodes} nodes"
    elif cp_fix:
        cp_nodes, cp = cp_fix
        if cp_nodes == spec.cluster.nodes:  # the nodes are enough once the sequence is split
            field = "spec.tuning.contextParallel"
        how = (
            f"set spec.tuning.contextParallel: {cp}"
            if cp_nodes == spec.cluster.nodes
            else f"use at least {cp_nodes} nodes with spec.tuning.contextParallel: {cp}"
        )
        fix = (
            f"{how} (one sequence's activations exceed the budget unless it is split over GPUs; auto "
            "does not split it with this calibration)"
        )
    elif not cal.trainer.context_parallel:
        # Sharding more widely cannot shrink per-GPU activations; only splitting the sequence could,
        # and the trainer this calibration describes cannot do that yet.
        shorter = longest_fitting_sequence(spec, cal, pins)
        field = "spec.training.sequenceLength"
        fix = (
            (
                f"use spec.training.sequenceLength: {shorter} or shorter, or a GPU with more memory"
                if shorter
                else "use a GPU with more memory"
            )
            + ": no node count fits, because the activations of one sequence alone exceed the budget and "
            "this trainer has no context parallelism yet"
        )
    else:
        fix = "use a larger GPU, a shorter sequence or fewer parameters"
    hw = problem.hw
    fix += _less_headroom(spec, smallest_mem, hw.gpu.memory_bytes)
    part = hw.gpus_per_node < hw.instance.gpus_per_node
    using = f" ({hw.gpus_per_node} GPU{'s' if hw.gpus_per_node > 1 else ''} per node)" if part else ""
    return PlanningError(
        field,
        f"nothing fits: the smallest candidate needs {need(smallest_mem)} per GPU > {limit(budget)} budget "
        f"on {hw.nodes} x {hw.instance.instance_type}{using}",
        fix,
    )


def _less_headroom(spec: BlackwellTrainingJobSpec, needed: float, gpu_memory: int) -> str:
    """The smaller memoryHeadroom that would fit the smallest candidate, when there is one worth naming."""
    # Floor to whole percent so the named value really fits; below 1% nothing is left for the allocator.
    room = math.floor((1.0 - needed / gpu_memory) * 100) / 100
    if needed <= 0 or room < 0.01 or room >= spec.tuning.memory_headroom:
        return ""
    return (
        f"; or, on these GPUs, spec.tuning.memoryHeadroom: {room:.2f} (the smallest candidate leaves "
        f"{room:.0%} of the GPU free; this close to the capacity the allocator may have to free and retry, "
        "which slows every step)"
    )


def smallest_gpus_per_node(spec: BlackwellTrainingJobSpec, cal: Calibration, pins: Pins) -> int | None:
    """Fewest GPUs per node that fit on the spec's nodes, when it uses fewer GPUs than a node has."""
    asked = spec.cluster.gpus_per_node
    available = get_instance(spec.cluster.instance_type).gpus_per_node
    if asked is None or asked >= available:
        return None
    for gpus in range(asked + 1, available + 1):
        wider = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"gpus_per_node": gpus})})
        if _some_candidate_fits(wider, cal, pins, spec.cluster.nodes):
            return gpus
    return None


def _some_candidate_fits(spec: BlackwellTrainingJobSpec, cal: Calibration, pins: Pins, nodes: int) -> bool:
    """Whether any sharded candidate fits at micro-batch 1 on `nodes` nodes (whatever the global batch)."""
    hw = hardware_for(spec, nodes)
    problem = problem_for(spec, cal, hw)
    problem.global_batch_tokens = None
    for fam in families(pins, hw, cal, spec.training.sequence_length, spec.tuning.compile):
        if fam.sharding is not Sharding.NONE and problem.fits(fam):
            return True
    return False


def smallest_context_parallel_layout(
    spec: BlackwellTrainingJobSpec, cal: Calibration, pins: Pins
) -> tuple[int, int] | None:
    """Fewest nodes (and the CP degree) that fit when the trainer can split the sequence but auto does not."""
    if pins.context_parallel is not None or not cal.trainer.context_parallel:
        return None
    gpus = hardware_for(spec, spec.cluster.nodes).gpus_per_node
    best: tuple[int, int] | None = None
    # CP groups stay inside a node (consecutive ranks), so degrees up to the GPUs of one node.
    for cp in (c for c in CP_DEGREES if c <= gpus and spec.training.sequence_length % (2 * c) == 0):
        with_cp = Pins(pins.precision, pins.activation_checkpointing, None, pins.sharding, cp)
        nodes = smallest_node_count(spec, cal, with_cp)
        if nodes and (best is None or nodes < best[0]):
            best = (nodes, cp)
    return best


def longest_fitting_sequence(spec: BlackwellTrainingJobSpec, cal: Calibration, pins: Pins) -> int | None:
    """The longest of sequence/2, /4, ... (at least 128) at which some candidate fits on the spec's nodes."""
    seq = spec.training.sequence_length // 2
    while seq >= 128:
        shorter = spec.model_copy(
            update={"training": spec.training.model_copy(update={"sequence_length": seq})}
        )
        if _some_candidate_fits(shorter, cal, pins, spec.cluster.nodes):
            return seq
        seq //= 2
    return None


def smallest_node_count(spec: BlackwellTrainingJobSpec, cal: Calibration, pins: Pins) -> int | None:
    """Fewest nodes, from the spec's own, at which some candidate fits at micro-batch 1 (doubling, then
    bisection)."""

    def fits(nodes: int) -> bool:
        return _some_candidate_fits(spec, cal, pins, nodes)

    if fits(spec.cluster.nodes):  # the nodes the user has may already do (with other pins)
        return spec.cluster.nodes
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

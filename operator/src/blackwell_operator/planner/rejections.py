"""Why nothing fits, and the change that makes it fit: each advised change is planned before it is named.

The advice searches what auto may change (context parallelism included, which auto reaches where
nothing without it fits); every alternative a refusal names is one `solve` accepts, applied to the spec
as written (`SpecError.remedies` carries them as data).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.catalogs import get_gpu, get_instance, list_instances
from blackwell_operator.errors import Changes, PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.candidates import Pins
from blackwell_operator.planner.explain import describe
from blackwell_operator.planner.figures import limit, need
from blackwell_operator.planner.inputs import hardware_for
from blackwell_operator.planner.nodecount import MAX_NODES_SEARCHED, fewest_nodes
from blackwell_operator.planner.solve import Context, Solved, solve, unreachable_global_batch

NODES, GPUS = "spec.cluster.nodes", "spec.cluster.gpusPerNode"
MBS, CP = "spec.tuning.microBatchSize", "spec.tuning.contextParallel"
SEQUENCE, GLOBAL_BATCH = "spec.training.sequenceLength", "spec.training.globalBatchTokens"
HEADROOM, INSTANCE = "spec.tuning.memoryHeadroom", "spec.cluster.instanceType"
# Node counts tried above the fewest that fit in memory, for a global batch those counts cannot reach.
BATCH_WALK = 8
# The wire names of the spec fields a remedy may change (the model's field names, per section).
_FIELDS = {
    NODES: ("cluster", "nodes"),
    GPUS: ("cluster", "gpus_per_node"),
    INSTANCE: ("cluster", "instance_type"),
    "spec.tuning.precision": ("tuning", "precision"),
    "spec.tuning.activationCheckpointing": ("tuning", "activation_checkpointing"),
    "spec.tuning.sharding": ("tuning", "sharding"),
    MBS: ("tuning", "micro_batch_size"),
    CP: ("tuning", "context_parallel"),
    HEADROOM: ("tuning", "memory_headroom"),
    SEQUENCE: ("training", "sequence_length"),
    GLOBAL_BATCH: ("training", "global_batch_tokens"),
}


@dataclass(frozen=True)
class Remedy:
    """One alternative of a fix: the changes and the words that name them."""

    changes: Mapping[str, Any]
    text: str


def changed(spec: BlackwellTrainingJobSpec, changes: Changes) -> BlackwellTrainingJobSpec:
    """The spec with `changes` applied (the fields of _FIELDS)."""
    sections: dict[str, dict[str, Any]] = {}
    for path, value in changes.items():
        section, name = _FIELDS[path]
        sections.setdefault(section, {})[name] = value
    return spec.model_copy(
        update={
            section: getattr(spec, section).model_copy(update=values) for section, values in sections.items()
        }
    )


def _plan_at(spec: BlackwellTrainingJobSpec, ctx: Context, changes: Changes) -> Solved | None:
    """The search of the changed spec when it finds a plan."""
    try:
        solved = solve(changed(spec, changes), ctx)
    except PlanningError:
        return None
    return solved if solved.result.best is not None else None


def _refusal(field: str, problem: str, remedies: list[Remedy], why: str = "") -> PlanningError:
    fix = "; or ".join(r.text for r in remedies) + why
    return PlanningError(field, problem, fix, remedies=[r.changes for r in remedies])


def _split_note(solved: Solved) -> str:
    best = solved.result.best
    cp = best.setting.context_parallel if best else 1
    if cp == 1 or solved.pins.context_parallel is not None:
        return ""
    return f", auto splitting each sequence over {cp} GPUs"


def nodes_remedy(spec: BlackwellTrainingJobSpec, ctx: Context, with_changes: Changes) -> Remedy | None:
    """The fewest nodes at which the spec (with `with_changes`) plans, over every CP degree auto may use.

    The memory search gives the fewest nodes that fit; a global batch those cannot reach is tried on the
    next few counts, then at that count with the global batch rounded to one it reaches.
    """
    base = changed(spec, with_changes)
    fewest = fewest_nodes(base, ctx, Pins.of(base.tuning))
    if fewest is None:
        return None

    def at(nodes: int, **more: Any) -> tuple[dict[str, Any], str]:
        """The changes for `nodes` nodes (none where the spec has them) and their words."""
        if nodes == spec.cluster.nodes:
            return {**with_changes, **more}, ""
        return {
            **with_changes,
            NODES: nodes,
            **more,
        }, f"use {nodes} nodes ({NODES}: {nodes}, the fewest that fit"

    for nodes in range(fewest, min(fewest + BATCH_WALK, MAX_NODES_SEARCHED) + 1):
        changes, words = at(nodes)
        if not words:
            continue  # these nodes, as they are, are what was refused
        found = _plan_at(spec, ctx, changes)
        if found is not None:
            return Remedy(changes, f"{words}{_split_note(found)})")
    gbt = spec.training.global_batch_tokens
    if gbt is None:
        return None
    per_step = base.training.sequence_length * hardware_for(base, fewest).world
    rounded = max(1, round(gbt / per_step)) * per_step
    rule = "unset: the planner's rule, docs/global-batch.md"
    for value, why in ((rounded, "whole sequences on every GPU"), (None, rule)):
        changes, words = at(fewest, **{GLOBAL_BATCH: value})
        found = _plan_at(spec, ctx, changes)
        if found is not None:
            said = "unset" if value is None else value
            lead = f"{words}{_split_note(found)}) with " if words else ""
            return Remedy(changes, f"{lead}{GLOBAL_BATCH}: {said} ({why})")
    return None


def refusal(spec: BlackwellTrainingJobSpec, ctx: Context, solved: Solved) -> PlanningError:
    """Why a search found no plan, with the advice: a global batch no fitting micro-batch reaches (memory
    is not what is missing), else what nothing fitting takes."""
    unreachable = unreachable_global_batch(solved.problem, solved.pins, solved.plain)
    if unreachable is not None:
        return with_remedies(spec, ctx, unreachable)
    return no_plan(spec, ctx, solved)


def no_plan(spec: BlackwellTrainingJobSpec, ctx: Context, solved: Solved) -> PlanningError:
    """The most useful error when nothing fits: the pinned size's need, or the change that fits."""
    if solved.pins.micro_batch_size is not None:
        return _pinned_micro_batch(spec, ctx, solved)
    problem = solved.problem
    hw = problem.hw
    # The figure of the search without CP where it has one (what a spec's refusal always said), else of
    # the search with CP offered.
    scored = [f.first_too_big for f in solved.plain.families if f.first_too_big is not None]
    if not scored and solved.split is not None:
        scored = [f.first_too_big for f in solved.split.families if f.first_too_big is not None]
    smallest_mem = min((s.memory.peak_reserved for s in scored), default=0)
    part = hw.gpus_per_node < hw.instance.gpus_per_node
    using = f" ({hw.gpus_per_node} GPU{'s' if hw.gpus_per_node > 1 else ''} per node)" if part else ""
    where = f"{hw.nodes} x {hw.instance.instance_type}{using}"
    what = f"nothing fits: the smallest candidate needs {need(smallest_mem)} per GPU > "
    what += f"{limit(problem.budget_bytes)} budget on {where}"
    gbt = spec.training.global_batch_tokens
    if not scored and gbt is not None:  # memory limited no candidate: the global batch did
        what = (
            f"nothing fits: no candidate both fits in memory and reaches globalBatchTokens {gbt:,} with "
            f"whole micro-batches on {where}"
        )
    field, remedies, why = NODES, [], ""
    gpus = smallest_gpus_per_node(spec, ctx)
    if gpus is not None:
        # The nodes have GPUs the spec leaves idle: sharding over them is the cheapest fix.
        field = GPUS
        remedies.append(
            Remedy({GPUS: gpus}, f"use {GPUS}: {gpus} (the instance has {hw.instance.gpus_per_node})")
        )
    else:
        nodes = nodes_remedy(spec, ctx, {})
        if nodes is not None:
            remedies.append(nodes)
    if gbt is not None and _plan_at(spec, ctx, {GLOBAL_BATCH: None}) is not None:
        rule = "the planner's rule, docs/global-batch.md"
        remedies.append(Remedy({GLOBAL_BATCH: None}, f"leave {GLOBAL_BATCH} unset ({rule})"))
    if solved.pins.context_parallel is not None and _plan_at(spec, ctx, {CP: "auto"}) is not None:
        remedies.append(Remedy({CP: "auto"}, f"{CP}: auto (it splits each sequence over GPUs where needed)"))
    if not remedies:
        remedies += _unpinned(spec, ctx, solved.pins)
    if not remedies:
        # No node count fits: one sequence's activations exceed the budget however widely the model is
        # sharded, or the model states do on every node count the CRD allows.
        field = SEQUENCE
        remedies += _shorter_sequence(spec, ctx) + _larger_gpu(spec, ctx)
        why = f" (no node count up to {MAX_NODES_SEARCHED} fits this model at this sequence length)"
        if not remedies:
            field = NODES
            why = (
                f"use a smaller model: no node count up to {MAX_NODES_SEARCHED}, no shorter sequence and no "
                "GPU of the catalog fits it"
            )
    headroom = _less_headroom(spec, ctx, smallest_mem, hw.gpu.memory_bytes)
    if headroom is not None:
        remedies.append(headroom)
    return _refusal(field, what, remedies, why)


def _pinned_micro_batch(spec: BlackwellTrainingJobSpec, ctx: Context, solved: Solved) -> PlanningError:
    """A pinned micro-batch that fits no candidate: what it needs, and the micro-batch or nodes that fit."""
    tried = [f.first_too_big for f in solved.result.families if f.first_too_big is not None]
    smallest = min(tried, key=lambda s: s.memory.peak_reserved)
    pinned = solved.pins.micro_batch_size
    remedies: list[Remedy] = []
    unpinned = _plan_at(spec, ctx, {MBS: "auto"})
    if unpinned is not None and unpinned.result.best is not None:
        largest = max(f.max_fitting_mbs for f in unpinned.result.families)
        if _plan_at(spec, ctx, {MBS: largest}) is None:
            largest = unpinned.result.best.setting.micro_batch_size
        remedies.append(Remedy({MBS: "auto"}, f"use {MBS}: auto"))
        remedies.append(Remedy({MBS: largest}, f"{MBS}: {largest} (the largest that fits)"))
    else:  # nothing fits these nodes: the fewest that fit the pinned micro-batch, or auto's
        for keep in ({}, {MBS: "auto"}):
            nodes = nodes_remedy(spec, ctx, keep)
            if nodes is not None:
                remedies.append(nodes if not keep else Remedy(nodes.changes, f"{MBS}: auto and {nodes.text}"))
        if not remedies:
            remedies += _unpinned(spec, ctx, solved.pins)
    return _refusal(
        MBS,
        f"micro-batch {pinned} needs {need(smallest.memory.peak_reserved)} per GPU at best "
        f"({describe(smallest)}) > {limit(solved.problem.budget_bytes)} budget",
        remedies,
        ""
        if remedies
        else f"use a smaller model: no micro-batch fits on any node count up to {MAX_NODES_SEARCHED}",
    )


def _less_headroom(
    spec: BlackwellTrainingJobSpec, ctx: Context, needed: float, gpu_memory: int
) -> Remedy | None:
    """The smaller memoryHeadroom that would fit the smallest candidate, when there is one worth naming."""
    # Floor to whole percent so the named value really fits; below 1% nothing is left for the allocator.
    room = math.floor((1.0 - needed / gpu_memory) * 100) / 100
    if needed <= 0 or room < 0.01 or room >= spec.tuning.memory_headroom:
        return None
    if _plan_at(spec, ctx, {HEADROOM: room}) is None:
        return None
    return Remedy(
        {HEADROOM: room},
        f"on these GPUs, {HEADROOM}: {room:.2f} (the smallest candidate leaves {room:.0%} of the GPU free; "
        "this close to the capacity the allocator may have to free and retry, which slows every step)",
    )


def smallest_gpus_per_node(spec: BlackwellTrainingJobSpec, ctx: Context) -> int | None:
    """Fewest GPUs per node with which the spec plans on its nodes, when it uses fewer than a node has."""
    asked = spec.cluster.gpus_per_node
    available = get_instance(spec.cluster.instance_type).gpus_per_node
    if asked is None or asked >= available:
        return None
    for gpus in range(asked + 1, available + 1):
        if _plan_at(spec, ctx, {GPUS: gpus}) is not None:
            return gpus
    return None


def _shorter_sequence(spec: BlackwellTrainingJobSpec, ctx: Context) -> list[Remedy]:
    """The longest of sequence/2, /4, ... (at least 128) with which the spec plans on its nodes."""
    seq = spec.training.sequence_length // 2
    while seq >= 128:
        if _plan_at(spec, ctx, {SEQUENCE: seq}) is not None:
            return [Remedy({SEQUENCE: seq}, f"use {SEQUENCE}: {seq}")]
        seq //= 2
    return []


def _larger_gpu(spec: BlackwellTrainingJobSpec, ctx: Context) -> list[Remedy]:
    """The instance type, of those with GPUs of more memory, on which the spec plans on its nodes."""
    here = get_gpu(get_instance(spec.cluster.instance_type).gpu).memory_bytes
    larger = sorted(
        (i for i in list_instances() if get_gpu(i.gpu).memory_bytes > here),
        key=lambda i: (get_gpu(i.gpu).memory_bytes, i.instance_type),
    )
    for instance in larger:
        if _plan_at(spec, ctx, {INSTANCE: instance.instance_type}) is not None:
            return [Remedy({INSTANCE: instance.instance_type}, f"{INSTANCE}: {instance.instance_type}")]
    return []


# The tuning pins, by field, and whether each is pinned in a spec's Pins.
_PINS = {
    "spec.tuning.precision": "precision",
    "spec.tuning.activationCheckpointing": "activation_checkpointing",
    MBS: "micro_batch_size",
    "spec.tuning.sharding": "sharding",
    CP: "context_parallel",
}


def _unpinned(spec: BlackwellTrainingJobSpec, ctx: Context, pins: Pins) -> list[Remedy]:
    """Where nothing the pins allow fits on any node count: the pins whose auto plans (each alone, else
    all of them, else all of them on the fewest nodes that fit)."""
    pinned = [path for path, name in _PINS.items() if getattr(pins, name) is not None]
    found = [
        Remedy({path: "auto"}, f"{path}: auto") for path in pinned if _plan_at(spec, ctx, {path: "auto"})
    ]
    if found or not pinned:
        return found
    every = {path: "auto" for path in pinned}
    words = ", ".join(f"{path}: auto" for path in pinned)
    if len(pinned) > 1 and _plan_at(spec, ctx, every) is not None:
        return [Remedy(every, words)]
    nodes = nodes_remedy(spec, ctx, every)
    return [] if nodes is None else [Remedy(nodes.changes, f"{words} and {nodes.text}")]


def with_remedies(spec: BlackwellTrainingJobSpec, ctx: Context, error: PlanningError) -> PlanningError:
    """A refusal of a pinned value or a global batch, with its advice as remedies that plan.

    Its Fix names auto (or unset) first; where that plans too, it is the remedy; where nothing fits
    then, the refusal that spec would get is added, so the advice followed to the end plans.
    """
    if error.remedies:
        return error
    if error.field in _PINS and getattr(Pins.of(spec.tuning), _PINS[error.field]) is not None:
        first: Changes = {error.field: "auto"}
    elif error.field == GLOBAL_BATCH and spec.training.global_batch_tokens is not None:
        first = {GLOBAL_BATCH: None}
    else:
        return error
    said = "unset" if next(iter(first.values())) is None else "auto"
    fix = error.fix if said in error.fix else f"{error.fix}; or {error.field}: {said}"
    if _plan_at(spec, ctx, first) is not None:
        return PlanningError(error.field, error.problem, fix, remedies=[first])
    unpinned = changed(spec, first)
    try:
        solved = solve(unpinned, ctx)
        then = refusal(unpinned, ctx, solved) if solved.result.best is None else None
    except PlanningError as inner:  # each step frees one more field: this ends
        then = with_remedies(unpinned, ctx, inner)
    if then is None:
        return error
    # Freed, the field still leaves nothing to plan (no remedy: a smaller model): say so, not only "auto".
    remedies = [{**first, **r} for r in then.remedies]
    return PlanningError(error.field, error.problem, f"{fix}; with it {said}, {then.fix}", remedies=remedies)

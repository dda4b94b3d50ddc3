"""The fewest nodes on which a spec's model fits, over every context-parallel degree auto may use.

Per CP degree the per-GPU memory of a candidate never rises with the node count (parameters, gradients
and optimizer states are sharded over more GPUs; one sequence's activations stay the same), so the
fewest nodes are found by doubling and bisection, not by planning every count; a degree needs a world
it divides, so it is searched over the node counts that give one. The least over the degrees is the
answer: below it no candidate of any degree fits, which is what makes the advice minimal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.candidates import CP_DEGREES, MIN_TOKENS_PER_CP_RANK, Pins, families
from blackwell_operator.planner.inputs import hardware_for
from blackwell_operator.planner.solve import Context

# The CRD's bound on spec.cluster.nodes: no advice names more.
MAX_NODES_SEARCHED = 1024


def cp_degrees(spec: BlackwellTrainingJobSpec, pins: Pins, ctx: Context) -> list[int]:
    """The context-parallel degrees the planner may use for this spec: the pinned one, or under auto
    every degree the trainer can run at this sequence length (auto reaches them where nothing else fits)."""
    if pins.context_parallel is not None:
        return [pins.context_parallel]
    if not ctx.cal.trainer.context_parallel:
        return [1]
    seq = spec.training.sequence_length
    return [
        1,
        *(c for c in CP_DEGREES if seq % (2 * c) == 0 and seq // c >= MIN_TOKENS_PER_CP_RANK),
    ]


def fits_at(spec: BlackwellTrainingJobSpec, ctx: Context, pins: Pins, cp: int, nodes: int) -> bool:
    """Whether a candidate the pins allow, with CP degree `cp`, fits in memory on `nodes` nodes at the
    pinned micro-batch (else 1); the global batch aside, which the caller checks with a real plan."""
    hw = hardware_for(spec, nodes)
    if hw.world % cp:
        return False
    problem = ctx.problem(spec, hw)
    problem.global_batch_tokens = None
    mbs = pins.micro_batch_size or 1
    # The families as auto would make them at CP 1 (a pinned degree is set below, not validated here).
    base = Pins(
        pins.precision,
        pins.activation_checkpointing,
        None,
        pins.sharding,
        None,
        pins.allow_unverified_recipes,
    )
    seq = spec.training.sequence_length
    for family in families(base, hw, ctx.cal, seq, spec.tuning.compile, auto_cp=False):
        setting = replace(family, context_parallel=cp, micro_batch_size=mbs)
        if problem.max_mbs(setting) >= mbs and problem.fits(setting):
            return True
    return False


def fewest_nodes(spec: BlackwellTrainingJobSpec, ctx: Context, pins: Pins) -> int | None:
    """The fewest nodes (at most MAX_NODES_SEARCHED) at which some candidate fits in memory; None if none."""
    gpus = hardware_for(spec).gpus_per_node
    best: int | None = None
    # Wider degrees first: they fit on the fewest nodes most often, and bound the search of the others.
    for cp in sorted(cp_degrees(spec, pins, ctx), reverse=True):
        step = cp // math.gcd(cp, gpus)  # node counts whose world the degree divides: multiples of this
        most = MAX_NODES_SEARCHED // step
        if best is not None:
            most = min(most, (best - 1) // step)  # only a smaller count is worth finding

        def test(m: int, cp: int = cp, step: int = step) -> bool:
            return fits_at(spec, ctx, pins, cp, m * step)

        # One probe at the bound rules a degree out (memory never rises with the nodes); else doubling
        # from one node finds the usual small answer in a few probes.
        if most < 1 or not test(most):
            continue
        found = first_true(test, most)
        if found is not None:
            best = found * step
    return best


def first_true(test: Callable[[int], bool], most: int) -> int | None:
    """The least m in [1, most] with test(m), for a test that stays true once true: doubling, then
    bisection (about 2 log2(most) calls)."""
    if most < 1:
        return None
    low, high = 0, 1  # invariant: test(low) is false (or low is 0), test(high) is unknown
    while not test(high):
        if high >= most:
            return None
        low, high = high, min(high * 2, most)
    while high - low > 1:
        mid = (low + high) // 2
        if test(mid):
            high = mid
        else:
            low = mid
    return high

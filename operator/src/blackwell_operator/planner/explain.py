"""Human-readable reasons: why the winner won, why each runner-up lost, and why a job cannot be planned."""

from __future__ import annotations

from blackwell_operator.calibration import TrainerCapabilities
from blackwell_operator.planner.candidates import Pins, distinct_checkpointing
from blackwell_operator.planner.figures import gib, limit, over, tenths
from blackwell_operator.planner.layout import Setting
from blackwell_operator.planner.search import Scored, SearchResult
from blackwell_trainer.plan.config import ActivationCheckpointing, Precision

__all__ = ["describe", "explain", "gib", "loss_reason"]


def describe(s: Scored) -> str:
    """A candidate in a few words."""
    st = s.setting
    recipe = "" if st.recipe.value == "none" else f"/{st.recipe.value}"
    cp = f", cp {st.context_parallel}" if st.context_parallel > 1 else ""
    return (
        f"{st.precision.value}{recipe}, AC {st.activation_checkpointing.value}, mbs {st.micro_batch_size}, "
        f"{st.sharding.value} sharding{cp}"
    )


def loss_reason(winner: Scored, other: Scored, budget: float) -> str:
    """Why `other` lost to `winner`."""
    if not other.fits:
        return f"needs {over(other.memory.peak_reserved, budget)} budget"
    slower = 1.0 - other.tokens_per_second / winner.tokens_per_second
    if slower > 0.0005:
        return f"{slower:.1%} slower"
    return "as fast, but uses more memory or a larger micro-batch"


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1.0):+.1%}"


def explain(
    winner: Scored, result: SearchResult, budget: float, pins: Pins, trainer: TrainerCapabilities
) -> list[str]:
    """Short reasons for each chosen value, from the scored candidates (`pins`: what the spec fixed;
    `trainer`: the calibration's, for the AC modes it runs as another)."""
    st, mem = winner.setting, winner.memory
    lines: list[str] = []

    best_by = _best_by(result)
    bf16 = best_by["precision"].get(Precision.BF16.value)
    if st.precision is Precision.BF16:
        lows = [s for k, s in best_by["precision"].items() if k != Precision.BF16.value]
        if lows:
            best_low = max(lows, key=lambda s: s.tokens_per_second)
            lines.append(
                f"precision bf16: the best low-precision option ({best_low.setting.precision.value}/"
                f"{best_low.setting.recipe.value}) is "
                f"{_pct(best_low.tokens_per_second, winner.tokens_per_second)}"
                " at these GEMM shapes (casting and host overheads outweigh the faster GEMMs)"
            )
        elif pins.precision is not None:  # pinned: the GPU may well offer more (an H200 runs FP8)
            lines.append("precision bf16: pinned by spec.tuning.precision")
        else:
            lines.append("precision bf16: the only precision this GPU and trainer offer")
    elif bf16 is not None:
        lines.append(
            f"precision {st.precision.value} ({st.recipe.value}): "
            f"{_pct(winner.tokens_per_second, bf16.tokens_per_second)} tokens/s over the best bf16 candidate"
        )
    elif pins.precision is not None:
        lines.append(f"precision {st.precision.value} ({st.recipe.value}): pinned by spec.tuning.precision")
    else:  # auto, and no bf16 candidate fits: say so instead of calling the choice pinned
        lines.append(
            f"precision {st.precision.value} ({st.recipe.value}): the fastest that fits; bf16 does not fit "
            "the budget at any micro-batch"
        )

    tried_ac = {f.family.activation_checkpointing for f in result.families}
    for mode in ActivationCheckpointing:
        other = best_by["ac"].get(mode.value)
        if mode is st.activation_checkpointing or mode not in tried_ac:
            continue
        if other is None:
            lines.append(
                f"activation checkpointing {st.activation_checkpointing.value}: {mode.value} does not fit "
                "even at micro-batch 1"
            )
            continue
        lines.append(
            f"activation checkpointing {st.activation_checkpointing.value}: {mode.value} would be "
            f"{loss_reason(winner, other, budget)} (best: {_best_of(other, st)})"
        )
    lines += _scored_once(result, pins, trainer) + _modelled_as(st, trainer)

    fam = next(f for f in result.families if f.family.family == st.family)
    mbs_line = f"micro-batch {st.micro_batch_size}"
    if fam.first_too_big is not None and fam.max_fitting_mbs == st.micro_batch_size:
        mbs_line += (
            f" is the largest that fits (mbs {fam.first_too_big.setting.micro_batch_size} needs "
            f"{over(fam.first_too_big.memory.peak_reserved, budget)})"
        )
    elif fam.max_fitting_mbs > st.micro_batch_size:
        mbs_line += (
            f" (up to {fam.max_fitting_mbs} fits; this size gives the best tokens/s for the global batch)"
        )
    else:
        mbs_line += " (the largest the global batch or trainer allows)"
    lines.append(mbs_line)

    states = gib(mem.parameters + mem.gradients + mem.optimizer_states)
    tried = {f.family.sharding.value for f in result.families}
    others = _other(best_by["sharding"], st.sharding.value, winner, budget, tried)
    lines.append(f"sharding {st.sharding.value}: model states {states} per GPU{others}")
    if st.context_parallel > 1 or len(best_by["cp"]) > 1:
        lines.append(
            f"context parallel {st.context_parallel}"
            + _other(
                best_by["cp"],
                str(st.context_parallel),
                winner,
                budget,
                {str(f.family.context_parallel) for f in result.families},
            )
        )
    if winner.gradient_accumulation_steps > 1:
        lines.append(f"gradient accumulation {winner.gradient_accumulation_steps} reaches the global batch")
    # Reserved = what PyTorch allocated + the allocator's cached free blocks + memory outside it (CUDA
    # context, NCCL buffers): three parts, rounded so that they add up to the peak shown.
    outside = mem.peak_reserved - mem.peak_allocated - mem.fragmentation
    allocated, cached, context = tenths([mem.peak_allocated, mem.fragmentation, outside], mem.peak_reserved)
    lines.append(
        f"peak {gib(mem.peak_reserved)} of {limit(budget)} budget in the {mem.peak_phase} phase "
        f"(allocated {allocated:.1f} + fragmentation {cached:.1f} + CUDA context and NCCL {context:.1f} GiB)"
    )
    return lines


def _best_of(other: Scored, chosen: Setting) -> str:
    """The best candidate of another AC mode: its micro-batch, and its precision where it is not the
    pick's (a mode the pick's recipe runs as another is not scored under it: _scored_once)."""
    o = other.setting
    mbs = f"mbs {o.micro_batch_size}"
    if (o.precision, o.recipe) == (chosen.precision, chosen.recipe):
        return mbs
    recipe = "" if o.recipe.value == "none" else f"/{o.recipe.value}"
    return f"{o.precision.value}{recipe}, {mbs}"


def _scored_once(result: SearchResult, pins: Pins, trainer: TrainerCapabilities) -> list[str]:
    """Under AC auto: each mode a searched recipe runs as another offered mode, scored once as that one
    (candidates.distinct_checkpointing): the plan says why that family has no candidates."""
    if pins.activation_checkpointing is not None:
        return []
    offered = list(trainer.activation_checkpointing)
    lines = []
    for recipe in dict.fromkeys(f.family.recipe for f in result.families):
        kept = distinct_checkpointing(offered, recipe, trainer)
        for mode in (m for m in offered if m not in kept):
            runs_as = trainer.modelled_checkpointing(mode, recipe).value
            lines.append(
                f"activation checkpointing: under {recipe.value}, {mode.value} AC runs as AC {runs_as} on "
                f"this trainer (same memory and speed measured), so it is scored once, as {runs_as}"
            )
    return lines


def _modelled_as(st: Setting, trainer: TrainerCapabilities) -> list[str]:
    """A chosen mode (pinned) that the trainer runs as another: the plan keeps it, modelled as that one."""
    mode = st.activation_checkpointing
    runs_as = trainer.modelled_checkpointing(mode, st.recipe)
    if runs_as is mode:
        return []
    return [
        f"activation checkpointing {mode.value}: under {st.recipe.value} this trainer's {mode.value} AC "
        f"measured as AC {runs_as.value}, so its memory and time are modelled as AC {runs_as.value}"
    ]


def _other(
    best: dict[str, Scored], chosen: str, winner: Scored, budget: float, tried: set[str] | None = None
) -> str:
    others = [f"{k} {loss_reason(winner, s, budget)}" for k, s in best.items() if k != chosen]
    others += [f"{k} does not fit" for k in sorted((tried or set()) - set(best) - {chosen})]
    return f"; {', '.join(others)}" if others else ""


def _best_by(result: SearchResult) -> dict[str, dict[str, Scored]]:
    """The best feasible candidate for each value of each knob."""
    out: dict[str, dict[str, Scored]] = {"precision": {}, "ac": {}, "sharding": {}, "cp": {}}
    for s in result.ranked:  # ranked best first: the first seen per value is its best
        st = s.setting
        for knob, value in (
            ("precision", st.precision.value),
            ("ac", st.activation_checkpointing.value),
            ("sharding", st.sharding.value),
            ("cp", str(st.context_parallel)),
        ):
            out[knob].setdefault(value, s)
    return out

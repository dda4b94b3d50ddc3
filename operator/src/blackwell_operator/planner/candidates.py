"""Enumerate the candidate families the search scores: precision x recipe x AC x sharding x context parallel.

Only what the GPU supports and the calibrated trainer can run is offered; pinned spec values narrow the set
or are rejected with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_operator.calibration import Calibration, TrainerCapabilities
from blackwell_operator.calibration.measured import load_measured
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import AUTO, TuningSpec
from blackwell_operator.planner.layout import Hardware, Setting
from blackwell_operator.planner.provenance import auto_may_choose
from blackwell_trainer.plan.config import ActivationCheckpointing, Precision, PrecisionRecipe, Sharding

# Context-parallel ranks keep at least this many tokens of a sequence (ring-attention chunks below this are
# launch-bound); pinned and automatic degrees obey the same limit, so the search space is the same.
MIN_TOKENS_PER_CP_RANK = 1024
CP_DEGREES = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Pins:
    """Spec values the user fixed (None = auto)."""

    precision: Precision | None = None
    activation_checkpointing: ActivationCheckpointing | None = None
    micro_batch_size: int | None = None
    sharding: Sharding | None = None
    context_parallel: int | None = None
    allow_unverified_recipes: bool = False

    @classmethod
    def of(cls, tuning: TuningSpec) -> Pins:
        """Read the pins of a spec's tuning section."""
        return cls(
            precision=None if tuning.precision == AUTO else Precision(tuning.precision),
            activation_checkpointing=None
            if tuning.activation_checkpointing == AUTO
            else ActivationCheckpointing(tuning.activation_checkpointing),
            micro_batch_size=None if tuning.micro_batch_size == AUTO else int(tuning.micro_batch_size),
            sharding=None if tuning.sharding == AUTO else Sharding(tuning.sharding),
            context_parallel=None if tuning.context_parallel == AUTO else int(tuning.context_parallel),
            allow_unverified_recipes=tuning.allow_unverified_recipes,
        )


def _precisions(pins: Pins, hw: Hardware, cal: Calibration) -> list[Precision]:
    gpu = hw.gpu
    if pins.precision is None:
        return [p for p in Precision if p in gpu.precisions and p in cal.trainer.precisions]
    p = pins.precision
    if p not in gpu.precisions:
        need = (
            "compute capability 10.x (Blackwell)" if p in (Precision.MXFP8, Precision.NVFP4) else "an FP8 GPU"
        )
        usable = " or ".join(q.value for q in reversed(list(gpu.precisions)))
        raise PlanningError(
            "spec.tuning.precision",
            f"{p.value} needs {need}; {hw.instance.instance_type} has {gpu.name} ({gpu.compute_capability})",
            f"use {usable}",
        )
    if p not in cal.trainer.precisions:
        offered = ", ".join(q.value for q in cal.trainer.precisions)
        raise PlanningError(
            "spec.tuning.precision",
            f"the trainer of calibration {cal.name!r} cannot train in {p.value}",
            f"use one of {offered}",
        )
    return [p]


def _checkpointing(pins: Pins, cal: Calibration) -> list[ActivationCheckpointing]:
    if pins.activation_checkpointing is None:
        return list(cal.trainer.activation_checkpointing)
    if pins.activation_checkpointing not in cal.trainer.activation_checkpointing:
        offered = ", ".join(a.value for a in cal.trainer.activation_checkpointing)
        mode = pins.activation_checkpointing.value
        raise PlanningError(
            "spec.tuning.activationCheckpointing",
            f"the trainer of calibration {cal.name!r} has no {mode} checkpointing",
            f"use auto or one of {offered}",
        )
    return [pins.activation_checkpointing]


def distinct_checkpointing(
    modes: list[ActivationCheckpointing], recipe: PrecisionRecipe, trainer: TrainerCapabilities
) -> list[ActivationCheckpointing]:
    """The modes of `modes` that run differently under `recipe` on this trainer, each once.

    A mode the trainer runs as another offered mode (selective as none under
    trainer.selective_recomputes_nothing) is the same run: scoring it too would rank one run twice and give
    the probe two identical candidates to compare. A pinned mode is alone in `modes`, so it stays.
    """
    return [
        m
        for m in modes
        if (runs_as := trainer.modelled_checkpointing(m, recipe)) is m or runs_as not in modes
    ]


def _sharding(pins: Pins, hw: Hardware, cal: Calibration) -> list[Sharding]:
    if pins.sharding is not None:
        return [pins.sharding]
    if hw.world == 1:
        # One GPU: every layout is the same; score it once.
        return [cal.trainer.sharding[0]]
    # Hybrid on one node is the same layout as full sharding: do not score it twice.
    return [s for s in cal.trainer.sharding if not (s is Sharding.HYBRID and hw.nodes == 1)]


def context_parallel_degrees(
    pins: Pins, hw: Hardware, cal: Calibration, sequence_length: int, auto_cp: bool | None = None
) -> list[int]:
    """Context-parallel degrees worth scoring for this sequence length.

    `auto_cp` overrides whether auto scores CP degrees above 1 (default: the calibration's choice); the
    planner sets it when nothing without CP fits and the trainer can split sequences.
    """
    if pins.context_parallel is not None:
        cp = pins.context_parallel
        if cp > 1 and not cal.trainer.context_parallel:
            raise PlanningError(
                "spec.tuning.contextParallel",
                f"the trainer of calibration {cal.name!r} has no context parallelism",
                "use auto or 1",
            )
        if hw.world % cp or sequence_length % (2 * cp):
            raise PlanningError(
                "spec.tuning.contextParallel",
                f"{cp} must divide the {hw.world} GPUs and half the sequence length {sequence_length}",
                "use auto or a power of two that divides both",
            )
        if cp > 1 and sequence_length // cp < MIN_TOKENS_PER_CP_RANK:
            raise PlanningError(
                "spec.tuning.contextParallel",
                f"{cp} leaves {sequence_length // cp} tokens per rank, fewer than {MIN_TOKENS_PER_CP_RANK}",
                f"use auto or at most {max(1, sequence_length // MIN_TOKENS_PER_CP_RANK)}",
            )
        return [cp]
    degrees = [1]
    offers = cal.trainer.offers_auto_context_parallel
    if auto_cp is not None:
        offers = auto_cp and cal.trainer.context_parallel
    if offers:
        degrees += [
            c
            for c in CP_DEGREES
            if c <= hw.world
            and hw.world % c == 0
            and sequence_length % (2 * c) == 0
            and sequence_length // c >= MIN_TOKENS_PER_CP_RANK
        ]
    return degrees


def families(
    pins: Pins,
    hw: Hardware,
    cal: Calibration,
    sequence_length: int,
    compile_blocks: bool = True,
    auto_cp: bool | None = None,
) -> list[Setting]:
    """Every candidate family (micro-batch size 1 as a placeholder).

    Under precision auto only recipes whose trainer path ran on a GPU here are offered (any recipe with
    spec.tuning.allowUnverifiedRecipes), never NVFP4; a pinned precision offers all of its recipes. Under
    AC auto a mode the trainer runs as another one under a recipe is offered once, as that one
    (distinct_checkpointing); a pinned mode is always offered.
    """
    coverage = load_measured(cal.name)

    def eager_or(recipe: PrecisionRecipe) -> bool:
        # The plan says what runs: recipes the trainer keeps eager (TE) are planned uncompiled.
        return cal.trainer.compiles(recipe, compile_blocks)

    out: list[Setting] = []
    for precision in _precisions(pins, hw, cal):
        recipes = [r for r in cal.trainer.precisions[precision] if r in hw.gpu.precisions[precision]]
        if pins.precision is None:
            recipes = [
                r for r in recipes if auto_may_choose(coverage, precision, r, pins.allow_unverified_recipes)
            ]
        for recipe in recipes:
            for ac in distinct_checkpointing(_checkpointing(pins, cal), recipe, cal.trainer):
                for sharding in _sharding(pins, hw, cal):
                    for cp in context_parallel_degrees(pins, hw, cal, sequence_length, auto_cp):
                        out.append(Setting(precision, recipe, ac, 1, sharding, cp, eager_or(recipe)))
    return out

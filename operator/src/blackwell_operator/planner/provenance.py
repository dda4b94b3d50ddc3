"""Per choice of a plan, whether this project measured it or models it, and which recipes auto may choose.

Both read the shipped measured coverage (generated from the calibration records and GPU checks) and the
calibration's own provenance (constants marked `[derived]`), not a hand-kept list.
"""

from __future__ import annotations

from collections.abc import Sequence

from blackwell_operator.calibration import Calibration
from blackwell_operator.calibration.measured import MeasuredCombination, MeasuredCoverage
from blackwell_operator.planner.figures import parameters_text
from blackwell_operator.planner.layout import Hardware, Setting
from blackwell_trainer.plan.config import Basis, ChoiceProvenance, Precision, PrecisionRecipe

# Never chosen by precision auto, whatever else is allowed: NVFP4 training needs recipe-level care (BF16
# first and last blocks, random Hadamard transforms, stochastic rounding of gradients) that a plan cannot
# check, so a job gets it only by pinning spec.tuning.precision: nvfp4 (docs/planner.md, "Provenance").
AUTO_NEVER: frozenset[Precision] = frozenset({Precision.NVFP4})
DERIVED_MARK = "[derived]"
OPT_IN_FIELD = "spec.tuning.allowUnverifiedRecipes"


def recipe_ran(coverage: MeasuredCoverage, recipe: PrecisionRecipe) -> list[MeasuredCombination]:
    """The combinations of a recipe that ran on any GPU here (its trainer path is verified if any)."""
    return [c for c in coverage.combinations if c.recipe is recipe]


def auto_may_choose(
    coverage: MeasuredCoverage, precision: Precision, recipe: PrecisionRecipe, allow_unverified: bool
) -> bool:
    """Whether precision auto may offer a recipe: its trainer path ran on a GPU here, or the user opted in.

    BF16 (no recipe) is always offered: it is the trainer's own path, and a trainer with no record here
    (a calibration of another trainer) still plans, its plan saying that nothing of it was verified.
    """
    if precision in AUTO_NEVER:
        return False
    return recipe is PrecisionRecipe.NONE or allow_unverified or bool(recipe_ran(coverage, recipe))


def left_out_of_auto(
    coverage: MeasuredCoverage, cal: Calibration, hw: Hardware, allow_unverified: bool
) -> str | None:
    """The explanation's line naming the recipes this GPU and trainer have that precision auto left out."""
    out = [
        f"{precision.value}/{recipe.value}"
        for precision, recipes in cal.trainer.precisions.items()
        if precision in hw.gpu.precisions
        for recipe in recipes
        if recipe in hw.gpu.precisions[precision]
        and not auto_may_choose(coverage, precision, recipe, allow_unverified)
    ]
    if not out:
        return None
    return (
        f"precision auto left out {', '.join(out)}: auto never chooses NVFP4 (set spec.tuning.precision: "
        f"nvfp4 to use it), nor a recipe whose trainer path never ran on a GPU here unless {OPT_IN_FIELD} "
        "is true"
    )


def _runs(found: Sequence[MeasuredCombination]) -> str:
    total = sum(c.runs for c in found)
    gpus = sorted({c.gpu for c in found})
    sources = sorted({s for c in found for s in c.sources})
    return f"{total} run{'s' if total != 1 else ''} on {'/'.join(gpus)} ({', '.join(sources)})"


def _derived(cal: Calibration, prefix: str) -> list[str]:
    """Constants under `prefix` whose source the calibration marks derived."""
    return sorted(k for k, v in cal.sources.items() if k.startswith(prefix) and DERIVED_MARK in v)


def _gpu(cov: MeasuredCoverage, cal: Calibration, hw: Hardware) -> ChoiceProvenance:
    gpu = hw.gpu
    found = [c for c in cov.combinations if c.gpu == gpu.name]
    if found:
        return ChoiceProvenance(choice="gpu", value=gpu.name, basis=Basis.MEASURED, detail=_runs(found))
    major = gpu.compute_capability.split(".")[0]
    derived = _derived(cal, f"throughput.recipes.{major}.")
    detail = f"nothing of trainer {cal.name} ran on a {gpu.name} here; its constants are modelled"
    if derived:
        detail += (
            f" ({len(derived)} recipe constants of compute capability {major}.x marked derived in "
            f"calibration {cal.name}: spec ratios and published anchors)"
        )
    elif cov.combinations:
        detail += f" (compute capability {major}.x constants fitted on {_runs(cov.combinations)})"
    return ChoiceProvenance(choice="gpu", value=gpu.name, basis=Basis.MODELLED, detail=detail)


def _precision(
    cov: MeasuredCoverage, cal: Calibration, hw: Hardware, s: Setting, pinned: bool
) -> ChoiceProvenance:
    value = s.precision.value if s.recipe is PrecisionRecipe.NONE else f"{s.precision.value}/{s.recipe.value}"
    anywhere = recipe_ran(cov, s.recipe)
    here = [c for c in anywhere if c.gpu == hw.gpu.name]
    if here:
        return ChoiceProvenance(choice="precision", value=value, basis=Basis.MEASURED, detail=_runs(here))
    major = hw.gpu.compute_capability.split(".")[0]
    derived = _derived(cal, f"throughput.recipes.{major}.{s.recipe.value}.")
    marked = f"; {', '.join(derived)} marked derived" if derived else ""
    if anywhere:
        detail = (
            f"its trainer path ran ({_runs(anywhere)}); speed and memory on {hw.gpu.name} modelled{marked}"
        )
        return ChoiceProvenance(choice="precision", value=value, basis=Basis.MODELLED, detail=detail)
    if pinned:
        why = "pinned in spec.tuning.precision"
    elif s.recipe is PrecisionRecipe.NONE:
        why = f"no run of trainer {cal.name} is recorded here"
    else:
        why = f"offered to auto because {OPT_IN_FIELD} is true"
    detail = f"its trainer path never ran on a GPU here: every constant modelled{marked}; {why}"
    return ChoiceProvenance(choice="precision", value=value, basis=Basis.UNVERIFIED, detail=detail)


def _checkpointing(cov: MeasuredCoverage, hw: Hardware, s: Setting) -> ChoiceProvenance:
    value = s.activation_checkpointing.value
    with_recipe = [
        c
        for c in cov.combinations
        if c.recipe is s.recipe and c.activation_checkpointing is s.activation_checkpointing
    ]
    here = [c for c in with_recipe if c.gpu == hw.gpu.name]
    if here:
        return ChoiceProvenance(
            choice="activationCheckpointing", value=value, basis=Basis.MEASURED, detail=_runs(here)
        )
    elsewhere = with_recipe or [
        c for c in cov.combinations if c.activation_checkpointing is s.activation_checkpointing
    ]
    detail = (
        f"modelled on {hw.gpu.name}; this mode ran: {_runs(elsewhere)}"
        if elsewhere
        else f"modelled: {value} checkpointing never ran here"
    )
    return ChoiceProvenance(
        choice="activationCheckpointing", value=value, basis=Basis.MODELLED, detail=detail
    )


def _communication(cov: MeasuredCoverage, hw: Hardware, s: Setting) -> ChoiceProvenance:
    if hw.world == 1:
        value = "one GPU, no collectives"
    else:
        where = f"{hw.nodes} nodes" if hw.nodes > 1 else "one node"
        value = f"{s.sharding.value} sharding over {hw.world} GPUs on {where}"
    here = [
        c
        for c in cov.combinations
        if c.gpu == hw.gpu.name
        and c.nodes == hw.nodes
        and c.gpus_per_node == hw.gpus_per_node
        and (hw.world == 1 or c.sharding is s.sharding)
    ]
    if here:
        return ChoiceProvenance(choice="communication", value=value, basis=Basis.MEASURED, detail=_runs(here))
    layouts = sorted({(c.nodes, c.gpus_per_node) for c in cov.combinations if c.gpu == hw.gpu.name})
    ran = ", ".join(f"{n} x {g}" for n, g in layouts) or "none"
    detail = (
        f"modelled (NCCL bus efficiency and overlap estimated); nodes x GPUs measured on {hw.gpu.name}: {ran}"
    )
    if hw.nodes > 1:
        detail = "no multi-node run here: inter-node (EFA) collectives " + detail
    return ChoiceProvenance(choice="communication", value=value, basis=Basis.MODELLED, detail=detail)


def _context_parallel(
    cov: MeasuredCoverage, cal: Calibration, hw: Hardware, s: Setting, fallback: bool
) -> ChoiceProvenance:
    cp = s.context_parallel
    value = "1 (sequences not split)" if cp == 1 else f"{cp} GPUs per sequence"
    here = [c for c in cov.combinations if c.gpu == hw.gpu.name and c.context_parallel == cp]
    if here:
        return ChoiceProvenance(
            choice="contextParallel", value=value, basis=Basis.MEASURED, detail=_runs(here)
        )
    if cp == 1:
        return ChoiceProvenance(
            choice="contextParallel",
            value=value,
            basis=Basis.MODELLED,
            detail=f"nothing of this trainer ran on a {hw.gpu.name} here",
        )
    checks = [p for p in cov.path_checks if p.feature == "context_parallel"]
    derived = _derived(cal, "throughput.cp_attention_overhead")
    marked = f"; {', '.join(derived)} marked derived" if derived else ""
    chose = "; auto chose it: no plan without context parallelism fits these nodes" if fallback else ""
    if checks:
        ran = "; ".join(f"CP {p.degree} on {p.gpus} {p.gpu}: {p.result} ({p.source})" for p in checks)
        detail = f"its trainer path ran for numerics only ({ran}); its speed is modelled{marked}{chose}"
        return ChoiceProvenance(choice="contextParallel", value=value, basis=Basis.MODELLED, detail=detail)
    detail = f"its trainer path never ran on a GPU here: modelled{marked}{chose}"
    return ChoiceProvenance(choice="contextParallel", value=value, basis=Basis.UNVERIFIED, detail=detail)


def plan_provenance(
    cov: MeasuredCoverage,
    cal: Calibration,
    hw: Hardware,
    setting: Setting,
    *,
    precision_pinned: bool,
    cp_fallback: bool = False,
    document_mask: bool = False,
    parameters: int | None = None,
) -> list[ChoiceProvenance]:
    """What each choice of a plan rests on, in the order GPU, precision, AC, communication, CP (and the
    document mask of packed chat rows, and the model where its size lies outside what ran here)."""
    items = [
        _gpu(cov, cal, hw),
        _precision(cov, cal, hw, setting, precision_pinned),
        _checkpointing(cov, hw, setting),
        _communication(cov, hw, setting),
        _context_parallel(cov, cal, hw, setting, cp_fallback),
    ]
    if document_mask:
        items.append(_document_mask(cal, hw))
    if parameters is not None:
        items.extend(_model_size(cov, hw, parameters))
    return items


def _model_size(cov: MeasuredCoverage, hw: Hardware, parameters: int) -> list[ChoiceProvenance]:
    """The model, where no model of its size ran on this GPU here: its speed and memory are extrapolated
    from larger or smaller ones (a 0.1M-parameter test model's plan is not measured, issue 39)."""
    span = cov.parameter_range.get(hw.gpu.name)
    if span is None or span[0] <= parameters <= span[1]:
        return []  # within what ran (nothing is added), or the GPU item already says modelled
    detail = (
        f"the models that ran on a {hw.gpu.name} here have {parameters_text(span[0])} to "
        f"{parameters_text(span[1])} parameters; this one's speed and memory are extrapolated"
    )
    value = f"{parameters_text(parameters)} parameters"
    return [ChoiceProvenance(choice="model", value=value, basis=Basis.MODELLED, detail=detail)]


# GPUs on which the trainer's document-masked training ran here, with its speed recorded: one H200,
# 2026-12-01, docs/benchmarks/sft_h200.md (8B, AC full, mbs 2, sequence 4096: 8,030-8,902 tokens/s for
# conversations of 4,096-512 tokens, against the chat plan's 8,063).
DOCUMENT_MASK_MEASURED_ON = frozenset({"H200"})


def _document_mask(cal: Calibration, hw: Hardware) -> ChoiceProvenance:
    factor = cal.throughput.document_mask_attention_factor
    model = f"its attention is modelled as {factor:g} of dense attention over a full causal row"
    if hw.gpu.name in DOCUMENT_MASK_MEASURED_ON:
        detail = (
            f"packed chat rows attend through a FlexAttention document mask, measured on a {hw.gpu.name} "
            f"here ({model}: right for rows of one long conversation, up to 10% slow for short ones)"
        )
        return ChoiceProvenance(
            choice="documentMask", value="flex-attention", basis=Basis.MEASURED, detail=detail
        )
    detail = (
        "packed chat rows attend through a FlexAttention document mask; its kernel ran on an H200 here, "
        f"not on a {hw.gpu.name}: {model}"
    )
    return ChoiceProvenance(
        choice="documentMask", value="flex-attention", basis=Basis.MODELLED, detail=detail
    )


def verdict(items: Sequence[ChoiceProvenance]) -> tuple[bool, str, str]:
    """(verified, reason, one-line message) of a plan's provenance: the PlanVerified condition.

    An empty list (a plan made before provenance existed) is not verified: nothing says it was measured.
    """
    if not items:
        return False, "Unknown", "the plan does not say what it rests on (made by an older planner)"
    unverified = [c for c in items if c.basis is Basis.UNVERIFIED]
    modelled = [c for c in items if c.basis is Basis.MODELLED]
    if not unverified and not modelled:
        return (
            True,
            "Measured",
            "every choice was measured on this GPU here: "
            + ", ".join(f"{c.choice} {c.value}" for c in items),
        )
    parts = []
    if unverified:
        parts.append(
            "unverified (trainer path never ran on a GPU here): "
            + ", ".join(f"{c.choice} {c.value}" for c in unverified)
        )
    if modelled:
        parts.append("modelled, not measured: " + ", ".join(f"{c.choice} {c.value}" for c in modelled))
    measured = [c for c in items if c.basis is Basis.MEASURED]
    if measured:
        parts.append("measured: " + ", ".join(f"{c.choice} {c.value}" for c in measured))
    return False, "Unverified" if unverified else "Modelled", "; ".join(parts)


# The Event reason per verdict reason (the verdict itself is condition PlanVerified: lifecycle/outcome.py).
EVENT_REASONS = {
    "Measured": "PlanMeasured",
    "Modelled": "PlanModelled",
    "Unverified": "UnverifiedRecipe",
    "Unknown": "PlanProvenanceUnknown",
}


def plan_event(items: Sequence[ChoiceProvenance]) -> tuple[str, str, bool]:
    """(reason, message, warning) of the one Event a plan gets: a Warning when a part never ran on a GPU."""
    _, reason, message = verdict(items)
    warning = reason == "Unverified"
    prefix = "Plan rests on an unverified recipe" if warning else "Plan provenance"
    return EVENT_REASONS[reason], f"{prefix}: {message}", warning

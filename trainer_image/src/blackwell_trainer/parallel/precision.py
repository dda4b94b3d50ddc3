"""Matrix-multiply precision: Transformer Engine recipes, torchao float8 where TE is absent, or plain BF16.

``check_precision`` is pure (plan + compute capability) so an impossible plan is refused with one line
before anything touches the GPU. ``apply_precision`` swaps the blocks' ``nn.Linear`` layers and returns
the context manager the forward pass runs under plus a hook to call after each optimizer step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from blackwell_trainer.plan.config import Candidate, Precision, PrecisionRecipe

log = logging.getLogger(__name__)

TE_RECIPES = {
    PrecisionRecipe.DELAYED,
    PrecisionRecipe.CURRENT,
    PrecisionRecipe.BLOCK,
    PrecisionRecipe.MXFP8_BLOCK,
    PrecisionRecipe.NVFP4_BLOCK,
}
TORCHAO_RECIPES = {PrecisionRecipe.TORCHAO_TENSORWISE, PrecisionRecipe.TORCHAO_ROWWISE}
# Which recipes realise which precision.
VALID_RECIPES: dict[Precision, set[PrecisionRecipe]] = {
    Precision.BF16: {PrecisionRecipe.NONE},
    Precision.FP8: {PrecisionRecipe.DELAYED, PrecisionRecipe.CURRENT, PrecisionRecipe.BLOCK}
    | TORCHAO_RECIPES,
    Precision.MXFP8: {PrecisionRecipe.MXFP8_BLOCK},
    Precision.NVFP4: {PrecisionRecipe.NVFP4_BLOCK},
}
# Lowest compute capability each precision runs on (FP8 tensor cores: Ada 8.9; MX formats: Blackwell 10.0).
MIN_CAPABILITY: dict[Precision, tuple[int, int]] = {
    Precision.BF16: (8, 0),
    Precision.FP8: (8, 9),
    Precision.MXFP8: (10, 0),
    Precision.NVFP4: (10, 0),
}
# torchao stands in for a TE FP8 recipe when TE is absent (closest scaling granularity).
TORCHAO_FALLBACK = {
    PrecisionRecipe.DELAYED: PrecisionRecipe.TORCHAO_TENSORWISE,
    PrecisionRecipe.CURRENT: PrecisionRecipe.TORCHAO_TENSORWISE,
    PrecisionRecipe.BLOCK: PrecisionRecipe.TORCHAO_ROWWISE,
}


class PrecisionError(ValueError):
    """A plan whose precision this trainer or this GPU cannot run; the message is one actionable line."""


def te_available() -> bool:
    """Transformer Engine's PyTorch extension is importable (checked without importing it)."""
    return importlib.util.find_spec("transformer_engine") is not None


def torchao_available() -> bool:
    """torchao is importable (checked without importing it)."""
    return importlib.util.find_spec("torchao") is not None


def parse_capability(text: str) -> tuple[int, int]:
    """'9.0' -> (9, 0)."""
    major, minor = text.split(".")
    return int(major), int(minor)


def check_precision(candidate: Candidate, capability: tuple[int, int] | None, *, where: str) -> None:
    """Refuse a precision/recipe the hardware (None = no CUDA GPU) cannot run. ``where`` names the GPU."""
    precision, recipe = candidate.precision, candidate.precision_recipe
    if recipe not in VALID_RECIPES[precision]:
        allowed = ", ".join(sorted(r.value for r in VALID_RECIPES[precision]))
        raise PrecisionError(
            f"chosen.precisionRecipe '{recipe.value}' does not realise precision '{precision.value}'; "
            f"use one of: {allowed}"
        )
    if precision == Precision.BF16:
        return
    if capability is None:
        raise PrecisionError(
            f"chosen.precision '{precision.value}' needs a CUDA GPU but {where} has none; "
            "use precision bf16 on CPU"
        )
    need = MIN_CAPABILITY[precision]
    if capability < need:
        raise PrecisionError(
            f"chosen.precision '{precision.value}' needs compute capability {need[0]}.{need[1]} or newer, "
            f"{where} has {capability[0]}.{capability[1]}; use precision fp8 or bf16 on this GPU"
            if precision in (Precision.MXFP8, Precision.NVFP4)
            else f"chosen.precision '{precision.value}' needs compute capability {need[0]}.{need[1]}+, "
            f"{where} has {capability[0]}.{capability[1]}; use precision bf16 on this GPU"
        )
    if recipe == PrecisionRecipe.BLOCK and capability < (9, 0):
        raise PrecisionError(
            f"chosen.precisionRecipe 'block' needs compute capability 9.0 or newer, {where} has "
            f"{capability[0]}.{capability[1]}; use recipe 'current' or 'delayed'"
        )


def resolve_backend(candidate: Candidate, *, te: bool, torchao: bool) -> tuple[str, PrecisionRecipe]:
    """Pick the library that runs the plan's recipe: ('bf16'|'te'|'torchao', recipe actually used)."""
    precision, recipe = candidate.precision, candidate.precision_recipe
    if precision == Precision.BF16:
        return "bf16", PrecisionRecipe.NONE
    if recipe in TE_RECIPES:
        if te:
            return "te", recipe
        if recipe in TORCHAO_FALLBACK and torchao:
            return "torchao", TORCHAO_FALLBACK[recipe]
        raise PrecisionError(
            f"chosen.precisionRecipe '{recipe.value}' needs Transformer Engine, which is not installed "
            "here; run the NVIDIA PyTorch container or choose recipe torchao-tensorwise / torchao-rowwise"
            if recipe not in TORCHAO_FALLBACK
            else f"chosen.precisionRecipe '{recipe.value}' needs Transformer Engine or torchao, neither is "
            "installed; install one or choose precision bf16"
        )
    if torchao:
        return "torchao", recipe
    raise PrecisionError(
        f"chosen.precisionRecipe '{recipe.value}' needs torchao, which is not installed; "
        "install torchao or choose a Transformer Engine recipe (current, delayed, block)"
    )


@dataclass
class PrecisionSetup:
    """What the training loop needs from the precision layer."""

    backend: str
    recipe: PrecisionRecipe
    # Forward pass runs under this (TE's fp8 autocast); a null context otherwise.
    forward_context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    # Called after each optimizer step (e.g. torchao's FP8 all-gather scale precompute); no-op otherwise.
    after_optimizer_step: Callable[[nn.Module], None] = field(default=lambda _m: None)
    # TE modules do not trace well under torch.compile; parallelize skips compile when False.
    compile_ok: bool = True
    # FSDP2 all-gathers the float8 Linears' weights as float8 (tuning.Tuning.fp8_all_gather).
    fp8_all_gather: bool = False


def _fp8_ready(linear: nn.Linear) -> bool:
    # FP8 GEMMs need both dimensions divisible by 16.
    return linear.in_features % 16 == 0 and linear.out_features % 16 == 0


def _torchao_filter(recipe_name: str) -> Callable[[nn.Module, str], bool]:
    """torchao's filter for its float8 recipe: whether a Linear's shape gains from float8 (an experimental
    torchao API, hence the leading underscore; pinned with torchao in uv.lock)."""
    from torchao.float8 import _auto_filter_for_recipe

    keep: Callable[[nn.Module, str], bool] = _auto_filter_for_recipe(recipe_name, filter_fqns=[])
    return keep


def _swap_linears_for_te(block: nn.Module) -> int:
    import transformer_engine.pytorch as te

    swapped = 0
    for parent in list(block.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and _fp8_ready(child):  # te.Linear is no nn.Linear
                replacement = te.Linear(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    params_dtype=child.weight.dtype,
                    device=child.weight.device,
                )
                setattr(parent, name, replacement)
                swapped += 1
    return swapped


def _te_recipe(recipe: PrecisionRecipe) -> Any:
    from transformer_engine.common import recipe as te_recipe

    if recipe == PrecisionRecipe.DELAYED:
        return te_recipe.DelayedScaling(amax_history_len=16, amax_compute_algo="max")
    if recipe == PrecisionRecipe.CURRENT:
        return te_recipe.Float8CurrentScaling()
    if recipe == PrecisionRecipe.BLOCK:
        return te_recipe.Float8BlockScaling()
    if recipe == PrecisionRecipe.MXFP8_BLOCK:
        return te_recipe.MXFP8BlockScaling()
    return te_recipe.NVFP4BlockScaling()


def apply_precision(
    model: nn.Module,
    candidate: Candidate,
    *,
    blocks: nn.ModuleDict,
    te: bool | None = None,
    torchao: bool | None = None,
    amax_group: Any = None,
    pow2_scales: bool = False,
    fp8_all_gather: bool = False,
    skip_small: bool = False,
) -> PrecisionSetup:
    """Convert the blocks' Linear layers for the plan's precision (embedding and output head stay BF16).

    ``pow2_scales``: torchao's scales rounded down to a power of two (tuning.Tuning.fp8_pow2_scales).
    ``fp8_all_gather``: torchao tensorwise weights that FSDP2 all-gathers as float8, their scales
    computed after each optimizer step (tuning.Tuning.fp8_all_gather, which refuses it for the other
    recipes; PrecisionError here if one gets this far).
    ``skip_small``: torchao float8 only where torchao's filter for the recipe expects a gain
    (tuning.Tuning.fp8_skip_small); the other Linears stay BF16.
    """
    backend, recipe = resolve_backend(
        candidate,
        te=te_available() if te is None else te,
        torchao=torchao_available() if torchao is None else torchao,
    )
    if fp8_all_gather and recipe != PrecisionRecipe.TORCHAO_TENSORWISE:
        raise PrecisionError(
            f"FSDP2's float8 all-gather needs recipe torchao-tensorwise, this plan runs {recipe.value}; "
            "set BTJ_TRAINER_TUNING fp8_all_gather=auto or off"
        )
    if backend == "bf16":
        return PrecisionSetup(backend="bf16", recipe=recipe)
    if backend == "te":
        import transformer_engine.pytorch as te_torch

        swapped = sum(_swap_linears_for_te(block) for block in blocks.values())
        te_rec = _te_recipe(recipe)
        # TE >= 2.8 names it `autocast(recipe=)`; older releases `fp8_autocast(fp8_recipe=)`.
        if hasattr(te_torch, "autocast"):

            def ctx() -> contextlib.AbstractContextManager[Any]:
                return te_torch.autocast(enabled=True, recipe=te_rec, amax_reduction_group=amax_group)  # type: ignore[no-any-return]
        else:

            def ctx() -> contextlib.AbstractContextManager[Any]:
                return te_torch.fp8_autocast(enabled=True, fp8_recipe=te_rec, fp8_group=amax_group)  # type: ignore[no-any-return]

        log.info("precision: Transformer Engine %s on %d Linear layers", recipe.value, swapped)
        return PrecisionSetup(backend="te", recipe=recipe, forward_context=ctx, compile_ok=False)

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    name = "tensorwise" if recipe == PrecisionRecipe.TORCHAO_TENSORWISE else "rowwise"
    config = Float8LinearConfig.from_recipe_name(name)
    if pow2_scales:
        config = dataclasses.replace(config, round_scales_to_power_of_2=True)
    if fp8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)

    gains = _torchao_filter(name) if skip_small else None

    def only_fp8_ready(module: nn.Module, fqn: str) -> bool:
        ready = isinstance(module, nn.Linear) and _fp8_ready(module)
        return ready and (gains is None or gains(module, fqn))

    for key, block in list(blocks.items()):
        blocks[key] = convert_to_float8_training(block, config=config, module_filter_fn=only_fp8_ready)
    log.info(
        "precision: torchao float8 %s on the transformer blocks%s, FSDP2 float8 all-gather %s",
        name,
        " (the Linears torchao's filter expects a gain on; the others BF16)" if skip_small else "",
        "on" if fp8_all_gather else "off",
    )
    if not fp8_all_gather:
        return PrecisionSetup(backend="torchao", recipe=recipe)
    return PrecisionSetup(
        backend="torchao", recipe=recipe, after_optimizer_step=_precompute_scales, fp8_all_gather=True
    )


def _precompute_scales(model: nn.Module) -> None:
    """Each float8 weight's scale from the updated shards, all in one all-reduce of their amaxes (what
    the float8 all-gather casts with; without it each weight would all-reduce its own amax)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def device_capability() -> tuple[int, int] | None:
    """Compute capability of the current CUDA device, None without one."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return int(major), int(minor)

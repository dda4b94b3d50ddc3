"""Trainer switches that trade speed or memory, not the plan: each one measurable on its own (A/B).

The defaults are what the trainer runs. ``BTJ_TRAINER_TUNING`` (``key=value,key=value``) overrides them for
a measurement (benchmarks/trainer_ab_h200.py); a bad key or value is refused naming the key and the choices.
Switches that change numerics say so in their comment; the default never does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

TUNING_ENV = "BTJ_TRAINER_TUNING"
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")
# SDPA kernel order for causal attention: "default" leaves the choice to torch (flash attention first on
# Hopper in torch 2.11), "cudnn" puts cuDNN's fused attention first and flash second (torchtitan's order),
# "flash" pins flash attention. The same function; the kernels round differently in the last bits.
ATTENTION_BACKENDS = ("default", "cudnn", "flash")
# FSDP2 all-gathers float8 weights (torchao tensorwise only): "auto" where more than one rank shards them.
FP8_ALL_GATHER = ("auto", "on", "off")
GC_EVERY_STEPS = 50  # manual_gc: a generation-1 collection every this many steps (torchtitan's default)
# The switches the trainer reads again at every step, which a run may change between steps (the in-process
# A/B windows of benchmarks/trainer_h200.py); every other switch shapes what is built and acts only then.
PER_STEP_SWITCHES = ("batched_update", "clip_in_optimizer", "compiled_update", "manual_gc", "parameter_check")


class TuningError(ValueError):
    """A ``BTJ_TRAINER_TUNING`` entry that names no switch or gives it a value it cannot take."""


@dataclass(frozen=True)
class Tuning:
    """The switches (docs/trainer.md, "Single-device path" and "Switches")."""

    # "auto": a lone process with nothing to shard (one rank, no context parallelism, not Transformer
    # Engine) trains the plain module: fp32 parameters cast to bf16 at use, no FSDP2. "fsdp": always FSDP2.
    # The same numerics either way (bf16 compute copies of fp32 weights, bf16 gradients cast to fp32).
    # "auto" is the default since it ran on one H200 (2026-12-02, benchmarks/results/trainer_ab_h200.json):
    # against FSDP2 on one rank, 2.6-7.6% more tokens/s and 13.3-18.5 GiB less reserved (3B untied, BF16
    # and FP8, batch 2 and 4), the first losses equal to 0.2% in BF16. "fsdp" stays as the opt-out.
    single_device: str = "auto"
    # torch.compile mode of the per-block compile ("default" is torch's default). Measured on one H100
    # (2026-12-07, docs/benchmarks/titan_h100.md): reduce-overhead (CUDA graphs) +0.1% in BF16 and +1.5% in
    # FP8 for 0.3-0.4 GiB of graph pool the planner does not model, so not the default.
    compile_mode: str = "default"
    # Fold gradient clipping into the fused AdamW step (its grad_scale) instead of a separate pass
    # over the gradients (both paths; FSDP2's sharded gradients too). Numerics: a gradient is divided by
    # 1/coef instead of multiplied by coef when clipping is active (a last-bit difference); equal otherwise.
    # On by default since it ran on one H100 (2026-12-06, results/titan_side_by_side_h100_before.json):
    # +1.2% tokens/s at 3B BF16 batch 2 (in-process windows against the separate clip), the losses of a
    # fixed batch equal to float tolerance (tests/trainer/test_single_device.py). Off: torch's foreach clip.
    clip_in_optimizer: bool = True
    # Scan every parameter for non-finite values after every step (one read of the weights a step). Off
    # (the default): only the steps whose state is written (interval and final checkpoints, the export,
    # a save at preemption) are scanned, so no non-finite state is ever saved; the other steps rely on
    # the gradient norm checked every step (with finite gradients and optimizer state, AdamW's update
    # is finite) and on the next step's loss. Off by default since one H100 measured +1.9% tokens/s at
    # 3B BF16 batch 2 without the per-step scan (docs/benchmarks/titan_h100.md), H200 +0.2..+0.9%.
    parameter_check: bool = False
    # torchao float8: round scales down to a power of two (changes numerics: a recipe variant).
    fp8_pow2_scales: bool = False
    # torchao float8 only on the block Linears whose shapes gain from it, by torchao's own filter for the
    # recipe (_auto_filter_for_recipe; its thresholds come from torchao's H100 tables: tensorwise keeps a
    # Linear with K <= 4096 and N <= 1024 in BF16, which on Llama-3.2 are the K and V projections).
    # torchtitan's opt-in "auto_filter_small_kn". Those layers then compute in BF16 (numerics change
    # there). Off: every block Linear whose dimensions divide by 16. Measured on one H100 (2026-12-07,
    # docs/benchmarks/titan_h100.md): 3B FP8 batch 2 -0.6% tokens/s, 1B +0.3%, 1.4-2.0 GiB more: no gain.
    fp8_skip_small: bool = False
    # Single-device path: Q/K/V and gate/up each as one matmul over concatenated weights (BF16 blocks;
    # float8 and TE Linears keep their own). The same products; the last bit may differ (GEMM blocking).
    fuse_projections: bool = False
    # Single-device path without AC: each block runs on bf16 copies made before it and cast again in
    # backward instead of kept (recast.py): 2 bytes a parameter less at the peak, one more cast per step.
    recast_blocks: bool = False
    # Single-device path, BF16 compute, no AC, one micro-batch a step: the gradients of the matrices (block
    # Linears, embedding, output head) stay in bf16, the dtype their matmul produced them in, instead of
    # being cast to fp32 by autograd; AdamW reads them in bf16 and updates in fp32 (optimizer.py). The
    # same gradient values (a cast of a bf16 value to fp32 is exact) and 2 bytes a parameter less held;
    # the update itself is computed by a compiled kernel instead of torch's fused one (last-bit
    # differences). Not with gradient accumulation (a sum of micro-batches' gradients would round in
    # bf16) nor with the separate foreach clip (it would scale the gradients in bf16): there the
    # gradients stay fp32, and the trainer logs one warning naming why (as it does under AC and fp32 compute).
    bf16_gradients: bool = False
    # Single-device path: AdamW updates the fp32 gradients with the compiled one-tensor kernel that
    # bf16_gradients uses (optimizer.adamw_one, the clip's scale inside it), not torch's fused kernel,
    # which with the clip's grad_scale also writes every unscaled gradient back (32 bytes a parameter
    # where the update needs 28) and ran at 2,246 GB/s against the compiled update's 2,727 (1.5B
    # parameters, one H100, benchmarks/results/optimizer_step_1b_h100.json). The same formula and
    # torch's state; last-bit differences (weights within 1e-6 of the fused kernel's, tested). On by
    # default since one H100 measured it in the side by side (2026-12-07, docs/benchmarks/titan_h100.md):
    # +2.0% to +2.9% tokens/s at 1B and 3B, BF16 and FP8, the same reserved memory, the first losses
    # within the run-to-run spread. FSDP2's sharded gradients keep torch's kernel. Off: torch's AdamW.
    compiled_update: bool = True
    # The compiled update (above, and bf16_gradients') as one compiled call per run of up to 28 tensors of
    # one size (optimizer.adamw_many) instead of one call per tensor: the same kernels, so the host pays one
    # call's overhead per run (11 calls a step at 3B instead of 255). Numerics unchanged (the same
    # per-tensor formula, bit-equal in the CPU tests). The host's time a step on a 2-core CPU: 14.4 ms per
    # tensor against 4.8 ms batched (benchmarks/optimizer_host.py). Not yet measured on a GPU: off.
    batched_update: bool = False
    # Single-device path, BF16 blocks (this trainer's own Linear, no bias), AC none or full: each block
    # matrix's weight gradient is written in fp32 by its GEMM (torch.mm's out_dtype; cuBLAS accumulates in
    # fp32 anyway) instead of in bf16 and then cast to fp32 by autograd (model/wide_grad.py). That removes
    # a cast kernel per matrix (2 bytes a parameter read, 4 written: 5.1 ms a step for 1.5B parameters on
    # one H100, benchmarks/results/optimizer_step_1b_h100.json) for 2 more bytes written by the GEMM. What
    # is kept for backward does not change: the bf16 copy, or the fp32 parameter cast again in backward
    # where recast_blocks would act. Numerics: the weight gradients are no longer rounded to bf16 before
    # they are widened (more precise, so not bit-equal). Not with bf16_gradients (which keeps them in
    # bf16) nor selective AC (its policy does not see the op). Measured on one H100 (2026-12-07,
    # docs/benchmarks/titan_h100.md): +0.1% to +0.9% tokens/s, within a call's spread, for a change of
    # numerics, so off.
    fp32_weight_gradients: bool = False
    # SDPA's kernel order for causal attention (ATTENTION_BACKENDS); last-bit differences only.
    attention: str = "default"
    # Python's cyclic garbage collector off while training, a generation-1 collection every
    # GC_EVERY_STEPS steps instead, so no collection pause lands between a step's kernel launches
    # (torchtitan does the same). Numerics unchanged.
    manual_gc: bool = False
    # FSDP2 all-gathers each float8 Linear's weight as float8 (cast on its shard, the scale from one
    # all-reduce of the shards' amax after each optimizer step) instead of as bf16: half the all-gather
    # bytes and no bf16 copy of the gathered weight (torchtitan's enable_fsdp_float8_all_gather and
    # precompute_float8_dynamic_scale_for_fsdp). torchao tensorwise only. "auto": on where more than one
    # rank shards the weights (torchtitan turns it on only then too), off on one; "on" also on one rank.
    # The cast starts from the fp32 shard, not from the gathered bf16 copy (a last-bit difference in a
    # scale or a float8 value at most). Checked on one gloo rank on the CPU (fp32: the same losses,
    # tests/trainer/test_fp8_all_gather.py) and on one H100 rank (2026-12-06: the first loss within 5e-4,
    # 2-4% slower with nothing to send, docs/trainer.md); more ranks not yet run here.
    fp8_all_gather: str = "auto"

    def use_single_device(self, *, world_size: int, context_parallel: int, backend: str) -> bool:
        """Whether this process trains without FSDP2 (see ``single_device``)."""
        if self.single_device == "fsdp":
            return False
        return world_size == 1 and context_parallel == 1 and backend != "te"

    def bf16_gradients_blocked(self, *, single_device: bool, accumulation: int, clip: float) -> str | None:
        """Why ``bf16_gradients`` cannot act for this plan and process, or None; the model's own limits
        (BF16 compute, no AC) are parallelize.py's."""
        if not single_device:
            return "FSDP2 reduces the gradients in fp32"
        if accumulation > 1:
            return f"the {accumulation} micro-batches of a step would be summed in bf16"
        if clip > 0 and not self.clip_in_optimizer:
            return "clip_in_optimizer=false: the foreach clip would scale them in bf16"
        return None

    def gathers_fp8(self, *, shard_ranks: int, tensorwise: bool) -> bool:
        """Whether FSDP2 all-gathers float8 weights (see ``fp8_all_gather``); ``shard_ranks``: the ranks
        that shard each weight, ``tensorwise``: the plan runs torchao's tensorwise recipe.

        TuningError for "on" with another recipe: the other recipes scale per row or inside Transformer
        Engine, where a weight cast before the gather has no one scale to share.
        """
        if self.fp8_all_gather == "on" and not tensorwise:
            raise TuningError(
                f"{TUNING_ENV}: fp8_all_gather=on needs torchao's tensorwise FP8 recipe "
                "(chosen.precisionRecipe torchao-tensorwise); this plan runs another precision or recipe. "
                "Fix: fp8_all_gather=auto or off, or a plan with precision fp8 and recipe torchao-tensorwise"
            )
        if self.fp8_all_gather == "auto":
            return tensorwise and shard_ranks > 1
        return self.fp8_all_gather == "on"

    @classmethod
    def parse(cls, text: str) -> Tuning:
        """``key=value,...`` (keys as the field names, ``-`` or ``_``) over the defaults."""
        tuning = cls()
        known = {f.name: f for f in fields(cls)}
        for item, name, sep, value in _items(text):
            if not sep or name not in known:
                raise TuningError(
                    f"{TUNING_ENV}: '{item}' is not key=value with a key among {', '.join(sorted(known))}"
                )
            changes: dict[str, Any] = {name: _value(name, value.strip(), known[name].type)}
            tuning = replace(tuning, **changes)
        return tuning

    @classmethod
    def built_once(cls, text: str) -> list[str]:
        """The switches ``text`` names that act only when the trainer is built (not PER_STEP_SWITCHES):
        setting them on a running trainer would change nothing. ``text`` is checked as ``parse`` does."""
        cls.parse(text)
        return sorted({name for _, name, _, _ in _items(text) if name not in PER_STEP_SWITCHES})

    @classmethod
    def from_env(cls) -> Tuning:
        return cls.parse(os.environ.get(TUNING_ENV, ""))


def _items(text: str) -> list[tuple[str, str, str, str]]:
    """Each entry of ``key=value,...``: (the entry, its key as a field name, "=" or "" where it has none,
    its value), keys written with ``-`` or ``_``."""
    entries = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        entries.append((item, key.strip().replace("-", "_"), sep, value))
    return entries


def _value(name: str, value: str, kind: object) -> str | bool:
    if kind in (bool, "bool"):
        if value.lower() in ("1", "true", "on", "yes"):
            return True
        if value.lower() in ("0", "false", "off", "no"):
            return False
        raise TuningError(f"{TUNING_ENV}: {name} takes true or false, not '{value}'")
    choices = {
        "single_device": ("auto", "fsdp"),
        "compile_mode": COMPILE_MODES,
        "attention": ATTENTION_BACKENDS,
        "fp8_all_gather": FP8_ALL_GATHER,
    }[name]
    if value not in choices:
        raise TuningError(f"{TUNING_ENV}: {name} takes one of {', '.join(choices)}, not '{value}'")
    return value

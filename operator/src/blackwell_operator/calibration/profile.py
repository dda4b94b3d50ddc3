"""Typed calibration profile: what a trainer can do and the constants of the memory and throughput models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from blackwell_trainer.plan.config import ActivationCheckpointing, Precision, PrecisionRecipe, Sharding


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainerCapabilities(_Strict):
    """What the trainer this profile describes can run; the search offers nothing else."""

    activation_checkpointing: list[ActivationCheckpointing]
    precisions: dict[Precision, list[PrecisionRecipe]]
    sharding: list[Sharding]
    context_parallel: bool = Field(
        description="The trainer can split a sequence over GPUs (pinned CP is planned)."
    )
    auto_context_parallel: bool | None = Field(
        default=None,
        description="The automatic search offers CP too (default: same as context_parallel). False keeps CP "
        "to jobs that pin it, e.g. while its throughput is unmeasured.",
    )
    compile: bool = Field(description="Blocks are torch.compile'd (fuses elementwise work).")
    loss_chunk_tokens: int = Field(ge=0, description="Cross-entropy chunk in tokens; 0 = full fp32 logits.")
    max_micro_batch_size: int = Field(default=256, ge=1)
    eager_recipes: list[PrecisionRecipe] = Field(
        default_factory=list,
        description="Recipes whose blocks the trainer never compiles (Transformer Engine modules run eager): "
        "no compile fusion of their elementwise work, whatever the candidate asks.",
    )

    @property
    def offers_auto_context_parallel(self) -> bool:
        """Whether the automatic search scores CP degrees above 1."""
        return self.context_parallel and self.auto_context_parallel is not False

    keeps_unsharded_weights: bool = Field(
        default=False,
        description="With a shard group of one GPU and room to spare, the trainer keeps every block's bf16 "
        "weights from forward to backward (blackwell_trainer.plan.config.keeps_gathered_weights).",
    )
    single_device_path: bool = Field(
        default=False,
        description="A lone GPU (one process, no context parallelism, not a Transformer Engine recipe) "
        "trains without FSDP2 (the trainer's single-device path): no all-gather or reduce-scatter copies "
        "(throughput.single_device_cast_bytes_per_param instead), its gradients are freed into the "
        "compute stream's pool (no memory.fragmentation_gradients), and torchao float8 blocks quantise "
        "from the fp32 weights (no bf16 copy of the block linears kept).",
    )
    selective_recomputes_gemms: list[PrecisionRecipe] = Field(
        default_factory=list,
        description="Recipes whose GEMMs selective AC recomputes (not aten ops the op-level save policy can "
        "keep, e.g. TE's): memory and GEMM recompute as full AC, attention outputs still kept.",
    )

    selective_recomputes_nothing: list[PrecisionRecipe] = Field(
        default_factory=list,
        description="Recipes under which this trainer's selective AC measures as AC none: the same peak "
        "memory and speed at every size both ran (torchao float8: its saved FP8 inputs and kept GEMM outputs "
        "leave nothing worth recomputing). Memory and time are modelled as AC none, and under AC auto the "
        "search scores the family once, as none (planner.candidates.distinct_checkpointing).",
    )

    def modelled_checkpointing(
        self, mode: ActivationCheckpointing, recipe: PrecisionRecipe | None
    ) -> ActivationCheckpointing:
        """The AC mode whose memory and time a setting of this mode and recipe has in this trainer."""
        if mode is ActivationCheckpointing.SELECTIVE and recipe in self.selective_recomputes_nothing:
            return ActivationCheckpointing.NONE
        return mode

    def compiles(self, recipe: PrecisionRecipe, requested: bool = True) -> bool:
        """Whether blocks of this recipe run compiled when the candidate asks for `requested`."""
        return requested and self.compile and recipe not in self.eager_recipes


class MemoryConstants(_Strict):
    """Bytes, per parameter or per token, of each named memory component."""

    master_param_bytes: float
    gradient_bytes: float
    optimizer_bytes: float
    compute_param_bytes: float
    # Saved activations per token per layer, as bytes per unit of width (h, q, kv, F, heads).
    act_hidden: float
    act_q: float
    act_kv: float
    act_ffn: float
    act_heads: float
    selective_hidden: float
    selective_q: float
    selective_kv: float
    selective_ffn: float
    selective_heads: float
    full_hidden: float
    outside_layers_hidden: float
    loss_bytes_per_logit: float
    chunked_loss_bytes_per_logit: float
    fsdp_blocks_in_flight: float
    fsdp_grad_bytes: float
    optimizer_phase_root_bytes: float
    cuda_context_bytes: float
    nccl_bytes_per_group: float
    allocator_workspace_bytes: float
    fragmentation_base_bytes: float
    fragmentation_dynamic: float
    fragmentation_transient: float
    fragmentation_gradients: float
    fragmentation_optimizer: float
    fragmentation_comm_bytes: float = Field(
        default=0.0,
        ge=0,
        description="Reserved by the collectives' stream pools when parameters are sharded over GPUs.",
    )
    recompute_transient_factor: float = Field(
        default=1.0,
        ge=0,
        description="A checkpointed block's backward holds this many times its full activations at once.",
    )
    recompute_saving_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description=(
            "Share of the recipe's per-element activation saving that a recomputed block also gets "
            "(its low-precision linear inputs exist again during its backward)."
        ),
    )
    precision_weight_bytes: dict[PrecisionRecipe, float]
    precision_activation_saving: dict[PrecisionRecipe, float] = Field(
        default_factory=dict,
        description="Bytes saved per saved linear-input element when the recipe keeps it in low precision.",
    )


class RecipeConstants(_Strict):
    """GEMM behaviour of one precision recipe on one GPU generation."""

    efficiency: float = Field(
        gt=0, le=1, description="Fraction of the format's dense peak a large GEMM reaches."
    )
    gemm_overhead_seconds: float = Field(ge=0, description="Fixed GPU time per GEMM (launch, tails).")
    quant_bytes_per_element: float = Field(
        ge=0, description="HBM bytes moved per input/weight/output element to cast, scale and transpose."
    )
    cpu_seconds_per_linear: float = Field(ge=0, description="Host time to issue one linear's fwd+bwd.")
    forward_cast_share: float = Field(
        default=1 / 3,
        ge=0,
        le=1,
        description="Share of the cast traffic in the forward pass (what full AC's recompute pays again); "
        "a third when the three GEMMs' casts weigh alike.",
    )
    bf16_layer_fraction: float = Field(
        default=0.0, ge=0, le=1, description="Share of blocks the recipe keeps in BF16 for accuracy."
    )


class ThroughputConstants(_Strict):
    """Efficiencies and traffic of the time model."""

    recipes: dict[str, dict[PrecisionRecipe, RecipeConstants]] = Field(
        description="Keyed by compute-capability major ('9' Hopper, '10' Blackwell), then recipe."
    )
    attention_efficiency: float
    attention_short_sequence_tokens: float = Field(
        description="Sequence (or CP chunk) length at which flash attention reaches half its efficiency."
    )
    document_mask_attention_factor: float = Field(
        default=0.86,
        gt=0,
        le=1,
        description="Attention efficiency of packed rows with a document mask (FlexAttention) relative to "
        "dense causal flash attention, counting the dense causal FLOPs (dataset.kind chat).",
    )
    memory_bandwidth_efficiency: float
    elementwise_bytes_hidden: float
    elementwise_bytes_ffn: float
    elementwise_forward_fraction: float
    eager_elementwise_factor: float
    loss_traffic_bytes_per_logit: float
    selective_recompute_gemm_fraction: float
    selective_recompute_elementwise_fraction: float
    full_recompute_share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Share of a block's forward time that full AC's recompute costs again (1: all of it). "
        "Compiled, the recomputed pointwise work fuses into the backward's kernels and nothing saved is "
        "written and read back, so a fit may find less (docs/calibration/README.md).",
    )
    optimizer_bytes_per_param: float
    fsdp_copy_bytes_per_param: float
    fsdp_regather_bytes_per_param: float = Field(
        default=0.0,
        description="Extra copy traffic per parameter when backward gathers the weights again (resharded "
        "after forward): the second bf16 cast and split. Zero where the profile does not separate it.",
    )
    # A constant of the time model, not a capability: fitted like fsdp_copy_bytes_per_param (and kept out
    # of the trainer block, which benchmarks/calibration/adopt.py carries over verbatim).
    single_device_cast_bytes_per_param: float = Field(
        default=12.0,
        gt=0,
        description="Copy and cast traffic per parameter and micro-batch of the single-device path (in place "
        "of fsdp_copy_bytes_per_param). Its code's floor is 12: each fp32 weight cast to bf16 in forward "
        "(4 bytes read, 2 written) and each bf16 gradient cast to fp32 (2 read, 4 written).",
    )
    gradient_accumulation_bytes_per_param: float = Field(
        default=12.0,
        ge=0,
        description="Traffic per parameter (of this rank's shard) of adding one more micro-batch's gradients "
        "into those already held, paid by every micro-batch of a step but the first. Its floor is 12: read "
        "the held fp32 gradient and the new one, write the sum (the first micro-batch's gradient is kept "
        "as it is).",
    )
    step_overhead_seconds: float
    cpu_seconds_per_layer: float
    nccl_bus_efficiency: float
    comm_overlap: float
    comm_interference: float = Field(
        default=0.0,
        description="Share of an overlapped collective's time that still lengthens the step: NCCL kernels "
        "take SMs and HBM bandwidth from the compute they run beside.",
    )
    cp_attention_overhead: float = Field(
        description="Extra attention time of ring context parallelism (split kernels, load balance), "
        "as a fraction at large cp."
    )


class GpuProfile(_Strict):
    """Constants measured on one GPU model that replace the shared ones when a job plans for that GPU.

    The shared constants are fitted on one GPU (the H200) and assumed for the others of its generation;
    a GPU measured on its own (docs/calibration/<gpu>/) carries what its fit moved here, each with a source.
    """

    description: str
    constants: dict[str, float] = Field(description="Dotted constant (memory.*, throughput.*) -> value.")
    sources: dict[str, str] = Field(description="Provenance of every constant above, keyed the same.")


class Calibration(_Strict):
    """A named calibration: a trainer's capabilities plus the constants, each with its provenance."""

    name: str
    description: str
    status: str = Field(description="measured, derived or mixed: how far the constants are from measurement.")
    trainer: TrainerCapabilities
    memory: MemoryConstants
    throughput: ThroughputConstants
    sources: dict[str, str] = Field(description="Provenance of every constant, keyed by section.field.")
    gpus: dict[str, GpuProfile] = Field(
        default_factory=dict,
        description="Per GPU model (the catalog's name, e.g. H100): constants measured on it (for_gpu).",
    )
    _recipe_cache: dict[tuple[int, PrecisionRecipe], RecipeConstants] = PrivateAttr(default_factory=dict)
    _gpu_cache: dict[str, Calibration] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _every_constant_has_a_source(self) -> Calibration:
        missing = [
            key
            for key in self.constant_keys()
            if key not in self.sources and _section(key) not in self.sources
        ]
        if missing:
            raise ValueError(f"calibration {self.name!r}: constants without a source: {', '.join(missing)}")
        for gpu, profile in self.gpus.items():
            unsourced = sorted(set(profile.constants) - set(profile.sources))
            if unsourced:
                where = f"calibration {self.name!r}, gpus.{gpu}"
                raise ValueError(f"{where}: no source for {', '.join(unsourced)}")
            self.for_gpu(gpu)  # every key names a constant that exists
        return self

    def for_gpu(self, gpu: str) -> Calibration:
        """The calibration a job on `gpu` plans with: its measured constants (gpus.<gpu>) in place of the
        shared ones, their sources with them. Itself where that GPU has none; the result has no `gpus`, so
        calling it again is harmless and what a later correction scales is what the GPU measured."""
        profile = self.gpus.get(gpu)
        if profile is None:
            return self
        cached = self._gpu_cache.get(gpu)
        if cached is None:
            data = self.model_dump(mode="json")
            data["gpus"] = {}
            replace_constants(data, profile.constants, f"calibration {self.name!r}, gpus.{gpu}")
            data["name"] = f"{self.name}@{gpu}"
            data["sources"] = {**data["sources"], **profile.sources}
            cached = self._gpu_cache[gpu] = Calibration.model_validate(data)
        return cached

    def constant_keys(self) -> list[str]:
        """Dotted names of every constant (memory.* and throughput.*)."""
        keys: list[str] = []
        for section in ("memory", "throughput"):
            dumped: dict[str, Any] = getattr(self, section).model_dump()
            # An empty table (e.g. no recipe saves activation memory) holds no figure to source.
            keys.extend(f"{section}.{field}" for field, value in dumped.items() if value != {})
        return keys

    def recipe(self, cc_major: int, recipe: PrecisionRecipe) -> RecipeConstants:
        """Constants of a recipe on a GPU generation (the newest generation known at or below it)."""
        cached = self._recipe_cache.get((cc_major, recipe))
        if cached is not None:
            return cached
        known = sorted((int(k) for k in self.throughput.recipes), reverse=True)
        for major in known:
            table = self.throughput.recipes[str(major)]
            if major <= cc_major and recipe in table:
                self._recipe_cache[(cc_major, recipe)] = table[recipe]
                return table[recipe]
        raise KeyError(f"calibration {self.name!r} has no constants for {recipe} on CC {cc_major}.x")


def replace_constants(data: dict[str, Any], values: dict[str, float], where: str) -> None:
    """Set dotted constants (memory.act_hidden, throughput.recipes.9.none.efficiency) in a dumped
    calibration; a name that is not a constant there is an error naming it."""
    for path, value in values.items():
        node = data
        *parents, leaf = path.split(".")
        if not parents or parents[0] not in ("memory", "throughput"):
            raise ValueError(f"{where}: {path!r} is not a memory.* or throughput.* constant")
        for part in parents:
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"{where}: no constant {path!r}")
            node = node[part]
        if not isinstance(node, dict) or leaf not in node or isinstance(node[leaf], dict):
            raise ValueError(f"{where}: no constant {path!r}")
        node[leaf] = value


def _section(key: str) -> str:
    return key.rsplit(".", 1)[0]

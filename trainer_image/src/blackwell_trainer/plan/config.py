"""The training plan: the one contract between the planner, the operator and the trainer."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

PLAN_API_VERSION = "training.blackwell.dev/v1alpha1"
# Model states per parameter (fp32 weights, fp32 gradients, two fp32 Adam moments) plus one bf16 copy.
STATE_BYTES_WITH_COMPUTE_COPY = 18
# The share of the GPU those may take before the trainer frees each block's bf16 copy after forward.
KEEP_GATHERED_MEMORY_FRACTION = 0.6
DEFAULT_METRICS_PORT = 9400
# How the trainer's pod termination message starts when a restart cannot help (a plan the trainer refuses,
# data or a checkpoint that does not match the plan): the operator then fails the BlackwellTrainingJob at
# once and deletes its child instead of letting torchrun and the pods retry it.
PERMANENT_ERROR_PREFIX = "permanent error: "
# The weights export (weights_export) writes safetensors files of at most this many bytes; its writing rank
# buffers one file's worth in host memory before writing it, and a tensor larger than that gets a file of
# its own. The planner budgets the node's memory by the same rule (export_host_bytes).
EXPORT_FILE_BYTES = 2 * 2**30
# The dtypes an export can be written in (config.json's `dtype`, `torch_dtype` before transformers 5), bytes
# per element; without one named there the export is bfloat16, what Llama 3.x, Qwen2.5 and Mistral ship.
EXPORT_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_EXPORT_DTYPE = "bfloat16"
# The trainer's S3 cache (shard_cache) holds at most this many bytes when the variable is set: the operator
# sets it from the plan's localStorage.cacheMaxBytes, the share of the pod's declared ephemeral storage the
# cache may fill (issue 24: the node's disk is shared with other namespaces' pods).
CACHE_MAX_BYTES_ENV = "BTJ_CACHE_MAX_BYTES"
# The second guard: the cache also keeps this share of its disk free. The kubelet's default hard eviction
# thresholds are nodefs.available<10% and imagefs.available<15% (docs/security.md has the source); 20% stays
# above both, with room for what other pods write between the cache's look and theirs.
NODE_DISK_KEEP_FREE_FRACTION = 0.20


class WireModel(BaseModel):
    """Base for every wire model: camelCase on the wire, snake_case in Python, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        frozen=False,
    )


class MarkedResult(WireModel):
    """A result the trainer writes as one marked line of its termination message, and the operator finds."""

    MARKER: ClassVar[str]

    def to_line(self) -> str:
        """The marker line of the termination message."""
        return self.MARKER + self.model_dump_json(by_alias=True, exclude_none=True)

    @classmethod
    def find(cls, text: str | None) -> Self | None:
        """The last readable marker line of this version in `text` (a termination message), else None."""
        for line in reversed((text or "").splitlines()):
            head, marker, body = line.strip().partition(cls.MARKER.strip())
            if not marker or head:
                continue
            try:
                return cls.model_validate_json(body)
            except ValueError:
                continue
        return None


class Precision(StrEnum):
    """Numeric format of the transformer blocks' matrix multiplies."""

    BF16 = "bf16"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


class PrecisionRecipe(StrEnum):
    """The scaling recipe that realises a precision (Transformer Engine names, torchao fallbacks)."""

    NONE = "none"
    DELAYED = "delayed"
    CURRENT = "current"
    BLOCK = "block"
    MXFP8_BLOCK = "mxfp8-block"
    NVFP4_BLOCK = "nvfp4-block"
    TORCHAO_TENSORWISE = "torchao-tensorwise"
    TORCHAO_ROWWISE = "torchao-rowwise"


class ActivationCheckpointing(StrEnum):
    """How much of each block's forward is recomputed in the backward pass."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Sharding(StrEnum):
    """FSDP2 layout: shard over every GPU, shard within a node and replicate across, or replicate only."""

    FULL = "full"
    HYBRID = "hybrid"
    NONE = "none"


class DatasetKind(StrEnum):
    """Where training tokens come from."""

    SYNTHETIC = "synthetic"
    SHARDS = "shards"
    # Conversations from `prepare --chat`: packed rows, attention within a conversation, the loss on the
    # assistant's tokens only.
    CHAT = "chat"


class RopeScaling(WireModel):
    """Llama 3.1's RoPE frequency scaling (Hugging Face rope_type "llama3")."""

    rope_type: Literal["llama3"] = Field(default="llama3", description="Scaling rule; only llama3 exists.")
    factor: float = Field(
        gt=0, le=1024, description="How much longer than the original context the model runs."
    )
    low_freq_factor: float = Field(
        gt=0, le=1024, description="Wavelengths above original/low are fully scaled."
    )
    high_freq_factor: float = Field(
        gt=0, le=1024, description="Wavelengths below original/high are not scaled."
    )
    original_max_position_embeddings: int = Field(
        ge=1, le=1_048_576, description="Context length of pre-training."
    )


class Architecture(WireModel):
    """A Llama-style decoder-only transformer shape."""

    hidden_size: Annotated[int, Field(ge=64, le=65536, description="Model width (d_model).")]
    num_layers: Annotated[int, Field(ge=1, le=512, description="Number of transformer blocks.")]
    num_attention_heads: Annotated[int, Field(ge=1, le=1024, description="Query heads per block.")]
    num_key_value_heads: Annotated[
        int, Field(ge=1, le=1024, description="Key/value heads per block (GQA); equal to heads for MHA.")
    ]
    intermediate_size: Annotated[int, Field(ge=64, le=262144, description="SwiGLU hidden width.")]
    vocab_size: Annotated[int, Field(ge=2, le=1_048_576, description="Vocabulary size.")]
    tie_word_embeddings: bool = Field(
        default=False, description="Share the input embedding with the output projection."
    )
    head_dim: int | None = Field(
        default=None, ge=8, le=1024, description="Per-head width; defaults to hiddenSize / numAttentionHeads."
    )
    attention_bias: bool = Field(default=False, description="Bias on the Q, K and V projections (Qwen2).")
    rope_theta: float = Field(default=500000.0, gt=0, le=1e12, description="RoPE base frequency.")
    norm_eps: float = Field(default=1e-5, gt=0, le=1, description="RMSNorm epsilon.")
    rope_scaling: RopeScaling | None = Field(
        default=None, description="RoPE frequency scaling (Llama 3.1 and later); none for plain RoPE."
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> Architecture:
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"numAttentionHeads ({self.num_attention_heads}) must be a multiple of "
                f"numKeyValueHeads ({self.num_key_value_heads})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hiddenSize ({self.hidden_size}) must be divisible by numAttentionHeads "
                f"({self.num_attention_heads}), or set headDim explicitly"
            )
        return self

    @property
    def resolved_head_dim(self) -> int:
        """Per-head width actually used."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    def parameter_count(self) -> int:
        """Exact trainable parameter count (embeddings, blocks, final norm, untied head)."""
        h, d = self.hidden_size, self.resolved_head_dim
        q = h * self.num_attention_heads * d
        kv = 2 * h * self.num_key_value_heads * d
        o = self.num_attention_heads * d * h
        bias = (self.num_attention_heads + 2 * self.num_key_value_heads) * d if self.attention_bias else 0
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h
        per_layer = q + kv + o + bias + mlp + norms
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + self.num_layers * per_layer + h + head


# Hugging Face model types whose decoder is this Architecture exactly (RMSNorm, RoPE, GQA, SwiGLU).
HF_MODEL_TYPES = ("llama", "qwen2", "mistral")
# Architecture field -> the config.json key that carries it (the names in a mismatch message).
HF_CONFIG_KEYS: dict[str, str] = {
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "tie_word_embeddings": "tie_word_embeddings",
    "head_dim": "head_dim",
    "attention_bias": "model_type",  # Qwen2 always has Q/K/V bias, Llama and Mistral never (see below)
    "rope_theta": "rope_theta",
    "norm_eps": "rms_norm_eps",
    "rope_scaling": "rope_scaling",
}


class HfConfigError(ValueError):
    """A Hugging Face config.json this trainer cannot train exactly; the message names the key."""


def _hf_rope(config: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """RoPE base and scaling from either layout: top-level rope_theta / rope_scaling (the Hub's files,
    transformers < 5) or one rope_parameters dict (what transformers 5 writes)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = config.get("rope_theta", params.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise HfConfigError(
            f"config.json rope type {kind!r} is not supported (only default RoPE and Llama 3.1's 'llama3' "
            "scaling); use a Llama 3.x, Qwen2.5 or Mistral checkpoint"
        )
    scaling = RopeScaling(
        factor=params["factor"],
        low_freq_factor=params["low_freq_factor"],
        high_freq_factor=params["high_freq_factor"],
        original_max_position_embeddings=params["original_max_position_embeddings"],
    )
    return float(theta), scaling


def hf_sliding_window(config: Mapping[str, Any]) -> int | None:
    """The attention window a config.json asks for, or None for full causal attention.

    Mistral applies `sliding_window` whenever it is set (v0.1: 4096; v0.2 and later: null); Qwen2 only
    with `use_sliding_window` true. Up to the window, sliding-window attention is plain causal attention.
    """
    window = config.get("sliding_window")
    if window is None:
        return None
    if config.get("model_type") == "qwen2" and not config.get("use_sliding_window", False):
        return None
    return int(window)


def export_dtype_name(hf_config: Mapping[str, Any] | None) -> str:
    """The dtype the export writes: the one the input checkpoint's config.json names, else bfloat16."""
    value = str(hf_config.get("dtype", hf_config.get("torch_dtype"))) if hf_config else None
    return value if value in EXPORT_DTYPE_BYTES else DEFAULT_EXPORT_DTYPE


def export_host_bytes(largest_tensor_bytes: int, file_bytes: int = EXPORT_FILE_BYTES) -> int:
    """The most host memory the export's writing rank holds: one output file's worth, or the largest
    tensor (in the export dtype) when that is larger."""
    return max(file_bytes, largest_tensor_bytes)


def architecture_from_hf_config(
    config: Mapping[str, Any], *, sequence_length: int | None = None
) -> Architecture:
    """The Architecture a Hugging Face config.json describes (Llama 3.x, Qwen2.5, Mistral).

    HfConfigError (one line naming the config.json key and the fix) for what the trainer's model would
    not compute exactly: another model type or activation, MLP or output-projection biases, another RoPE
    rule, or a sliding attention window shorter than `sequence_length` (when given).
    """
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise HfConfigError(
            f"config.json model_type {model_type!r} is not supported; supported: {', '.join(HF_MODEL_TYPES)}"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise HfConfigError(
            f"config.json hidden_act {config.get('hidden_act')!r} is not supported (silu only)"
        )
    for key in ("mlp_bias", "attention_bias"):
        # Llama's attention_bias adds a bias to the output projection too; no Llama 3.x checkpoint has it.
        if config.get(key):
            raise HfConfigError(f"config.json {key} true is not supported ({model_type} without biases only)")
    if int(config.get("pretraining_tp", 1)) != 1:
        raise HfConfigError("config.json pretraining_tp must be 1 (set it to 1: it only splits matmuls)")
    window = hf_sliding_window(config)
    if window is not None and sequence_length is not None and sequence_length > window:
        raise HfConfigError(
            f"config.json sliding_window {window} is shorter than the sequence length {sequence_length}: "
            f"sliding-window attention is not supported; train with sequenceLength <= {window}"
        )
    theta, scaling = _hf_rope(config)
    try:
        return Architecture(
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            head_dim=config.get("head_dim"),
            attention_bias=model_type == "qwen2",
            rope_theta=theta,
            norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_scaling=scaling,
        )
    except KeyError as err:
        raise HfConfigError(f"config.json has no {err.args[0]!r}; is it a decoder's config.json?") from None


def architecture_mismatch(plan_arch: Architecture, checkpoint_arch: Architecture) -> str | None:
    """The first field where a checkpoint's architecture differs from the plan's, as one line; None if equal.

    head_dim compares resolved (an explicit head_dim equal to hidden/heads is the same shape).
    """
    for field, hf_key in HF_CONFIG_KEYS.items():
        if field == "head_dim":
            ours, theirs = plan_arch.resolved_head_dim, checkpoint_arch.resolved_head_dim
        else:
            ours, theirs = getattr(plan_arch, field), getattr(checkpoint_arch, field)
        if ours != theirs:
            wire = Architecture.model_fields[field].alias or field
            return f"config.json {hf_key} gives {field}={theirs!r}, the plan's architecture.{wire} {ours!r}"
    return None


class DatasetConfig(WireModel):
    """Synthetic tokens, or memory-mapped token shards at a local/FSx path or an s3:// prefix."""

    kind: DatasetKind = Field(
        default=DatasetKind.SYNTHETIC,
        description="synthetic, shards (token shards: every token trained on) or chat (prepare --chat: "
        "conversations packed with a document mask, the loss on the assistant's tokens).",
    )
    uri: str | None = Field(
        default=None, description="Folder or s3://bucket/prefix holding *.bin token shards (kind=shards)."
    )
    token_dtype: str = Field(
        default="uint32", pattern="^(uint16|uint32)$", description="Element type of the shard files."
    )
    seed: int = Field(
        default=1234, ge=0, le=2**63 - 1, description="Seed for the synthetic source and shard order."
    )

    @model_validator(mode="after")
    def _uri_for_shards(self) -> DatasetConfig:
        if self.kind in (DatasetKind.SHARDS, DatasetKind.CHAT) and not self.uri:
            raise ValueError(f"dataset.uri is required when dataset.kind is '{self.kind.value}'")
        return self


class WeightsSource(StrEnum):
    """Where initial weights are read from, which sets how fast they load."""

    S3 = "s3"  # downloaded to the node's NVMe cache, then read
    VOLUME = "volume"  # a spec.volumes claim, e.g. FSx for Lustre, shared by every node
    NODE_LOCAL = "node-local"  # the node's own NVMe (/local), staged there beforehand


class WeightsLoad(WireModel):
    """What the planner predicts loading the initial weights takes (not read by the trainer)."""

    source: WeightsSource = Field(description="s3, volume or node-local.")
    checkpoint_bytes: int = Field(ge=0, description="Bytes of the checkpoint's safetensors files.")
    checkpoint_bytes_estimated: bool = Field(
        description="True when the files were not readable where the plan was made: parameters x 2 (bf16)."
    )
    node_read_bytes: int = Field(ge=0, description="Bytes each node reads: the slices its ranks hold.")
    bandwidth_bytes_per_second: float | None = Field(
        default=None, ge=0, description="Read bandwidth assumed for the source; none where not modelled."
    )
    load_seconds: float | None = Field(default=None, ge=0, description="Predicted time to read the weights.")
    host_memory_bytes: int = Field(ge=0, description="Host memory per node the load and the export need.")
    host_memory_limit_bytes: int = Field(ge=0, description="The trainer pod's host memory on one node.")
    node_disk_bytes: int = Field(ge=0, description="Node NVMe the weights take (the S3 cache); 0 otherwise.")
    node_disk_limit_bytes: int = Field(ge=0, description="The node's NVMe the cache may fill.")


class LocalStorage(WireModel):
    """The pod's node-local disk (docs/security.md): what the job writes there by the planner's estimate,
    and what the pod declares, so the kubelet schedules for it and evicts only this pod when it writes more.

    /local (an emptyDir) holds the S3 cache, export staging, single-node checkpoints and NCCL dumps; the
    container's writable layer holds /tmp and the torch.compile caches. The container's ephemeral-storage
    request and limit are `limitBytes` (both, counted against the node's allocatable); the emptyDir's
    sizeLimit is `volumeBytes`; the S3 cache may hold `cacheMaxBytes` (BTJ_CACHE_MAX_BYTES).
    """

    weights_cache_bytes: int = Field(ge=0, description="S3 initial weights, downloaded whole, never evicted.")
    shard_cache_bytes: int = Field(ge=0, description="S3 token shards; least recently used evicted past it.")
    checkpoint_bytes: int = Field(ge=0, description="Single-node checkpoints under /local; 0 elsewhere.")
    export_staging_bytes: int = Field(ge=0, description="One export file staged before its S3 upload.")
    scratch_bytes: int = Field(ge=0, description="Other files on /local: NCCL flight-recorder dumps.")
    container_bytes: int = Field(
        ge=0, description="The container's writable layer and log: /tmp, torch.compile and Triton caches."
    )
    volume_bytes: int = Field(ge=0, description="The /local emptyDir's sizeLimit (whole GiB).")
    limit_bytes: int = Field(ge=0, description="The container's ephemeral-storage request and limit (GiB).")
    cache_max_bytes: int = Field(ge=0, description="What the S3 cache may hold: weights and shards.")
    from_spec: bool = Field(
        default=False, description="True when spec.cluster.localStorageGiB set the limit; else the estimate."
    )


class WeightsConfig(WireModel):
    """A Hugging Face-format checkpoint (config.json and *.safetensors) to start training from."""

    uri: str = Field(min_length=1, description="Folder or s3://bucket/prefix holding the checkpoint.")
    size_bytes: int | None = Field(
        default=None,
        ge=0,
        le=2**60,
        description="Total bytes of its safetensors files, where the planner knew it.",
    )
    load: WeightsLoad | None = Field(default=None, description="The planner's prediction of the load.")


class OutputConfig(WireModel):
    """Where the trainer writes the trained weights as Hugging Face safetensors and config.json."""

    uri: str = Field(min_length=1, description="Folder or s3://bucket/prefix to write the weights to.")


class CheckpointConfig(WireModel):
    """Where and how often the trainer saves distributed checkpoints, and whose weights start the job."""

    path: str | None = Field(
        default=None,
        description="Folder for torch.distributed.checkpoint step folders; none disables saving. The folder "
        "belongs to this job: a resume refuses checkpoints another job wrote there.",
    )
    interval_steps: int = Field(
        default=500, ge=1, le=100_000_000, description="Save every this many optimizer steps."
    )
    keep_latest: int = Field(default=2, ge=1, le=1000, description="Complete checkpoints to keep.")
    start_from: str | None = Field(
        default=None,
        description="Another job's checkpoint folder (the checkpoint.path it saved to): this job starts a "
        "new run at step 0 from the model weights of its newest good checkpoint (a fresh optimizer, data "
        "position and learning-rate schedule). Only read, never written; once this job has a checkpoint "
        "of its own in path, it resumes that instead.",
    )

    @model_validator(mode="after")
    def _start_elsewhere(self) -> CheckpointConfig:
        if self.start_from is not None and "://" in self.start_from:
            raise ValueError(
                f"checkpoint.startFrom {self.start_from} is not a file system path; mount the storage that "
                "holds it (spec.volumes) and give its path"
            )
        if self.start_from and self.path and self.start_from.rstrip("/") == self.path.rstrip("/"):
            raise ValueError(
                f"checkpoint.startFrom {self.start_from} is also checkpoint.path: this job would save over "
                "the checkpoints it starts from; give it a checkpoint.path of its own"
            )
        return self


# Beside plan.json in the plan ConfigMap: which BlackwellTrainingJob the trainer runs for (JobIdentity).
JOB_FILE = "job.json"


class JobIdentity(WireModel):
    """The BlackwellTrainingJob the trainer runs for, as the operator renders it (job.json beside the plan).

    Every checkpoint records it, so that a resume can refuse another job's (docs/trainer.md, "Whose
    checkpoint it is"). Outside the operator (no job.json) the plan's jobName stands for it alone.
    """

    namespace: str = Field(default="", description="The BlackwellTrainingJob's namespace; empty: unknown.")
    name: str = Field(min_length=1, description="The BlackwellTrainingJob's name.")
    uid: str = Field(
        default="", description="Its metadata.uid (a re-created job has a new one); empty: unknown."
    )

    @classmethod
    def beside(cls, plan_path: str | Path, plan: Plan) -> JobIdentity:
        """The job.json next to the plan file; the plan's jobName alone when there is none.

        ValueError when the file is there but is not a JobIdentity.
        """
        path = Path(plan_path).with_name(JOB_FILE)
        if not path.is_file():
            return cls(name=plan.job_name)
        return cls.model_validate_json(path.read_text())

    def describe(self) -> str:
        """namespace/name (uid ...), as much of it as is known."""
        who = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{who} (uid {self.uid})" if self.uid else who


class OptimizerConfig(WireModel):
    """AdamW with linear warm-up and cosine decay."""

    learning_rate: float = Field(default=3e-4, gt=0, le=10, description="Peak learning rate.")
    min_learning_rate_ratio: float = Field(
        default=0.1, ge=0, le=1, description="Final LR as a fraction of the peak."
    )
    warmup_steps: int = Field(default=100, ge=0, le=100_000_000, description="Linear warm-up steps.")
    weight_decay: float = Field(default=0.1, ge=0, le=10, description="Decoupled weight decay.")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="Adam beta1.")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="Adam beta2.")
    eps: float = Field(default=1e-8, gt=0, le=1, description="Adam epsilon.")
    grad_clip_norm: float = Field(
        default=1.0, ge=0, le=1e6, description="Global gradient-norm clip; 0 disables."
    )


def keeps_gathered_weights(parameter_count: int, shard_degree: int, gpu_memory_bytes: int) -> bool:
    """Whether the trainer keeps every block's bf16 compute weights from forward to backward.

    With a shard group of one GPU, freeing them after forward saves only the bf16 copy and costs a second
    cast of every weight in backward; the trainer keeps them while model states plus the copies stay
    under KEEP_GATHERED_MEMORY_FRACTION of the GPU. The planner counts memory by the same rule.
    """
    states = STATE_BYTES_WITH_COMPUTE_COPY * parameter_count
    return shard_degree == 1 and states <= KEEP_GATHERED_MEMORY_FRACTION * gpu_memory_bytes


class GpuInfo(WireModel):
    """The GPU the plan was made for, so the trainer can refuse a plan for other hardware."""

    name: str = Field(description="Catalog name of the GPU, e.g. B200 or H200.")
    compute_capability: str = Field(pattern=r"^\d+\.\d+$", description="CUDA compute capability, e.g. 10.0.")
    memory_bytes: int = Field(ge=0, description="Usable device memory in bytes.")
    peak_bf16_flops: float = Field(ge=0, description="Dense BF16 peak, FLOP/s, used for MFU.")


class MemoryBreakdown(WireModel):
    """Predicted per-GPU memory at the peak, by component, in bytes."""

    parameters: int = Field(ge=0, description="Sharded fp32 master parameters.")
    gradients: int = Field(ge=0, description="Sharded fp32 gradients.")
    optimizer_states: int = Field(ge=0, description="Sharded Adam moments.")
    activations: int = Field(ge=0, description="Saved activations of all blocks at the peak.")
    loss: int = Field(ge=0, description="Logits and loss transient (chunked or full).")
    fsdp_transient: int = Field(ge=0, description="Unsharded parameters/gradients in flight.")
    precision_overhead: int = Field(ge=0, description="Low-precision weight copies and scaling state.")
    workspace: int = Field(ge=0, description="CUDA context, cuBLAS/NCCL workspaces and buffers.")
    fragmentation: int = Field(ge=0, description="Reserved-but-unallocated memory held by the allocator.")
    peak_phase: str = Field(description="The phase that holds the peak: forward, backward or optimizer.")
    peak_allocated: int = Field(ge=0, description="Predicted peak allocated bytes.")
    peak_reserved: int = Field(ge=0, description="Predicted peak reserved bytes (what must fit).")


# The additive components of MemoryBreakdown, in the order tables and plots show them.
MEMORY_COMPONENTS: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer_states",
    "activations",
    "loss",
    "fsdp_transient",
    "precision_overhead",
    "workspace",
    "fragmentation",
)


class Prediction(WireModel):
    """What the planner expects this configuration to do."""

    tokens_per_second_per_gpu: float = Field(ge=0, description="Predicted training tokens/s per GPU.")
    step_time_seconds: float = Field(ge=0, description="Predicted time of one optimizer step.")
    model_flops_utilization: float = Field(ge=0, description="Predicted MFU against the BF16 dense peak.")
    memory: MemoryBreakdown = Field(description="Predicted per-GPU memory.")
    time_breakdown_seconds: dict[str, float] = Field(
        default_factory=dict, description="Step time by component (gemm, attention, recompute, comm, ...)."
    )


class ClusterCorrection(WireModel):
    """The factors a plan took from runs measured on the user's cluster (the operator's calibration)."""

    instance_type: str = Field(description="Instance type the runs were measured on.")
    precision_recipe: PrecisionRecipe = Field(description="Recipe of the runs (part of the family key).")
    activation_checkpointing: ActivationCheckpointing = Field(description="AC mode of the runs.")
    runs: int = Field(
        ge=0,
        description="Distinct jobs of this family measured; the tokens factor is 1 with fewer than the "
        "operator's minimum (3).",
    )
    tokens_factor: float = Field(gt=0, description="Measured over modelled tokens/s (median, clamped).")
    memory_factor: float = Field(
        gt=0,
        description="Measured over modelled peak reserved on this GPU type, every family's readings (the "
        "largest, clamped), raised to what keeps a configuration that ran out of memory from fitting.",
    )
    memory_readings: int = Field(
        default=0,
        ge=0,
        description="Measured configurations the memory factor is learned from (0: memory as modelled, "
        "or only raised by an out-of-memory run).",
    )
    memory_floor: float | None = Field(
        default=None,
        gt=0,
        description="The least memory factor that keeps every configuration that ran out of memory on this "
        "GPU type from fitting; none without such a run.",
    )


class Candidate(WireModel):
    """The tunable part of a plan: one point of the planner's search."""

    precision: Precision = Field(description="Matrix-multiply format.")
    precision_recipe: PrecisionRecipe = Field(description="Scaling recipe for the precision.")
    activation_checkpointing: ActivationCheckpointing = Field(description="Recompute mode.")
    micro_batch_size: int = Field(ge=1, description="Sequences per GPU per forward pass.")
    gradient_accumulation_steps: int = Field(ge=1, description="Micro-batches per optimizer step.")
    sharding: Sharding = Field(description="FSDP2 layout.")
    shard_degree: int = Field(ge=1, description="GPUs a parameter is sharded over.")
    replicate_degree: int = Field(ge=1, description="Replicas of each shard (hybrid / none).")
    context_parallel: int = Field(default=1, ge=1, description="GPUs a sequence is split over.")
    compile: bool = Field(default=True, description="torch.compile each block.")
    loss_chunk_tokens: int = Field(
        default=8192, ge=0, description="Tokens per cross-entropy chunk; 0 computes full logits."
    )


class Alternative(WireModel):
    """A runner-up, with its prediction and why it lost."""

    candidate: Candidate
    prediction: Prediction
    reason: str = Field(description="Why this candidate was not chosen.")


class Basis(StrEnum):
    """What one choice of a plan rests on."""

    # This project ran this combination on this GPU and recorded its speed and memory.
    MEASURED = "measured"
    # Predicted from modelled constants; the trainer's code path for it ran on a GPU here (another GPU, or
    # numerics only), its speed and memory on this hardware did not.
    MODELLED = "modelled"
    # The trainer's code path for it never ran on a GPU here (e.g. MXFP8 and NVFP4, Blackwell-only).
    UNVERIFIED = "unverified"


class ChoiceProvenance(WireModel):
    """Whether one choice of the plan (GPU, recipe, AC, communication, CP) was measured or is modelled."""

    choice: str = Field(
        description="gpu, precision, activationCheckpointing, communication or contextParallel."
    )
    value: str = Field(description="What the plan chose, e.g. B200, fp8/current, full sharding on 16 GPUs.")
    basis: Basis = Field(description="measured, modelled or unverified.")
    detail: str = Field(default="", description="Where it was measured, or what the model rests on.")


# The probe (docs/probe.md): before its first step the trainer times the plan's probe candidates and trains
# with the fastest. Its result is one line of the termination message, PROBE_RESULT_MARKER followed by a
# ProbeResult as compact JSON (the OOM result line's convention: the marker names the format's version).
PROBE_RESULT_VERSION = 1
PROBE_RESULT_MARKER = f"btj-probe/v{PROBE_RESULT_VERSION} "


class ProbePolicy(StrEnum):
    """When the trainer probes the plan's top candidates before training."""

    # Probe when a candidate's speed or memory is modelled, not measured (here or on this cluster).
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class ProbeCandidate(WireModel):
    """One configuration the probe times, with what the planner predicted for it."""

    candidate: Candidate
    prediction: Prediction
    measured: bool = Field(
        default=False,
        description="Its family's speed and memory were measured (by this project on this GPU, or by "
        "enough runs on this cluster); a probe under auto needs at least one that was not.",
    )
    tokens_factor: float = Field(
        default=1.0,
        gt=0,
        description="The cluster correction's tokens factor in its prediction (1: the model's own figure).",
    )


class ProbeGrowth(ProbeCandidate):
    """A larger micro-batch of one candidate's setting, with the planner's prediction: the probe tries it
    when that candidate's measured peak shows memory room the model did not see (docs/probe.md)."""

    grows: int = Field(ge=0, description="Index in plan.probe.candidates of the candidate it enlarges.")


class ProbeOutcome(StrEnum):
    """What became of one candidate in the probe."""

    MEASURED = "measured"
    OUT_OF_MEMORY = "out-of-memory"  # torch.OutOfMemoryError on some rank: dropped, the probe went on
    OVER_MEMORY = "over-memory-budget"  # ran, but its peak reserved passed the plan's memory budget
    FAILED = "failed"  # another error on some rank (the detail names it): dropped
    NOT_RUN = "not-run"  # the time budget ran out before it


class ProbeMeasurement(WireModel):
    """One candidate's probe figures beside its prediction (figures agreed by every rank)."""

    index: int = Field(
        ge=0,
        description="Position in plan.probe.candidates (0: the planner's pick), then in plan.probe.growth "
        "(the number of candidates plus its position there).",
    )
    outcome: ProbeOutcome
    grown_from: int | None = Field(
        default=None,
        ge=0,
        description="For a grown candidate: the candidate whose measured peak showed the room for it.",
    )
    predicted_tokens_per_second_per_gpu: float = Field(
        ge=0, description="The planner's tokens/s per GPU for this candidate."
    )
    predicted_peak_reserved_bytes: int = Field(
        ge=0, description="The planner's peak reserved GPU memory for this candidate."
    )
    tokens_per_second_per_gpu: float | None = Field(
        default=None, ge=0, description="What the slowest rank measured; none when not measured."
    )
    peak_reserved_bytes: int | None = Field(
        default=None, ge=0, description="What the fullest rank reserved at its peak; none on CPU."
    )
    seconds: float = Field(default=0.0, ge=0, description="Wall time this candidate took, build included.")
    detail: str = Field(default="", description="Why it was dropped, when it was.")


class ProbeResult(MarkedResult):
    """What the probe measured and which candidate the job trains with."""

    MARKER: ClassVar[str] = PROBE_RESULT_MARKER

    winner: int = Field(ge=0, description="Index of the candidate the job trains with.")
    chosen: Candidate | None = Field(
        default=None,
        description="That candidate's configuration: a restart keeps the choice only while its plan's "
        "candidate at that index is the same (a re-plan makes other candidates).",
    )
    measurements: list[ProbeMeasurement] = Field(
        default_factory=list, description="Each candidate's prediction and measurement, in plan order."
    )
    seconds: float = Field(ge=0, description="Wall time of the whole probe.")
    stopped_early: bool = Field(default=False, description="The time budget ran out before every candidate.")


class ProbePlan(WireModel):
    """The plan's probe: the candidates, the time budget, and whether the trainer runs it."""

    policy: ProbePolicy = Field(description="The spec's spec.tuning.probe.policy.")
    enabled: bool = Field(description="Whether the trainer probes before its first step.")
    reason: str = Field(description="Why it probes, or why not.")
    candidates: list[ProbeCandidate] = Field(
        default_factory=list, description="What it times, the planner's pick first."
    )
    budget_seconds: float = Field(ge=0, description="Most wall time the probe may take; it stops there.")
    warmup_steps: int = Field(default=2, ge=1, le=100, description="Untimed steps per candidate.")
    timed_steps: int = Field(default=3, ge=1, le=100, description="Timed steps per candidate.")
    memory_budget_bytes: int = Field(
        ge=0, description="The most peak reserved memory a winner may measure (0: no limit, CPU)."
    )
    growth: list[ProbeGrowth] = Field(
        default_factory=list,
        description="Larger micro-batches of the candidates' settings, predicted by the planner: tried when "
        "a candidate's measured peak shows they fit after all.",
    )
    fit_margin: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Share of the memory budget a grown candidate's corrected peak must leave free (0: the "
        "budget itself, which already keeps spec.tuning.memoryHeadroom free).",
    )
    max_grown: int = Field(default=2, ge=0, le=6, description="Grown candidates one probe tries at most.")
    result: ProbeResult | None = Field(
        default=None,
        description="The choice an earlier start of this job made (the operator copies it from the "
        "trainer's termination message): a restart trains with it and never probes again.",
    )

    @property
    def options(self) -> list[ProbeCandidate]:
        """Everything a probe may time, by measurement index: the candidates, then the growth."""
        return [*self.candidates, *self.growth]


class NodeChoice(WireModel):
    """How an elastic job's node count was chosen from its range and the healthy nodes."""

    nodes: int = Field(ge=1, description="The count planned for.")
    min_nodes: int = Field(ge=1, description="spec.cluster.elastic.minNodes.")
    max_nodes: int = Field(ge=1, description="spec.cluster.elastic.maxNodes.")
    schedulable: int | None = Field(
        default=None, ge=0, description="Healthy schedulable nodes of the instance type seen; None: unknown."
    )
    reason: str = Field(description="Why this count, in one line.")
    refused: list[str] = Field(
        default_factory=list,
        description="Larger counts the healthy nodes held that could not be planned, why.",
    )


class Plan(WireModel):
    """Everything the trainer needs to run, and what the planner predicted (status.plan, the ConfigMap)."""

    api_version: str = Field(default=PLAN_API_VERSION, description="Schema version of this plan.")
    job_name: str = Field(default="btj", description="Name of the BlackwellTrainingJob that owns the plan.")
    model_name: str = Field(description="Preset name, or 'custom'.")
    architecture: Architecture
    parameter_count: int = Field(ge=1, description="Trainable parameters.")
    gpu: GpuInfo
    instance_type: str = Field(description="Instance type the plan targets, e.g. ml.p6-b200.48xlarge.")
    nodes: int = Field(ge=1, description="Nodes in the job.")
    gpus_per_node: int = Field(ge=1, description="GPUs (trainer processes) per node.")
    sequence_length: int = Field(ge=16, description="Tokens per training sequence.")
    global_batch_tokens: int = Field(ge=1, description="Tokens per optimizer step over all GPUs.")
    steps: int = Field(ge=1, description="Optimizer steps to run.")
    chosen: Candidate = Field(description="The chosen configuration.")
    predicted: Prediction = Field(description="Prediction for the chosen configuration.")
    alternatives: list[Alternative] = Field(default_factory=list, description="Best runners-up.")
    candidates_evaluated: int = Field(default=0, ge=0, description="Configurations the search scored.")
    explanation: list[str] = Field(default_factory=list, description="Why the chosen values won.")
    calibration: str = Field(default="", description="Calibration data set used, with provenance.")
    cluster_correction: ClusterCorrection | None = Field(
        default=None,
        description="Correction from runs measured on this cluster, applied to the chosen family; the "
        "prediction includes its tokens factor (divide by it for the model's own figure).",
    )
    provenance: list[ChoiceProvenance] = Field(
        default_factory=list,
        description="Per choice: measured here (and where) or modelled; empty in plans made before it.",
    )
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    weights: WeightsConfig | None = Field(
        default=None, description="Initial weights; the job's own checkpoint takes precedence on resume."
    )
    output: OutputConfig | None = Field(default=None, description="Export of the trained weights.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    elastic: NodeChoice | None = Field(
        default=None, description="An elastic job's node count: which one was chosen from its range, and why."
    )
    metrics_port: int = Field(default=DEFAULT_METRICS_PORT, ge=1, le=65535, description="Prometheus port.")
    log_every_steps: int = Field(default=10, ge=1, description="Log one line every this many steps.")
    probe: ProbePlan | None = Field(
        default=None, description="The probe of the top candidates before the first step; none: no probe."
    )
    local_storage: LocalStorage | None = Field(
        default=None,
        description="The pod's node-local disk: the estimate and the ephemeral storage it declares; none in "
        "plans made before it.",
    )

    @property
    def modelled_choices(self) -> list[ChoiceProvenance]:
        """The choices that were not measured here (modelled or unverified)."""
        return [c for c in self.provenance if c.basis is not Basis.MEASURED]

    @property
    def prediction_basis(self) -> str:
        """What the predicted figures rest on, as one word that goes wherever they go (issue 39): measured
        (every choice measured on this GPU here), modelled, unverified (a choice's trainer path never ran
        on a GPU here) or unknown (a plan made before provenance existed)."""
        if not self.provenance:
            return "unknown"
        bases = {c.basis for c in self.provenance}
        for basis in (Basis.UNVERIFIED, Basis.MODELLED):
            if basis in bases:
                return basis.value
        return Basis.MEASURED.value

    @property
    def world_size(self) -> int:
        """Trainer processes in the job."""
        return self.nodes * self.gpus_per_node

    def to_json(self) -> str:
        """The plan exactly as the ConfigMap and status.plan carry it."""
        return self.model_dump_json(by_alias=True, indent=2)

    @classmethod
    def from_file(cls, path: str | Path) -> Plan:
        """Read a plan JSON file (the mounted ConfigMap)."""
        return cls.model_validate_json(Path(path).read_text())


# The out-of-memory result (docs/trainer.md, "Out of GPU memory"): one line of the termination message is
# OOM_RESULT_MARKER followed by an OomResult as compact JSON. The marker names the format's version; a
# reader takes the last such line and ignores versions it does not know.
OOM_RESULT_VERSION = 1
OOM_RESULT_MARKER = f"btj-oom/v{OOM_RESULT_VERSION} "


class OomPhase(StrEnum):
    """Where in the run the GPU ran out of memory."""

    SETUP = "setup"  # building, sharding or loading the model and optimizer, before the first step
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"  # gradient clipping, the optimizer step and its checks


class OomResult(MarkedResult):
    """What a CUDA out-of-memory error in the trainer measured, beside what the plan predicted (bytes)."""

    MARKER: ClassVar[str] = OOM_RESULT_MARKER

    phase: OomPhase = Field(description="setup, forward, backward or optimizer.")
    step: int = Field(ge=0, description="The optimizer step that failed (1 = the first); 0 in setup.")
    compiling: bool = Field(
        default=False, description="The step was the first of a compiled plan (torch.compile ran in it)."
    )
    rank: int = Field(default=0, ge=0, description="The rank that reported it.")
    requested_bytes: int | None = Field(
        default=None, ge=0, description="The allocation that failed (the message's 'Tried to allocate')."
    )
    allocated_bytes: int = Field(ge=0, description="Bytes in live tensors when it failed.")
    peak_allocated_bytes: int = Field(ge=0, description="The allocator's peak allocated bytes.")
    peak_reserved_bytes: int = Field(ge=0, description="The allocator's peak reserved bytes.")
    non_pytorch_bytes: int | None = Field(
        default=None,
        ge=0,
        description="The process's GPU memory outside the allocator (CUDA context, NCCL, cuBLAS), from the "
        "message; none where it did not say.",
    )
    gpu_total_bytes: int | None = Field(default=None, ge=0, description="The GPU's total memory.")
    predicted_peak_reserved_bytes: int = Field(ge=0, description="The plan's predicted peak reserved bytes.")
    candidate: Candidate = Field(description="The plan's chosen configuration, the one that ran out.")

    @property
    def needed_bytes(self) -> int:
        """A lower bound of what the run needed: its peak, or its live tensors plus the failed request,
        plus the memory outside the allocator."""
        live = self.allocated_bytes + (self.requested_bytes or 0)
        return max(self.peak_reserved_bytes, live) + (self.non_pytorch_bytes or 0)

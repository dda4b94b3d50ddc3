"""Plans for render tests: the real planner when present, else a hand-built plan of the same shape."""

from __future__ import annotations

from blackwell_operator.models import BlackwellTrainingJobSpec
from blackwell_trainer.config import (
    ActivationCheckpointing,
    Architecture,
    Candidate,
    GpuInfo,
    MemoryBreakdown,
    Plan,
    Precision,
    PrecisionRecipe,
    Prediction,
    Sharding,
)

try:  # the planner helper's module; absent until it lands
    from blackwell_operator.planner import plan_job as _plan_job
except ImportError:  # pragma: no cover - depends on the checkout
    _plan_job = None

_LLAMA_8B = Architecture(
    hidden_size=4096,
    num_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=14336,
    vocab_size=128256,
)
_GPUS = {
    "ml.p5.48xlarge": ("H100", "9.0", 80, 989e12),
    "ml.p5e.48xlarge": ("H200", "9.0", 141, 989e12),
    "ml.p5en.48xlarge": ("H200", "9.0", 141, 989e12),
    "ml.p6-b200.48xlarge": ("B200", "10.0", 180, 2250e12),
}


def hand_plan(spec: BlackwellTrainingJobSpec, job_name: str) -> Plan:
    """A fixed plan for the spec's hardware: enough for rendering, no planning involved."""
    instance = spec.cluster.instance_type.value
    gpu_name, capability, memory_gb, peak = _GPUS[instance]
    gpus = spec.cluster.gpus_per_node or 8
    architecture = spec.model.architecture or _LLAMA_8B
    memory = MemoryBreakdown(
        parameters=1,
        gradients=1,
        optimizer_states=1,
        activations=1,
        loss=1,
        fsdp_transient=1,
        precision_overhead=0,
        workspace=1,
        fragmentation=1,
        peak_phase="backward",
        peak_allocated=10,
        peak_reserved=12,
    )
    return Plan(
        job_name=job_name,
        model_name=spec.model.preset or "custom",
        architecture=architecture,
        parameter_count=architecture.parameter_count(),
        gpu=GpuInfo(
            name=gpu_name, compute_capability=capability, memory_bytes=memory_gb * 10**9, peak_bf16_flops=peak
        ),
        instance_type=instance,
        nodes=spec.cluster.nodes,
        gpus_per_node=gpus,
        sequence_length=spec.training.sequence_length,
        global_batch_tokens=spec.training.sequence_length * gpus * spec.cluster.nodes,
        steps=spec.training.steps,
        chosen=Candidate(
            precision=Precision.BF16,
            precision_recipe=PrecisionRecipe.NONE,
            activation_checkpointing=ActivationCheckpointing.NONE,
            micro_batch_size=1,
            gradient_accumulation_steps=1,
            sharding=Sharding.FULL,
            shard_degree=gpus * spec.cluster.nodes,
            replicate_degree=1,
        ),
        predicted=Prediction(
            tokens_per_second_per_gpu=1000.0,
            step_time_seconds=1.0,
            model_flops_utilization=0.4,
            memory=memory,
        ),
        dataset=spec.training.dataset,
        checkpoint=spec.training.checkpoint,
        optimizer=spec.training.optimizer,
    )


def plan_for(spec: BlackwellTrainingJobSpec, job_name: str = "btj") -> Plan:
    """The planner's plan when the planner exists, else the hand-built one."""
    if _plan_job is not None:
        return _plan_job(spec, job_name=job_name)
    return hand_plan(spec, job_name)

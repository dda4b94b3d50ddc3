"""The names of the metrics the trainer exports: one home for the exporter and the operator that reads them.

A wire contract: torch-free (no import beyond the standard library), so the operator image imports it.
The names are the family names given to the Prometheus client; a counter's sample is exposed with
`_total` appended (`total()`), a histogram's as `_bucket`, `_count` and `_sum`, an info's as `_info`.
The dashboard and alert rules in the chart spell them in PromQL; tests/dashboard checks those against
what the exporter registers.
"""

from __future__ import annotations

# Throughput and progress (the operator's measure loop reads these).
TOKENS = "btj_trainer_tokens"  # counter: tokens this pod's GPUs trained since the pod started
STEPS = "btj_trainer_steps"  # counter: optimizer steps this container ran
STEP = "btj_trainer_step"  # gauge: the job's last completed step, across resumes
PLANNED_STEPS = "btj_trainer_planned_steps"
STEP_DURATION = "btj_trainer_step_duration_seconds"  # histogram
GPUS = "btj_trainer_gpus"
MFU = "btj_trainer_model_flops_utilization_ratio"
LOSS = "btj_trainer_loss"
# Memory: the peak by allocator kind (label MEMORY_KIND_LABEL, one of MEMORY_KINDS).
GPU_MEMORY_PEAK = "btj_trainer_gpu_memory_peak_bytes"
MEMORY_KIND_LABEL = "kind"
ALLOCATED, RESERVED = "allocated", "reserved"
MEMORY_KINDS = (ALLOCATED, RESERVED)
GPU_ALLOC_RETRIES = "btj_trainer_gpu_alloc_retries"  # counter
# The plan's prediction, exported beside the measurement.
PREDICTED_TOKENS_PER_SECOND = "btj_trainer_predicted_tokens_per_second"
PREDICTED_MEMORY_PEAK = "btj_trainer_predicted_memory_peak_bytes"
PREDICTED_MFU = "btj_trainer_predicted_model_flops_utilization_ratio"
# Checkpoints and initial weights.
LAST_CHECKPOINT = "btj_trainer_last_checkpoint_timestamp_seconds"
CHECKPOINT_FAILURES = "btj_trainer_checkpoint_failures"  # counter
CHECKPOINTS_SKIPPED = "btj_trainer_checkpoints_skipped"  # counter
WEIGHTS_LOAD = "btj_trainer_weights_load_seconds"
# Out of GPU memory, by phase (label OOM_PHASE_LABEL: config.OomPhase's values).
OUT_OF_MEMORY = "btj_trainer_gpu_out_of_memory"  # counter
OOM_PHASE_LABEL = "phase"
OUT_OF_MEMORY_NEEDED = "btj_trainer_gpu_out_of_memory_needed_bytes"
# The probe of the plan's top candidates (docs/probe.md): per candidate (label PROBE_CANDIDATE_LABEL, its
# index in plan.probe.candidates) and figure (label PROBE_SOURCE_LABEL: predicted or measured).
PROBE_TOKENS_PER_SECOND = "btj_trainer_probe_tokens_per_second"
PROBE_CANDIDATE_LABEL = "candidate"
PROBE_SOURCE_LABEL = "source"
PREDICTED, MEASURED = "predicted", "measured"
PROBE_WINNER = "btj_trainer_probe_winner"  # gauge: the index trained with; -1 without a probe
PROBE_SECONDS = "btj_trainer_probe_seconds"  # gauge: the probe's wall time; 0 without one
BUILD = "btj_trainer_build"  # info: the trainer's version and the plan's settings
# Beside /metrics on the same port: the probe's whole result as its termination-message line (ProbeResult's
# marker and JSON), 404 until the probe has chosen; the operator takes it while the first run goes on.
PROBE_RESULT_PATH = "/probe"


def total(counter: str) -> str:
    """The sample name Prometheus exposes for the counter named `counter`."""
    return f"{counter}_total"

"""The training entry point and loop: read the plan, refuse what cannot run, build, resume and train.

``python -m blackwell_trainer --plan PATH`` (or env BTJ_PLAN_PATH), usually under torchrun.
Exit codes: 0 done or preempted after a checkpoint, 2 a bad or impossible plan, data, initial weights or
checkpoint storage that does not fit it, an export of the trained weights that cannot be written, a
checkpoint that cannot be written (the final one, the preemption one, or MAX_FAILED_SAVES_IN_A_ROW
interval saves in a row) or none that verifies and loads, or a plan that ran out of GPU memory (with an
OOM result line, oom.py), 3 a step whose loss, gradient norm or
parameters are not finite (nothing of it is saved).

The loop's components live beside it, one per module: runtime (rank, device, process group),
plan_check, optimizer (AdamW and the LR schedule), finite_check, step_report, checkpoint_manager (what a
checkpoint holds and when it is saved), termination (the pod's termination message) and errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .config import DatasetKind, OomPhase, Plan
from .context_parallel import ContextParallel, data_parallel_rank
from .errors import DataError, NonFiniteStep, PlanError
from .finite_check import reduce_loss_checked
from .loss import IGNORE_INDEX
from .model import Attention, Transformer, build_model, flops_per_token
from .oom import GpuOutOfMemory, PhaseTracker, earlier_result, oom_result
from .optimizer import build_optimizer, set_lr
from .parallelize import ParallelismError, build_mesh, parallelize, validate_layout
from .plan_check import PLAN_ENV, check_plan, load_plan
from .precision import (
    PrecisionError,
    PrecisionSetup,
    device_capability,
    resolve_backend,
    te_available,
    torchao_available,
)
from .preemption import PreemptionGuard
from .runtime import Runtime, init_distributed
from .step_report import StepReport, StepResult
from .termination import fail, read_message, remember_probe, succeeded
from .tuning import Tuning, TuningError

if TYPE_CHECKING:  # imported where run() needs them, not at start-up
    from .checkpoint_manager import CheckpointManager
    from .data import TokenSource
    from .metrics import TrainerMetrics
    from .sample_ledger import SampleLedger

log = logging.getLogger("blackwell_trainer")
EXIT_NON_FINITE = 3
# A micro-batch: inputs and labels, and for packed chat rows each token's document (document_mask.py).
MicroBatch = tuple[torch.Tensor, ...]


class Trainer:
    """Model, optimizer and one ``step()``; ``run()`` adds data, checkpoints, metrics and preemption."""

    def __init__(
        self,
        plan: Plan,
        runtime: Runtime,
        tracker: PhaseTracker | None = None,
        *,
        tuning: Tuning | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        self.plan = plan
        self.runtime = runtime
        self.tuning = tuning if tuning is not None else Tuning.from_env()
        # Where a CUDA OOM happens (setup until the first step): the run's tracker, or a private one.
        self.tracker = tracker or PhaseTracker()
        self._stepped = False  # the first step of this process runs torch.compile (a compiled plan)
        chosen = plan.chosen
        self.mesh = build_mesh(chosen, runtime.world_size, runtime.device.type)
        self.model: Transformer = build_model(
            plan.architecture, max_seq_len=plan.sequence_length, loss_chunk_tokens=chosen.loss_chunk_tokens
        )
        self.cp: ContextParallel | None = None
        if chosen.context_parallel > 1:
            self.cp = ContextParallel.create(
                chosen.context_parallel, sequence_length=plan.sequence_length, device=runtime.device
            )
            for module in self.model.modules():
                if isinstance(module, Attention):
                    module.attend = self.cp
        backend, _ = resolve_backend(chosen, te=te_available(), torchao=torchao_available())
        # One rank with nothing to shard trains the plain module (parallelize.py): no FSDP2 copies.
        self.single_device = self.tuning.use_single_device(
            world_size=runtime.world_size, context_parallel=chosen.context_parallel, backend=backend
        )
        self.precision: PrecisionSetup = parallelize(
            self.model,
            chosen,
            None if self.single_device else self.mesh,
            device=runtime.device,
            amax_group=dist.group.WORLD if dist.is_initialized() else None,
            seed=plan.dataset.seed,
            gpu_memory_bytes=plan.gpu.memory_bytes or None,
            compute_dtype=compute_dtype,
            compile_mode=self.tuning.compile_mode,
            fp8_pow2_scales=self.tuning.fp8_pow2_scales,
            fuse_projections=self.tuning.fuse_projections,
            recast_blocks=self.tuning.recast_blocks,
        )
        self.optimizer = build_optimizer(self.model, plan, runtime.device)
        self.step_index = 0
        self.flops_per_token = flops_per_token(plan.architecture, plan.sequence_length)
        # Tokens this rank processes: a context-parallel rank holds 1/cp of each sequence.
        self.tokens_per_micro_batch = (
            chosen.micro_batch_size * plan.sequence_length // chosen.context_parallel
        )

    def step(self, batches: Sequence[MicroBatch]) -> StepResult:
        """One optimizer step over ``len(batches)`` micro-batches (gradient accumulation)."""
        started = time.perf_counter()
        step = self.step_index + 1
        compiling = self.plan.chosen.compile and not self._stepped
        set_lr(self.optimizer, self.step_index, self.plan)
        accum = len(batches)
        loss_sum = self._forward_backward(batches, step, compiling)
        self.tracker.mark(OomPhase.OPTIMIZER, step, compiling=compiling)
        self._stepped = True
        foreach = self.runtime.device.type == "cuda"
        grad_norm = self._optimizer_step(foreach)
        self.step_index += 1
        loss_value = reduce_loss_checked(
            self.step_index,
            loss_sum,
            accum,
            grad_norm,
            self.model if self.tuning.parameter_check else None,
            foreach=foreach,
        )
        seconds = time.perf_counter() - started
        tokens = self.tokens_per_micro_batch * accum
        mfu = (
            self.flops_per_token * tokens / seconds / self.plan.gpu.peak_bf16_flops
            if self.plan.gpu.peak_bf16_flops
            else 0.0
        )
        return StepResult(loss=loss_value, seconds=seconds, tokens=tokens, mfu=mfu)

    def _forward_backward(self, batches: Sequence[MicroBatch], step: int, compiling: bool) -> torch.Tensor:
        """Forward and backward of each micro-batch; the sum of their (detached) losses."""
        accum, tracker = len(batches), self.tracker
        loss_sum = torch.zeros((), device=self.runtime.device)
        weights = self._trained_token_weights(batches)
        for index, (inputs, labels, *packed) in enumerate(batches):
            documents = packed[0].to(self.runtime.device, non_blocking=True) if packed else None
            # Gradients are reduce-scattered after every micro-batch (FSDP2's default): sharded
            # accumulation keeps memory at what the planner modelled, and the NCCL work overlaps compute.
            positions = None
            if self.cp is not None:
                # Every rank of the cp group holds the same sequences; keep this rank's two chunks.
                part = self.cp.batch(inputs, labels)
                inputs, labels, positions = part.inputs, part.labels, self.cp.positions
            inputs = inputs.to(self.runtime.device, non_blocking=True)
            labels = labels.to(self.runtime.device, non_blocking=True)
            tracker.mark(OomPhase.FORWARD, step, compiling=compiling)
            with self.precision.forward_context():
                loss = self.model(inputs, labels, positions, documents)
            if self.cp is not None:
                loss = loss * part.loss_weight
            if weights is not None:
                loss = loss * weights[index]
            tracker.mark(OomPhase.BACKWARD, step, compiling=compiling)
            (loss / accum).backward()
            loss_sum += loss.detach()
        return loss_sum

    def _trained_token_weights(self, batches: Sequence[MicroBatch]) -> list[torch.Tensor] | None:
        """For packed chat rows, each micro-batch's share of the step's trained tokens, on every rank.

        A micro-batch's loss is the mean over its own trained (unmasked) tokens, and chat rows hold
        different numbers of them. Weighting each mean by n_mb * ranks * accum / N (N: the trained tokens of
        the whole global batch) makes the step's loss the mean over all N tokens, whatever the ranks and the
        micro-batch / accumulation split: FSDP averages gradients over the ranks, the loop over `accum`.
        Plain token data (every label trained on) keeps its unweighted means, bit for bit.
        """
        if not batches or len(batches[0]) < 3:
            return None
        counts = torch.stack([(b[1] != IGNORE_INDEX).sum() for b in batches]).to(self.runtime.device)
        total = counts.sum().to(torch.float64)
        ranks = 1
        if dist.is_initialized():
            dist.all_reduce(total)
            ranks = dist.get_world_size()
        scale = ranks * len(batches) / total.clamp(min=1.0)
        return [(n * scale).to(torch.float32) for n in counts]

    def _optimizer_step(self, foreach: bool) -> torch.Tensor:
        """Clip (or only measure) the gradient norm, step and zero the gradients; the norm before clipping."""
        clip = self.plan.optimizer.grad_clip_norm
        in_step = clip > 0 and self.tuning.clip_in_optimizer and _fused(self.optimizer)
        if clip > 0 and not in_step:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip, foreach=foreach)
        else:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads, foreach=foreach)
        # clip_grad_norm_'s coefficient, applied inside the fused kernel (it divides by grad_scale)
        # instead of a separate multiply over every gradient; 1 (exactly) when nothing is clipped. Reset
        # to None otherwise: a scale left from an earlier step would divide already clipped gradients.
        coef = (clip / (grad_norm.float() + 1e-6)).clamp(max=1.0) if in_step else None
        self.optimizer.grad_scale = None if coef is None else 1.0 / coef  # type: ignore[attr-defined]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.after_optimizer_step(self.model)
        return grad_norm


def _fused(optimizer: torch.optim.Optimizer) -> bool:
    """AdamW built with fused kernels (optimizer.py: on CUDA, and where a test asks for them)."""
    return all(group.get("fused") for group in optimizer.param_groups)


class LoopState:
    """What a checkpoint holds beside the model and optimizer: the loop's step and the data position.

    Saved as the checkpoint's per-rank `extra` ({"step", "data"}), the layout docs/trainer.md describes.
    """

    def __init__(self, trainer: Trainer, source: TokenSource) -> None:
        self.trainer, self.source = trainer, source
        self.resumed = ""  # after a load: the line saying the data position agrees with the plan

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.trainer.step_index, "data": self.source.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from .data import check_resume

        self.trainer.step_index = int(state_dict["step"])
        self.source.load_state_dict(state_dict["data"])
        # A resize resumes on another layout: the position and global batch must still be the plan's.
        self.resumed = check_resume(state_dict["data"], self.trainer.step_index, self.source)


def run(plan: Plan, runtime: Runtime, guard: PreemptionGuard) -> int:
    """Train to plan.steps, resuming from the latest complete checkpoint; 0 on completion or preemption.

    `guard` is the SIGTERM guard main() holds (``python -m blackwell_trainer`` installs it before torch is
    imported); main() also restores it.
    """
    from .metrics import TrainerMetrics

    init_distributed(runtime)
    metrics = TrainerMetrics(plan)
    tracker = PhaseTracker()
    try:
        if runtime.local_rank == 0:
            metrics.serve(plan.metrics_port)
        plan = _probed(plan, runtime, metrics)
        return _train(plan, runtime, guard, metrics, tracker)
    except torch.OutOfMemoryError as err:
        # Read the allocator's figures before the traceback (and the tensors its frames hold) goes.
        result = oom_result(err, tracker, plan, runtime.device, runtime.rank)
        metrics.record_out_of_memory(result)
        raise GpuOutOfMemory(result) from None
    finally:
        metrics.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _probed(plan: Plan, runtime: Runtime, metrics: TrainerMetrics) -> Plan:
    """The plan with the configuration the probe chose (docs/probe.md): probed now, before the first
    step, or kept from an earlier start of this job; the plan as it is without a probe or on a resume."""
    from . import probe

    if plan.probe is None or not plan.probe.enabled:
        return plan
    earlier = probe.earlier_choice(plan, read_message())
    if earlier is not None:
        log.info("probe: training with candidate %d, the choice of an earlier start", earlier.winner)
        metrics.record_probe(plan, earlier)
        remember_probe(earlier)
        return probe.plan_for(plan, earlier.winner)
    from .checkpoint import list_complete

    if plan.checkpoint.path is not None and list_complete(Path(plan.checkpoint.path)):
        # Checkpoints from before the probe existed: they resume in the plan's own configuration.
        log.info("probe: skipped, the job resumes from a checkpoint without a probe's choice")
        return plan
    builders = probe.Builders(
        trainer=lambda candidate: Trainer(candidate, runtime, PhaseTracker()),
        source=lambda candidate: _token_source(candidate, runtime),
    )
    result = probe.run_probe(plan, builders, runtime.device)
    for line in probe.describe_result(plan, result):
        log.info("%s", line)
    probe.keep_choice(plan, result, is_writer=runtime.rank == 0)
    remember_probe(result)
    metrics.record_probe(plan, result)
    return probe.plan_for(plan, result.winner)


def _train(
    plan: Plan, runtime: Runtime, guard: PreemptionGuard, metrics: TrainerMetrics, tracker: PhaseTracker
) -> int:
    """run()'s body: build, then train (_loop); the data source is closed however it ends."""
    trainer = Trainer(plan, runtime, tracker)
    source = _token_source(plan, runtime)
    try:
        return _loop(plan, runtime, guard, metrics, trainer, source)
    finally:
        source.close()  # its background fetch is joined before run() destroys the process group


def _loop(
    plan: Plan,
    runtime: Runtime,
    guard: PreemptionGuard,
    metrics: TrainerMetrics,
    trainer: Trainer,
    source: TokenSource,
) -> int:
    """Resume, then step until done or preempted; 0 either way."""
    from .checkpoint_manager import CheckpointManager
    from .sample_ledger import SampleLedger

    state = LoopState(trainer, source)
    checkpoints = CheckpointManager(
        plan.checkpoint,
        rank=runtime.rank,
        model=trainer.model,
        optimizer=trainer.optimizer,
        state=state,
        steps=plan.steps,
        recorder=metrics,
    )
    ledger = SampleLedger.from_env(runtime.rank)
    _resume_or_start(plan, state, checkpoints, metrics)
    report = StepReport(plan, runtime, metrics)
    started_at = trainer.step_index
    metrics.step.set(started_at)  # a resumed job's progress shows before its first new step
    while True:
        # Done first, without a collective: the last step's checkpoint is the last collective before
        # the process group is destroyed. (A tiny all-reduce there made the gloo abort at exit that
        # process_exit.py explains far more likely; the exit path now rules it out.)
        if trainer.step_index >= plan.steps:
            _export(plan, trainer, runtime)
            return 0
        # Every rank asks before every step it still has to take, so all stop before the same step. A
        # SIGTERM during start-up (rendezvous, model build, resume) stops here, before the first step.
        if guard.agreed():
            checkpoints.at_preemption(trainer.step_index, started_at)
            return 0
        result = _finite_step(trainer, source, checkpoints, ledger)
        checkpoints.confirm_finite(trainer.step_index)  # the checkpoint before it is known good
        report.step(trainer.step_index, result, lr=trainer.optimizer.param_groups[0]["lr"])
        checkpoints.after_step(trainer.step_index)


def _token_source(plan: Plan, runtime: Runtime) -> TokenSource:
    from .data import DataLayout, build_token_source

    # Context-parallel peers (consecutive ranks) read the same samples: index the data by dp rank.
    dp_rank, dp_world = data_parallel_rank(runtime.rank, runtime.world_size, plan.chosen.context_parallel)
    layout = DataLayout(
        micro_batch_size=plan.chosen.micro_batch_size,
        sequence_length=plan.sequence_length,
        vocab_size=plan.architecture.vocab_size,
        rank=dp_rank,
        world_size=dp_world,
        # The global batch (with the ranks and micro-batch): what a resume on another layout must keep.
        accumulation=plan.chosen.gradient_accumulation_steps,
    )
    if plan.dataset.kind == DatasetKind.CHAT:
        from .packed_data import build_chat_source

        return build_chat_source(plan.dataset, layout)
    return build_token_source(plan.dataset, layout)


def _resume_or_start(
    plan: Plan, state: LoopState, checkpoints: CheckpointManager, metrics: TrainerMetrics
) -> None:
    """The newest good checkpoint of this job (collective), else the plan's initial weights, if any."""
    trainer, source = state.trainer, state.source
    if checkpoints.resume():
        log.info(state.resumed)
    elif plan.weights is not None:  # the job's own checkpoint wins; the initial weights start it
        from .data import ShardTokenSource
        from .packed_data import ChatTokenSource
        from .weights_load import check_data_tokenizer, load_pretrained

        # Before the (long) load: shards of another tokenizer would train the model on the wrong ids.
        if isinstance(source, ShardTokenSource | ChatTokenSource):  # synthetic tokens have no tokenizer
            check_data_tokenizer(plan.weights.uri, source.uri, source.manifest)
        loaded = load_pretrained(trainer.model, plan.weights.uri, plan.architecture, plan.sequence_length)
        metrics.record_weights_load(loaded.seconds)


def _export(plan: Plan, trainer: Trainer, runtime: Runtime) -> None:
    """Write the trained weights where the plan asks (also after a restart at the last step: an export a
    crash interrupted is redone)."""
    if plan.output is None:
        return
    from .weights_export import export_model

    export_model(
        trainer.model,
        plan.architecture,
        plan.output.uri,
        sequence_length=plan.sequence_length,
        weights_uri=plan.weights.uri if plan.weights else None,
        is_writer=runtime.rank == 0,
    )


def _finite_step(
    trainer: Trainer, source: TokenSource, checkpoints: CheckpointManager, ledger: SampleLedger
) -> StepResult:
    """One step; a non-finite one stops the run, saying what a restart resumes from."""
    try:
        batches = []
        for _ in range(trainer.plan.chosen.gradient_accumulation_steps):
            batches.append(next_micro_batch(source))
            ledger.took(*source.position.last)
        result = trainer.step(batches)
        ledger.trained(trainer.step_index)
        return result
    except NonFiniteStep as err:  # raised on every rank alike, before any save of that step
        ledger.discard()
        kept = checkpoints.last_saved_step
        resume = f"a restart resumes from step {kept}" if kept is not None else "no checkpoint yet"
        raise err.explained(
            f"stopped before saving it; {resume}. If it recurs at this step, lower "
            "optimizer.learningRate (spec.training) or inspect the data it reads"
        ) from None


def next_micro_batch(source: TokenSource) -> MicroBatch:
    """The source's next micro-batch; packed chat rows come with their documents."""
    from .packed_data import ChatTokenSource

    if isinstance(source, ChatTokenSource):
        packed = source.next_packed()
        return packed.inputs, packed.labels, packed.documents
    return source.next_batch()


def main(argv: Sequence[str] | None = None, guard: PreemptionGuard | None = None) -> int:
    """CLI entry: parse, refuse a bad plan with one line (exit 2), else train.

    `guard`: the SIGTERM guard installed at process start; without one, main() installs its own.
    """
    own_guard = guard is None
    guard = guard or PreemptionGuard()
    try:
        return _main(argv, guard)
    finally:
        if own_guard:
            guard.restore()


def _main(argv: Sequence[str] | None, guard: PreemptionGuard) -> int:
    parser = argparse.ArgumentParser(prog="python -m blackwell_trainer", description=__doc__)
    parser.add_argument("--plan", default=os.environ.get(PLAN_ENV), help=f"plan JSON (default: ${PLAN_ENV})")
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    runtime = Runtime.from_env()
    try:
        plan = load_plan(args.plan)
        check_plan(plan, runtime, device_capability())
        validate_layout(plan.chosen, runtime.world_size, sequence_length=plan.sequence_length)
        Tuning.from_env()  # a bad BTJ_TRAINER_TUNING is refused before anything is built
    except (PlanError, PrecisionError, ParallelismError, TuningError) as err:
        return fail(err)
    earlier = earlier_result(read_message(), plan)
    if earlier is not None:  # torchrun restarted us in place with the plan that ran out: do not run it
        return fail(GpuOutOfMemory(earlier, earlier=True))
    from .checkpoint import CheckpointError
    from .cloud_errors import PermanentCloudError
    from .weights_store import WeightsError

    try:
        code = run(plan, runtime, guard)
        succeeded()
        return code
    except NonFiniteStep as err:
        return fail(err, code=EXIT_NON_FINITE)
    except GpuOutOfMemory as err:
        return fail(err)
    except (DataError, CheckpointError, WeightsError, PermanentCloudError, PlanError) as err:
        # Data or checkpoint storage that does not fit the plan (no shards, another data set than the
        # checkpoint's): one line that names the field, not a traceback per rank.
        return fail(err)

"""The Trainer: the model built and parallelized for the plan, its optimizer, and one optimizer step.

train.py's loop feeds it each step's micro-batches (data/'s one `Batch` shape) and adds data, checkpoints,
metrics and preemption around it; the probe builds one per candidate.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from blackwell_trainer.loop.finite_check import ParameterScan, check_parameters, reduce_loss_checked
from blackwell_trainer.loop.oom import PhaseTracker
from blackwell_trainer.loop.optimizer import build_optimizer, gradient_norm, set_lr
from blackwell_trainer.loop.step_report import StepResult
from blackwell_trainer.model.loss import IGNORE_INDEX
from blackwell_trainer.model.transformer import Attention, Transformer, build_model, flops_per_token
from blackwell_trainer.parallel.context_parallel import ContextParallel
from blackwell_trainer.parallel.parallelize import build_mesh, parallelize
from blackwell_trainer.parallel.precision import (
    PrecisionSetup,
    resolve_backend,
    te_available,
    torchao_available,
)
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import OomPhase, Plan, PrecisionRecipe
from blackwell_trainer.plan.tuning import GC_EVERY_STEPS, Tuning

if TYPE_CHECKING:
    from blackwell_trainer.data.tokens import Batch

log = logging.getLogger(__name__)


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
        self.plan, self.runtime = plan, runtime
        self.tuning = tuning if tuning is not None else Tuning.from_env()
        self.tracker = tracker or PhaseTracker()  # where a CUDA OOM happens, setup until the first step
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
        backend, recipe = resolve_backend(chosen, te=te_available(), torchao=torchao_available())
        # One rank with nothing to shard trains the plain module (parallelize.py): no FSDP2 copies.
        self.single_device = self.tuning.use_single_device(
            world_size=runtime.world_size, context_parallel=chosen.context_parallel, backend=backend
        )
        # Asked first, so that fp8_all_gather=on with another recipe is refused on every path.
        gathers_fp8 = self.tuning.gathers_fp8(
            shard_ranks=self.mesh.size(-1), tensorwise=recipe == PrecisionRecipe.TORCHAO_TENSORWISE
        )
        self.precision = self._parallelize(compute_dtype, gathers_fp8)
        self.optimizer = build_optimizer(self.model, plan, runtime.device)
        self._route_update()
        self.step_index = 0
        self.scan = ParameterScan()  # the run's loop names the steps whose state it writes
        self.flops_per_token = flops_per_token(plan.architecture, plan.sequence_length)
        # Tokens this rank processes: a context-parallel rank holds 1/cp of each sequence.
        self.tokens_per_micro_batch = (
            chosen.micro_batch_size * plan.sequence_length // chosen.context_parallel
        )

    def _parallelize(self, compute_dtype: torch.dtype | None, gathers_fp8: bool) -> PrecisionSetup:
        """parallelize.py's one fixed order, with this plan's layout and the tuning's switches."""
        plan, runtime, chosen = self.plan, self.runtime, self.plan.chosen
        blocked = self.tuning.bf16_gradients_blocked(
            single_device=self.single_device,
            accumulation=chosen.gradient_accumulation_steps,
            clip=plan.optimizer.grad_clip_norm,
        )
        if self.tuning.bf16_gradients and blocked:
            log.warning("bf16_gradients off: %s; the gradients stay fp32", blocked)
        return parallelize(
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
            fp8_skip_small=self.tuning.fp8_skip_small,
            fp8_all_gather=gathers_fp8 and not self.single_device,
            fuse_projections=self.tuning.fuse_projections,
            recast_blocks=self.tuning.recast_blocks,
            bf16_gradients=self.tuning.bf16_gradients and blocked is None,
            fp32_weight_gradients=self.tuning.fp32_weight_gradients,
            attention=self.tuning.attention,
        )

    def step(self, batches: Sequence[Batch]) -> StepResult:
        """One optimizer step over ``len(batches)`` micro-batches (gradient accumulation)."""
        started = time.perf_counter()
        step = self.step_index + 1
        self._collect_garbage(step)
        compiling = self.plan.chosen.compile and not self._stepped
        set_lr(self.optimizer, self.step_index, self.plan)
        accum = len(batches)
        loss_sum = self._forward_backward(batches, step, compiling)
        self.tracker.mark(OomPhase.OPTIMIZER, step, compiling=compiling)
        self._stepped = True
        foreach = self.runtime.device.type == "cuda"
        grad_norm = self._optimizer_step(foreach)
        self.step_index += 1
        scan = self.scan.due(self.step_index, every_step=self.tuning.parameter_check)
        loss_value = reduce_loss_checked(
            self.step_index, loss_sum, accum, grad_norm, self.model if scan else None, foreach=foreach
        )
        self.scan.last_loss = loss_value
        seconds = time.perf_counter() - started
        tokens = self.tokens_per_micro_batch * accum
        mfu = (
            self.flops_per_token * tokens / seconds / self.plan.gpu.peak_bf16_flops
            if self.plan.gpu.peak_bf16_flops
            else 0.0
        )
        return StepResult(loss=loss_value, seconds=seconds, tokens=tokens, mfu=mfu)

    def check_parameters(self) -> None:
        """Before the state of the newest step is written (CheckpointManager's `before_save`): where that
        step did not read its parameters (a save at preemption), NonFiniteStep on every rank if one is
        not finite (collective)."""
        if self.scan.due(self.step_index, every_step=self.tuning.parameter_check):
            return  # read by the step itself, in its all-reduce
        foreach = self.runtime.device.type == "cuda"
        check_parameters(self.step_index, self.scan.last_loss, self.model, foreach=foreach)

    def _collect_garbage(self, step: int) -> None:
        """tuning.manual_gc: the cyclic collector off, a young-generation pass every GC_EVERY_STEPS steps,
        at the step's start (before any kernel of it is queued); Python's own schedule otherwise."""
        if not self.tuning.manual_gc:
            return
        if gc.isenabled():
            gc.disable()
        if step % GC_EVERY_STEPS == 0:
            gc.collect(1)

    def _forward_backward(self, batches: Sequence[Batch], step: int, compiling: bool) -> torch.Tensor:
        """Forward and backward of each micro-batch; the sum of their (detached) losses.

        The one place a `Batch` is taken apart: its tokens, labels and (packed chat rows) documents.
        """
        accum, tracker = len(batches), self.tracker
        loss_sum = torch.zeros((), device=self.runtime.device)
        weights = self._trained_token_weights(batches)
        for index, batch in enumerate(batches):
            inputs, labels, documents = batch.inputs, batch.labels, batch.documents
            if documents is not None:
                documents = documents.to(self.runtime.device, non_blocking=True)
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
            if self.tuning.compile_mode == "reduce-overhead":
                # CUDA graphs replay into static buffers: say where an iteration starts, so a replay
                # never overwrites outputs (the loss, saved activations) the previous one still holds.
                torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
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

    def _trained_token_weights(self, batches: Sequence[Batch]) -> list[torch.Tensor] | None:
        """For packed chat rows, each micro-batch's share of the step's trained tokens, on every rank.

        A micro-batch's loss is the mean over its own trained (unmasked) tokens, and chat rows hold
        different numbers of them. Weighting each mean by n_mb * ranks * accum / N (N: the trained tokens of
        the whole global batch) makes the step's loss the mean over all N tokens, whatever the ranks and the
        micro-batch / accumulation split: FSDP averages gradients over the ranks, the loop over `accum`.
        Plain token data (every label trained on) keeps its unweighted means, bit for bit.
        """
        if not batches or batches[0].documents is None:
            return None
        counts = torch.stack([(b.labels != IGNORE_INDEX).sum() for b in batches]).to(self.runtime.device)
        total = counts.sum().to(torch.float64)
        ranks = 1
        if dist.is_initialized():
            dist.all_reduce(total)
            ranks = dist.get_world_size()
        scale = ranks * len(batches) / total.clamp(min=1.0)
        return [(n * scale).to(torch.float32) for n in counts]

    def _route_update(self) -> None:
        """The compiled update over whole-tensor gradients, or torch's kernel (tuning.py's compiled_update).

        Read again every step: both keep torch's state, so a run (the in-process A/B windows of
        benchmarks/trainer_h200.py) may switch between them; FSDP2's shards always keep torch's kernel.
        """
        self.optimizer.compile_all = self.tuning.compiled_update and self.single_device
        self.optimizer.batch_all = self.tuning.batched_update

    def _optimizer_step(self, foreach: bool) -> torch.Tensor:
        """Clip (or only measure) the gradient norm, step and zero the gradients; the norm before clipping."""
        self._route_update()
        clip = self.plan.optimizer.grad_clip_norm
        # bf16 gradients are always clipped inside the step (a foreach clip would scale them in bf16).
        in_kernel = self.optimizer.takes_grad_scale or self.model.cast_blocks
        in_step = clip > 0 and self.tuning.clip_in_optimizer and in_kernel
        if clip > 0 and not in_step:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip, foreach=foreach)
        else:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            grad_norm = gradient_norm(grads, foreach=foreach)
        # clip_grad_norm_'s coefficient, applied inside the fused kernel (it divides by grad_scale)
        # instead of a separate multiply over every gradient; 1 (exactly) when nothing is clipped. Reset
        # to None otherwise: a scale left from an earlier step would divide already clipped gradients.
        coef = (clip / (grad_norm.float() + 1e-6)).clamp(max=1.0) if in_step else None
        self.optimizer.grad_scale = None if coef is None else 1.0 / coef
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.after_optimizer_step(self.model)
        return grad_norm

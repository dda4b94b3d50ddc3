"""The training entry point: read the plan, refuse what cannot run, build, parallelize and train.

``python -m blackwell_trainer --plan PATH`` (or env BTJ_PLAN_PATH), usually under torchrun.
Exit codes: 0 done or preempted after a checkpoint, 2 a bad or impossible plan, data, initial weights or
checkpoint storage that does not fit it, an export of the trained weights that cannot be written, a
checkpoint that cannot be written (the final one, the preemption one, or MAX_FAILED_SAVES_IN_A_ROW
interval saves in a row) or none that verifies and loads, or a plan that ran out of GPU memory (with an
OOM result line, oom.py), 3 a step whose loss, gradient norm or
parameters are not finite (nothing of it is saved).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
from pydantic import ValidationError
from torch import nn

from .config import PERMANENT_ERROR_PREFIX, OomPhase, Plan
from .context_parallel import ContextParallel, data_parallel_rank
from .model import Attention, Transformer, build_model, flops_per_token
from .oom import GpuOutOfMemory, PhaseTracker, earlier_result, oom_result
from .parallelize import ParallelismError, build_mesh, parallelize, validate_layout
from .precision import PrecisionError, PrecisionSetup, check_precision, device_capability, parse_capability
from .preemption import PreemptionGuard
from .units import GIB

if TYPE_CHECKING:  # imported where run() needs them, not at start-up
    from .checkpoint import Checkpointer
    from .data import TokenSource
    from .metrics import TrainerMetrics
    from .sample_ledger import SampleLedger

log = logging.getLogger("blackwell_trainer")
PLAN_ENV = "BTJ_PLAN_PATH"
EXIT_NON_FINITE = 3


class PlanError(ValueError):
    """A plan this job cannot execute; the message is one line naming the field and the fix."""


def _validation_line(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "plan"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{loc}: {first['msg']}{more}"


def load_plan(path: str | None) -> Plan:
    """Read and validate the plan file; PlanError with one line on any problem."""
    if not path:
        raise PlanError(f"no plan given: pass --plan PATH or set {PLAN_ENV}")
    try:
        return Plan.from_file(path)
    except FileNotFoundError:
        raise PlanError(f"plan file not found: {path}; mount the plan ConfigMap or pass --plan") from None
    except ValidationError as err:
        raise PlanError(f"invalid plan {path}: {_validation_line(err)}") from None


@dataclass(frozen=True)
class Runtime:
    """Where this process sits in the job (from torchrun's environment) and what hardware it has."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device

    @classmethod
    def from_env(cls) -> Runtime:
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        return cls(rank, local_rank, world, local_world, device)


def check_plan(plan: Plan, runtime: Runtime, capability: tuple[int, int] | None) -> None:
    """Refuse a plan the job or the hardware cannot run, before any GPU memory is touched."""
    if plan.world_size != runtime.world_size:
        raise PlanError(
            f"plan is for {plan.world_size} processes (nodes {plan.nodes} x gpusPerNode {plan.gpus_per_node})"
            " "
            f"but this job started {runtime.world_size}; re-plan or fix --nproc-per-node / nnodes"
        )
    if plan.parameter_count != plan.architecture.parameter_count():
        raise PlanError(
            f"parameterCount {plan.parameter_count} does not match the architecture's "
            f"{plan.architecture.parameter_count()}; re-plan"
        )
    # First against the GPU the plan was made for (pure), then against the GPU actually present.
    check_precision(
        plan.chosen, parse_capability(plan.gpu.compute_capability), where=f"plan GPU {plan.gpu.name}"
    )
    where = torch.cuda.get_device_name(runtime.device) if runtime.device.type == "cuda" else "this machine"
    if runtime.device.type == "cuda" or plan.chosen.precision.value != "bf16":
        check_precision(plan.chosen, capability, where=where)
    if capability is not None and capability < parse_capability(plan.gpu.compute_capability):
        raise PlanError(
            f"plan is for {plan.gpu.name} (compute capability {plan.gpu.compute_capability}) but this pod"
            " has "
            f"{where} ({capability[0]}.{capability[1]}); re-plan for this instance type"
        )


def lr_at(step: int, plan: Plan) -> float:
    """Linear warm-up to the peak, then cosine decay to min_learning_rate_ratio x peak at the last step."""
    opt = plan.optimizer
    peak = opt.learning_rate
    if opt.warmup_steps > 0 and step < opt.warmup_steps:
        return peak * (step + 1) / opt.warmup_steps
    span = max(plan.steps - opt.warmup_steps, 1)
    progress = min(max(step - opt.warmup_steps, 0) / span, 1.0)
    floor = peak * opt.min_learning_rate_ratio
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, plan: Plan, device: torch.device) -> torch.optim.AdamW:
    """AdamW; decay on matrices only (norm scales and biases are not decayed); fused kernels on CUDA."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = plan.optimizer
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr_at(0, plan),
        betas=(opt.beta1, opt.beta2),
        eps=opt.eps,
        fused=device.type == "cuda",
    )


def free_port() -> int:
    """A TCP port nothing listens on now, for a lone process's rendezvous (or a launcher's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(runtime: Runtime) -> None:
    """One process group for the job: NCCL on GPUs, gloo on CPU. A lone process gets a world of one."""
    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    if runtime.device.type == "cuda":
        torch.cuda.set_device(runtime.device)
        dist.init_process_group("nccl", device_id=runtime.device)
    else:
        dist.init_process_group("gloo")


class NonFiniteStep(RuntimeError):
    """A step whose loss, gradient norm or parameters are not finite; raised on every rank alike.

    Not a permanent error: a restart resumes from the newest checkpoint, which was followed by finite
    steps. A non-finite value from a faulty GPU or link (silent data corruption) or from a kernel that
    is not deterministic is gone after it; one that recurs at the same step (a loss spike the learning
    rate cannot take) recurs only until the pods' restart budget is spent, one interval each time.
    """

    KINDS = ("the loss is", "the gradient norm is", "the parameters after the optimizer step are")

    def __init__(self, step: int, loss: float, ranks: list[list[int]]) -> None:
        self.step, self.loss, self.ranks = step, loss, ranks
        # Name the first non-finite value in the order they arise: loss, then gradients, then weights.
        kind, where = next(((k, r) for k, r in zip(self.KINDS, ranks, strict=True) if r), (self.KINDS[0], []))
        shown = ", ".join(str(r) for r in where[:8])
        shown += f" and {len(where) - 8} more" if len(where) > 8 else ""
        on = f" on rank{'s' if len(where) > 1 else ''} {shown}" if where else ""
        super().__init__(f"step {step}: {kind} not finite{on} (loss {loss:g})")

    def explained(self, detail: str) -> NonFiniteStep:
        """The same stop with what it means for the checkpoints and what to do, on the same line."""
        self.args = (f"{self.args[0]}; {detail}",)
        return self


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 parameters, gradient norms), or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _ranks_with(flags: torch.Tensor, world: int) -> list[list[int]]:
    """For each flag, the ranks where it is set (collective: only called when some rank has one set)."""
    gathered = [torch.zeros_like(flags) for _ in range(world)]
    if world > 1:
        dist.all_gather(gathered, flags)
    else:
        gathered = [flags]
    rows = [row.tolist() for row in gathered]
    return [[r for r in range(world) if rows[r][k]] for k in range(flags.numel())]


@dataclass
class StepResult:
    """What one optimizer step did on this rank."""

    loss: float
    seconds: float
    tokens: int  # tokens this rank processed
    mfu: float


class Trainer:
    """Model, optimizer and one ``step()``; ``run()`` adds data, checkpoints, metrics and preemption."""

    def __init__(self, plan: Plan, runtime: Runtime, tracker: PhaseTracker | None = None) -> None:
        self.plan = plan
        self.runtime = runtime
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
        self.precision: PrecisionSetup = parallelize(
            self.model,
            chosen,
            self.mesh,
            device=runtime.device,
            amax_group=dist.group.WORLD if dist.is_initialized() else None,
            seed=plan.dataset.seed,
            gpu_memory_bytes=plan.gpu.memory_bytes or None,
        )
        self.optimizer = build_optimizer(self.model, plan, runtime.device)
        self.step_index = 0
        self.flops_per_token = flops_per_token(plan.architecture, plan.sequence_length)
        # Tokens this rank processes: a context-parallel rank holds 1/cp of each sequence.
        self.tokens_per_micro_batch = (
            chosen.micro_batch_size * plan.sequence_length // chosen.context_parallel
        )

    def step(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> StepResult:
        """One optimizer step over ``len(batches)`` micro-batches (gradient accumulation)."""
        started = time.perf_counter()
        step, tracker = self.step_index + 1, self.tracker
        compiling = self.plan.chosen.compile and not self._stepped
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step_index, self.plan)
        accum = len(batches)
        loss_sum = torch.zeros((), device=self.runtime.device)
        for inputs, labels in batches:
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
                loss = self.model(inputs, labels, positions)
            if self.cp is not None:
                loss = loss * part.loss_weight
            tracker.mark(OomPhase.BACKWARD, step, compiling=compiling)
            (loss / accum).backward()
            loss_sum += loss.detach()
        tracker.mark(OomPhase.OPTIMIZER, step, compiling=compiling)
        self._stepped = True
        foreach = self.runtime.device.type == "cuda"
        clip = self.plan.optimizer.grad_clip_norm
        if clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip, foreach=foreach)
        else:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads, foreach=foreach)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.after_optimizer_step(self.model)
        self.step_index += 1
        # This rank's view of the step, reduced together in one all-reduce: its loss and whether its
        # loss, its share of the gradient norm and its parameter shards are finite. The largest
        # parameter magnitude is non-finite iff one parameter is: what a checkpoint of this step
        # would hold is checked before any save of it (one read of the local shards).
        params = [_local(p.detach()) for p in self.model.parameters()]
        largest = torch.nn.utils.get_total_norm(params, norm_type=math.inf, foreach=foreach)
        local = torch.stack(
            [
                loss_sum / accum,
                (~torch.isfinite(loss_sum)).float(),
                (~torch.isfinite(_local(grad_norm.detach()))).float(),
                (~torch.isfinite(largest)).float(),
            ]
        )
        reduced = local.clone()
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world > 1:
            dist.all_reduce(reduced, op=dist.ReduceOp.SUM)  # gloo has no AVG: sum, then divide
        loss_value, *bad = reduced.tolist()  # synchronises: the step's time below is real
        loss_value /= world
        if any(bad) or not math.isfinite(loss_value):
            raise NonFiniteStep(self.step_index, loss_value, _ranks_with(local[1:], world))
        seconds = time.perf_counter() - started
        tokens = self.tokens_per_micro_batch * accum
        mfu = (
            self.flops_per_token * tokens / seconds / self.plan.gpu.peak_bf16_flops
            if self.plan.gpu.peak_bf16_flops
            else 0.0
        )
        return StepResult(loss=loss_value, seconds=seconds, tokens=tokens, mfu=mfu)


class AllocatorStats(NamedTuple):
    """What the CUDA caching allocator reports since start (zeros off CUDA)."""

    peak_allocated: int
    peak_reserved: int
    # Frees-and-retries because the GPU was full: the run reached the GPU's capacity.
    retries: int


def allocator_stats(device: torch.device) -> AllocatorStats:
    """Peaks and retries from one memory_stats() read (max_memory_allocated and co. each read it again)."""
    if device.type != "cuda":
        return AllocatorStats(0, 0, 0)
    stats = torch.cuda.memory_stats(device)
    return AllocatorStats(
        int(stats.get("allocated_bytes.all.peak", 0)),
        int(stats.get("reserved_bytes.all.peak", 0)),
        int(stats.get("num_alloc_retries", 0)),
    )


def warn_at_capacity(retries: int, warned: int, step: int) -> int:
    """Log (once per new burst) that the GPU was full; returns the count already warned about."""
    if retries > warned:
        # Measured on H200 (docs/calibration/README.md): runs at the cap lost up to 36% of their speed.
        log.warning(
            "step %d: the GPU was full %d time(s) so far (the CUDA caching allocator freed its cache and "
            "retried); steps at the GPU's capacity run slowly. Re-plan with a smaller micro-batch or a "
            "larger spec.tuning.memoryHeadroom.",
            step,
            retries,
        )
        return retries
    return warned


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
    from .checkpoint import Checkpointer, SavePolicy
    from .sample_ledger import SampleLedger

    checkpointer = Checkpointer(plan.checkpoint, rank=runtime.rank)
    ledger = SampleLedger.from_env(runtime.rank)
    _resume_or_start(plan, trainer, source, checkpointer, metrics)
    policy = SavePolicy(checkpointer, steps=plan.steps, recorder=metrics)
    report = StepReport(plan, runtime, metrics)
    started_at = trainer.step_index
    metrics.step.set(started_at)  # a resumed job's progress shows before its first new step

    def extra() -> dict[str, Any]:
        return {"step": trainer.step_index, "data": source.state_dict()}

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
            policy.at_preemption(trainer.step_index, started_at, trainer.model, trainer.optimizer, extra)
            return 0
        result = _finite_step(trainer, source, checkpointer, ledger)
        checkpointer.confirm_finite(trainer.step_index)  # the checkpoint before it is known good
        report.step(trainer.step_index, result, lr=trainer.optimizer.param_groups[0]["lr"])
        policy.after_step(trainer.step_index, trainer.model, trainer.optimizer, extra)


def _token_source(plan: Plan, runtime: Runtime) -> TokenSource:
    from .data import DataLayout, build_token_source

    # Context-parallel peers (consecutive ranks) read the same samples: index the data by dp rank.
    dp_rank, dp_world = data_parallel_rank(runtime.rank, runtime.world_size, plan.chosen.context_parallel)
    chosen = plan.chosen
    layout = DataLayout(
        micro_batch_size=chosen.micro_batch_size,
        sequence_length=plan.sequence_length,
        vocab_size=plan.architecture.vocab_size,
        rank=dp_rank,
        world_size=dp_world,
        # The global batch: what a resume on another layout must keep (data.check_resume).
        samples_per_step=dp_world * chosen.micro_batch_size * chosen.gradient_accumulation_steps,
    )
    return build_token_source(plan.dataset, layout)


def _resume_or_start(
    plan: Plan, trainer: Trainer, source: TokenSource, checkpointer: Checkpointer, metrics: TrainerMetrics
) -> None:
    """The newest good checkpoint of this job (collective), else the plan's initial weights, if any."""
    extra = checkpointer.load(
        trainer.model, trainer.optimizer, on_skip=lambda path, reason: metrics.record_checkpoint_skipped()
    )
    if extra is not None:
        from .data import check_resume

        trainer.step_index = int(extra["step"])
        source.load_state_dict(extra["data"])
        log.info(check_resume(extra["data"], trainer.step_index, source))
    elif plan.weights is not None:  # the job's own checkpoint wins; the initial weights start it
        from .data import ShardTokenSource
        from .weights_load import check_data_tokenizer, load_pretrained

        # Before the (long) load: shards of another tokenizer would train the model on the wrong ids.
        if isinstance(source, ShardTokenSource):  # synthetic tokens belong to no tokenizer
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
    trainer: Trainer, source: TokenSource, checkpointer: Checkpointer, ledger: SampleLedger
) -> StepResult:
    """One step; a non-finite one stops the run, saying what a restart resumes from."""
    try:
        batches = []
        for _ in range(trainer.plan.chosen.gradient_accumulation_steps):
            batches.append(source.next_batch())
            ledger.took(*source.position.last)
        result = trainer.step(batches)
        ledger.trained(trainer.step_index)
        return result
    except NonFiniteStep as err:  # raised on every rank alike, before any save of that step
        ledger.discard()
        kept = checkpointer.last_saved_step
        resume = f"a restart resumes from step {kept}" if kept is not None else "no checkpoint yet"
        raise err.explained(
            f"stopped before saving it; {resume}. If it recurs at this step, lower "
            "optimizer.learningRate (spec.training) or inspect the data it reads"
        ) from None


class StepReport:
    """Each step's metrics, rank 0's line every plan.logEverySteps, and a warning when the GPU was full."""

    def __init__(self, plan: Plan, runtime: Runtime, metrics: TrainerMetrics) -> None:
        self.plan, self.runtime, self.metrics = plan, runtime, metrics
        self.retries_warned = 0

    def step(self, step: int, result: StepResult, *, lr: float) -> None:
        allocated, reserved, retries = allocator_stats(self.runtime.device)
        self.metrics.record_step(
            tokens=result.tokens,
            step_seconds=result.seconds,
            loss=result.loss,
            mfu=result.mfu,
            peak_allocated_bytes=allocated,
            peak_reserved_bytes=reserved,
            alloc_retries=retries,
            step=step,
        )
        if self.runtime.rank != 0:
            return
        self.retries_warned = warn_at_capacity(retries, self.retries_warned, step)
        if step % self.plan.log_every_steps == 0 or step == self.plan.steps:
            log.info(
                "step %d/%d loss %.4f lr %.3g tokens/s/gpu %.0f mfu %.1f%% step %.3fs "
                "peak allocated %.1f GiB reserved %.1f GiB",
                step,
                self.plan.steps,
                result.loss,
                lr,
                result.tokens / result.seconds,
                100 * result.mfu,
                result.seconds,
                allocated / GIB,
                reserved / GIB,
            )


# Kubernetes copies this file into the pod's status when the container ends (lastState.terminated.message);
# the rendered pod falls back to the log's tail when it is empty.
TERMINATION_LOG_ENV = "BTJ_TERMINATION_LOG"
TERMINATION_LOG = "/dev/termination-log"


def _fail(err: BaseException, code: int = 2) -> int:
    """One line on stderr and in the pod's termination message; returns `code` (2: plan or storage).

    The termination message says whether a restart can help: storage that failed to take saves may
    recover, and a non-finite step resumes from the last good checkpoint (both start `error: `); a
    plan, data or checkpoint that does not fit cannot (it starts PERMANENT_ERROR_PREFIX, and the
    operator stops the job instead of retrying it). A plan that ran out of GPU memory adds its OOM
    result as a second line (config.OOM_RESULT_MARKER), which the operator re-plans from.
    """
    from .checkpoint import StorageFailed

    line = f"error: {err}"
    print(line, file=sys.stderr)
    retryable = isinstance(err, StorageFailed | NonFiniteStep)
    message = line if retryable else f"{PERMANENT_ERROR_PREFIX}{err}"
    if isinstance(err, GpuOutOfMemory):
        # On stderr too: the pod falls back to the log's tail when the termination file stays empty.
        result_line = err.result.to_line()
        print(result_line, file=sys.stderr)
        # The first line is cut to fit the kubelet's 4096 bytes beside the result line, never the result.
        message = f"{message[: 4000 - len(result_line)]}\n{result_line}"
    _write_termination_message(message[:4000] + "\n")  # the kubelet keeps at most 4096 bytes
    return code


def _termination_message() -> str:
    """What an earlier start in this container wrote to the termination file ("" when none)."""
    try:
        with open(os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG)) as log:
            return log.read(8192)
    except OSError:
        return ""


def _write_termination_message(text: str) -> None:
    """Replace the pod's termination message; ranks that fail together write one after another (flock),
    so the file holds one whole message, not an interleaving of several."""
    path = os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG)
    # Outside a pod the file does not exist (or is not ours to create): the stderr line is enough.
    if not (os.path.exists(path) or TERMINATION_LOG_ENV in os.environ):
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.write(fd, text.encode())
        finally:
            os.close(fd)  # releases the lock


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
    except (PlanError, PrecisionError, ParallelismError) as err:
        return _fail(err)
    earlier = earlier_result(_termination_message(), plan)
    if earlier is not None:  # torchrun restarted us in place with the plan that ran out: do not run it
        return _fail(GpuOutOfMemory(earlier, earlier=True))
    from .checkpoint import CheckpointError
    from .data import DataError
    from .weights_store import WeightsError

    try:
        return run(plan, runtime, guard)
    except NonFiniteStep as err:
        return _fail(err, code=EXIT_NON_FINITE)
    except GpuOutOfMemory as err:
        return _fail(err)
    except (DataError, CheckpointError, WeightsError) as err:
        # Data or checkpoint storage that does not fit the plan (no shards, another data set than the
        # checkpoint's): one line that names the field, not a traceback per rank.
        return _fail(err)

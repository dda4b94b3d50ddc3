"""The training entry point and loop: read the plan, refuse what cannot run, build, resume and train.

``python -m blackwell_trainer --plan PATH`` (or env BTJ_PLAN_PATH), usually under torchrun.
Exit codes: 0 done or preempted after a checkpoint, 2 a bad or impossible plan, data, initial weights or
checkpoint storage that does not fit it, an export of the trained weights that cannot be written, a
checkpoint that cannot be written (the final one, the preemption one, or MAX_FAILED_SAVES_IN_A_ROW
interval saves in a row) or none that verifies and loads, or a plan that ran out of GPU memory (with an
OOM result line, loop/oom.py), 3 a step whose loss, gradient norm or parameters are not finite (nothing of
it is saved).

The loop's components live in loop/, one per module: trainer (the model, its optimizer and one step),
plan_check, optimizer (AdamW and the LR schedule), finite_check, step_report, termination (the pod's
termination message); checkpoint/manager (what a checkpoint holds and when it is saved), parallel/runtime
(rank, device, process group), data/sources (the one way the data opens) and errors beside them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from blackwell_trainer.errors import DataError, NonFiniteStep, PlanError
from blackwell_trainer.loop.oom import GpuOutOfMemory, PhaseTracker, earlier_result, oom_result
from blackwell_trainer.loop.plan_check import check_plan, check_tuning, job_identity, load_plan
from blackwell_trainer.loop.preemption import PreemptionGuard
from blackwell_trainer.loop.step_report import StepReport, StepResult
from blackwell_trainer.loop.termination import fail, read_message, remember_probe, succeeded
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.parallel.context_parallel import data_parallel_rank
from blackwell_trainer.parallel.parallelize import ParallelismError, validate_layout
from blackwell_trainer.parallel.precision import PrecisionError, device_capability
from blackwell_trainer.parallel.runtime import Runtime, init_distributed
from blackwell_trainer.plan.config import JobIdentity, Plan
from blackwell_trainer.plan.env_vars import PLAN_PATH_ENV as PLAN_ENV
from blackwell_trainer.plan.tuning import Tuning, TuningError

if TYPE_CHECKING:  # imported where run() needs them, not at start-up
    from blackwell_trainer.checkpoint.manager import CheckpointManager
    from blackwell_trainer.checkpoint.owner import Owner
    from blackwell_trainer.data.tokens import TokenSource
    from blackwell_trainer.loop.metrics import TrainerMetrics
    from blackwell_trainer.loop.sample_ledger import SampleLedger

log = logging.getLogger("blackwell_trainer")
EXIT_NON_FINITE = 3


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
        from blackwell_trainer.data.tokens import check_resume

        self.trainer.step_index = int(state_dict["step"])
        self.source.load_state_dict(state_dict["data"])
        # A resize resumes on another layout: the position and global batch must still be the plan's.
        self.resumed = check_resume(state_dict["data"], self.trainer.step_index, self.source)


def run(plan: Plan, runtime: Runtime, guard: PreemptionGuard, identity: JobIdentity | None = None) -> int:
    """Train to plan.steps, resuming from the latest complete checkpoint; 0 on completion or preemption.

    `guard` is the SIGTERM guard main() holds (``python -m blackwell_trainer`` installs it before torch is
    imported); main() also restores it. `identity`: the job it trains for (job.json beside the plan; by
    default the plan's jobName), recorded in its checkpoints.
    """
    from blackwell_trainer.loop.metrics import TrainerMetrics

    init_distributed(runtime)
    metrics = TrainerMetrics(plan)
    tracker = PhaseTracker()
    try:
        if runtime.local_rank == 0:
            metrics.serve(plan.metrics_port)
        plan = _probed(plan, runtime, metrics)
        return _train(plan, runtime, guard, metrics, tracker, identity or JobIdentity(name=plan.job_name))
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
    from blackwell_trainer import probe

    if plan.probe is None or not plan.probe.enabled:
        return plan
    earlier = probe.earlier_choice(plan, read_message())
    if earlier is not None:
        log.info("probe: training with candidate %d, the choice of an earlier start", earlier.winner)
        metrics.record_probe(plan, earlier)
        remember_probe(earlier)
        return probe.plan_for(plan, earlier.winner)
    from blackwell_trainer.checkpoint.store import list_complete

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
    plan: Plan,
    runtime: Runtime,
    guard: PreemptionGuard,
    metrics: TrainerMetrics,
    tracker: PhaseTracker,
    identity: JobIdentity,
) -> int:
    """run()'s body: build, then train (_loop); the data source is closed however it ends."""
    from blackwell_trainer.checkpoint.owner import Owner, data_fingerprint, model_fingerprint

    trainer = Trainer(plan, runtime, tracker)
    source = _token_source(plan, runtime)
    owner = Owner(
        job=identity,
        model=model_fingerprint(plan.architecture),
        data=data_fingerprint(source.state_dict()),
        global_batch_tokens=plan.global_batch_tokens,
    )
    try:
        return _loop(plan, runtime, guard, metrics, trainer, source, owner)
    finally:
        source.close()  # its background fetch is joined before run() destroys the process group


def _loop(
    plan: Plan,
    runtime: Runtime,
    guard: PreemptionGuard,
    metrics: TrainerMetrics,
    trainer: Trainer,
    source: TokenSource,
    owner: Owner,
) -> int:
    """Resume, then step until done or preempted; 0 either way."""
    from blackwell_trainer.checkpoint.manager import CheckpointManager
    from blackwell_trainer.loop.sample_ledger import SampleLedger

    state = LoopState(trainer, source)
    checkpoints = CheckpointManager(
        plan.checkpoint,
        rank=runtime.rank,
        model=trainer.model,
        optimizer=trainer.optimizer,
        state=state,
        steps=plan.steps,
        recorder=metrics,
        owner=owner,
        before_save=trainer.check_parameters,
    )
    ledger = SampleLedger.from_env(runtime.rank)
    trainer.scan.kept_at = checkpoints.keeps_state_at  # never a state written unscanned
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
            try:  # a step that did not read its parameters has them read before the save
                checkpoints.at_preemption(trainer.step_index, started_at)
            except NonFiniteStep as err:
                raise _explained(err, checkpoints) from None
            return 0
        result = _finite_step(trainer, source, checkpoints, ledger)
        checkpoints.confirm_finite(trainer.step_index)  # the checkpoint before it is known good
        report.step(trainer.step_index, result, lr=trainer.optimizer.param_groups[0]["lr"])
        checkpoints.after_step(trainer.step_index)


def _token_source(plan: Plan, runtime: Runtime) -> TokenSource:
    from blackwell_trainer.data.sources import open_token_source
    from blackwell_trainer.data.tokens import DataLayout

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
    return open_token_source(plan.dataset, layout)


def _resume_or_start(
    plan: Plan, state: LoopState, checkpoints: CheckpointManager, metrics: TrainerMetrics
) -> None:
    """The newest good checkpoint of this job (collective), else the weights of checkpoint.startFrom or the
    plan's initial weights, if any: the job's own checkpoint wins, the others start it at step 0."""
    trainer, source = state.trainer, state.source
    if checkpoints.resume():
        log.info(state.resumed)
        return
    if plan.weights is not None:
        from blackwell_trainer.weights.load import check_data_tokenizer

        # Before the (long) load: shards of another tokenizer would train the model on the wrong ids.
        if source.uri is not None:  # synthetic tokens have no tokenizer
            check_data_tokenizer(plan.weights.uri, source.uri, source.manifest)
    if plan.checkpoint.start_from:  # the weights another job trained (spec.model.weights then names the
        checkpoints.start_from()  # tokenizer and config.json the export copies)
    elif plan.weights is not None:
        from blackwell_trainer.weights.load import load_pretrained

        loaded = load_pretrained(trainer.model, plan.weights.uri, plan.architecture, plan.sequence_length)
        metrics.record_weights_load(loaded.seconds)


def _export(plan: Plan, trainer: Trainer, runtime: Runtime) -> None:
    """Write the trained weights where the plan asks (also after a restart at the last step: an export a
    crash interrupted is redone)."""
    if plan.output is None:
        return
    from blackwell_trainer.weights.export import export_model

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
            batches.append(source.next_batch())
            ledger.took(*source.position.last)
        result = trainer.step(batches)
        ledger.trained(trainer.step_index)
        return result
    except NonFiniteStep as err:  # raised on every rank alike, before any save of that step
        ledger.discard()
        raise _explained(err, checkpoints) from None


def _explained(err: NonFiniteStep, checkpoints: CheckpointManager) -> NonFiniteStep:
    """The non-finite stop with what a restart resumes from and what to do."""
    kept = checkpoints.last_saved_step
    # The first step after resuming a checkpoint without checksums: it may be damaged, so it is skipped.
    resume = checkpoints.mark_suspect(err.step) or (
        f"a restart resumes from step {kept}" if kept is not None else "no checkpoint yet"
    )
    return err.explained(
        f"stopped before saving it; {resume}. If it recurs at this step, lower "
        "optimizer.learningRate (spec.training) or inspect the data it reads"
    )


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
        identity = job_identity(args.plan, plan)
        check_plan(plan, runtime, device_capability())
        validate_layout(plan.chosen, runtime.world_size, sequence_length=plan.sequence_length)
        check_tuning(plan, Tuning.from_env())  # a bad BTJ_TRAINER_TUNING is refused before anything is built
    except (PlanError, PrecisionError, ParallelismError, TuningError) as err:
        return fail(err)
    earlier = earlier_result(read_message(), plan)
    if earlier is not None:  # torchrun restarted us in place with the plan that ran out: do not run it
        return fail(GpuOutOfMemory(earlier, earlier=True))
    from blackwell_trainer.checkpoint.store import CheckpointError
    from blackwell_trainer.cloud_errors import PermanentCloudError
    from blackwell_trainer.weights.store import WeightsError

    try:
        code = run(plan, runtime, guard, identity)
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

"""The probe: time the plan's top candidates on the job's own GPUs and data, then train with the fastest.

Every rank times every candidate, and the ranks agree on one figure each (the tokens/s the slowest rank
saw, the peak reserved memory the fullest rank saw), so they choose the same winner. Each candidate is
built, warmed up, timed and freed (model, optimizer, compiled graphs, the allocator's cache) before the
next; the run itself is built afterwards from scratch, so the probe leaves no trace in its weights,
optimizer, data position or loss curve. docs/probe.md has the design and the policy.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from .config import Plan, ProbeMeasurement, ProbeOutcome, ProbePlan, ProbeResult
from .step_report import StepResult

log = logging.getLogger("blackwell_trainer.probe")
# Where a checkpointing job keeps its probe's choice (beside its step folders): a restart trains with it.
PROBE_FILE = "probe.json"
# Added to the budget for the probe's own agreement collectives: a rank that is this late is stuck.
COLLECTIVE_GRACE_SECONDS = 300.0


class ProbeError(RuntimeError):
    """The probe could not finish on every rank (an agreement collective timed out or failed)."""


class Steppable(Protocol):
    """What the probe needs of a built candidate: one optimizer step over a step's micro-batches."""

    def step(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> StepResult: ...


class Batches(Protocol):
    """What the probe needs of a token source: the next micro-batch, and closing it."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def close(self) -> None: ...


class Timing(Protocol):
    """The probe's clock: wall time since it started, and the seconds a candidate's timed steps take."""

    def elapsed(self) -> float: ...

    def measure(self, index: int, run: Callable[[], None]) -> float: ...


class WallTiming:
    """The real clock (the GPU's queue drained before and after the timed steps)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def measure(self, index: int, run: Callable[[], None]) -> float:
        self._sync()
        began = time.perf_counter()
        run()
        self._sync()
        return time.perf_counter() - began

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def default_timing(device: torch.device) -> Timing:
    """The clock a probe uses (tests replace it to inject timings deterministically)."""
    return WallTiming(device)


@dataclass(frozen=True)
class Builders:
    """How the loop builds a candidate's trainer and token source for a plan (train.py's own)."""

    trainer: Callable[[Plan], Steppable]
    source: Callable[[Plan], Batches]


def plan_for(plan: Plan, index: int) -> Plan:
    """The plan with probe candidate `index` as its chosen configuration and prediction."""
    assert plan.probe is not None
    picked = plan.probe.candidates[index]
    return plan.model_copy(update={"chosen": picked.candidate, "predicted": picked.prediction})


def run_probe(
    plan: Plan, builders: Builders, device: torch.device, timing: Timing | None = None
) -> ProbeResult:
    """Time each candidate (collective: every rank calls it), agree, and return the result with the winner."""
    probe = plan.probe
    assert probe is not None and probe.candidates
    timing = timing or default_timing(device)
    group = _agreement_group(probe)
    measurements: list[ProbeMeasurement] = []
    stopped = False
    with _restored_rng(device):
        for index in range(len(probe.candidates)):
            if _agree_flag(timing.elapsed() > probe.budget_seconds, group):
                stopped = True
                measurements.extend(_not_run(probe, i) for i in range(index, len(probe.candidates)))
                break
            measurements.append(_candidate(plan, index, builders, device, timing, group))
    winner = choose_winner(measurements, probe.memory_budget_bytes)
    result = ProbeResult(
        winner=winner,
        chosen=probe.candidates[winner].candidate,
        measurements=measurements,
        seconds=round(_all_reduce_max([timing.elapsed()], group)[0], 3),  # the slowest rank's
        stopped_early=stopped,
    )
    if group is not None:
        dist.destroy_process_group(group)
    return result


def choose_winner(measurements: Sequence[ProbeMeasurement], memory_budget_bytes: int) -> int:
    """The fastest measured candidate within the memory budget; the planner's pick (0) when none is."""
    fits = [
        m
        for m in measurements
        if m.outcome is ProbeOutcome.MEASURED
        and m.tokens_per_second_per_gpu is not None
        and (not memory_budget_bytes or (m.peak_reserved_bytes or 0) <= memory_budget_bytes)
    ]
    if not fits:
        return 0
    # Ties go to the earlier candidate: the planner ranked it higher.
    return max(fits, key=lambda m: (m.tokens_per_second_per_gpu or 0.0, -m.index)).index


def _candidate(
    plan: Plan,
    index: int,
    builders: Builders,
    device: torch.device,
    timing: Timing,
    group: ProcessGroup | None,
) -> ProbeMeasurement:
    """Build, warm up and time one candidate on this rank, free it, and agree on its figures."""
    probe = plan.probe
    assert probe is not None
    began = timing.elapsed()
    candidate_plan = plan_for(plan, index)
    chosen = candidate_plan.chosen
    _reset_peak(device)
    seconds = tokens = 0.0
    error: BaseException | None = None
    trainer: Steppable | None = None
    source: Batches | None = None
    try:
        trainer = builders.trainer(candidate_plan)
        source = builders.source(candidate_plan)
        step_trainer, step_source = trainer, source

        def one_step() -> StepResult:
            batches = [step_source.next_batch() for _ in range(chosen.gradient_accumulation_steps)]
            return step_trainer.step(batches)

        for _ in range(probe.warmup_steps):
            one_step()
        counted: list[int] = []

        def timed() -> None:
            counted.extend(one_step().tokens for _ in range(probe.timed_steps))

        seconds = timing.measure(index, timed)
        tokens = float(sum(counted))
    except torch.OutOfMemoryError as err:  # catchable: the allocator's state is whole; free and go on
        error = err
    except Exception as err:  # any other failure of a candidate is reported and it is dropped
        error = err
    peak = _peak_reserved(device)
    # Free everything this candidate built before the next one (and before the run) is built.
    if source is not None:
        source.close()
    del trainer, source
    _free(device)
    rate = tokens / seconds if seconds > 0 and error is None else 0.0
    failed = 0.0 if error is None else (1.0 if isinstance(error, torch.OutOfMemoryError) else 2.0)
    # One all-reduce, MAX: the worst failure, the slowest rank's rate (as -rate), the fullest rank's peak.
    agreed = _all_reduce_max([failed, -rate, float(peak)], group)
    worst, slowest, fullest = agreed[0], -agreed[1], int(agreed[2])
    outcome, detail = ProbeOutcome.MEASURED, ""
    if worst >= 1.0:  # every rank knows it: all gather the first failing rank's line, so all report it
        outcome = ProbeOutcome.FAILED if worst >= 2.0 else ProbeOutcome.OUT_OF_MEMORY
        detail = _first_failure(None if error is None else _one_line(error), group)
    elif probe.memory_budget_bytes and fullest > probe.memory_budget_bytes:
        outcome = ProbeOutcome.OVER_MEMORY
        detail = f"peak reserved {fullest:,} bytes over the budget of {probe.memory_budget_bytes:,}"
    measured = outcome is ProbeOutcome.MEASURED or outcome is ProbeOutcome.OVER_MEMORY
    prediction = probe.candidates[index].prediction
    return ProbeMeasurement(
        index=index,
        outcome=outcome,
        predicted_tokens_per_second_per_gpu=prediction.tokens_per_second_per_gpu,
        predicted_peak_reserved_bytes=prediction.memory.peak_reserved,
        tokens_per_second_per_gpu=round(slowest, 1) if measured else None,
        peak_reserved_bytes=fullest if measured and device.type == "cuda" else None,
        seconds=round(timing.elapsed() - began, 3),
        detail=detail,
    )


def _not_run(probe: ProbePlan, index: int) -> ProbeMeasurement:
    prediction = probe.candidates[index].prediction
    return ProbeMeasurement(
        index=index,
        outcome=ProbeOutcome.NOT_RUN,
        predicted_tokens_per_second_per_gpu=prediction.tokens_per_second_per_gpu,
        predicted_peak_reserved_bytes=prediction.memory.peak_reserved,
        detail=f"the probe's budget of {probe.budget_seconds:g} s ran out before it",
    )


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _agreement_group(probe: ProbePlan) -> ProcessGroup | None:
    """A gloo group with a timeout for the probe's agreement (CPU tensors beside NCCL); None alone."""
    if not dist.is_initialized():
        return None
    timeout = timedelta(seconds=probe.budget_seconds + COLLECTIVE_GRACE_SECONDS)
    group: ProcessGroup | None = dist.new_group(backend="gloo", timeout=timeout)
    return group


def _all_reduce_max(values: list[float], group: ProcessGroup | None) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if group is not None:
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        except RuntimeError as err:  # a timeout (DistBackendError) or a rank gone
            raise ProbeError(f"the probe's ranks could not agree: {_one_line(err)}") from None
    return [float(v) for v in tensor.tolist()]


def _first_failure(mine: str | None, group: ProcessGroup | None) -> str:
    """'rank R: <error>' of the lowest rank that failed, the same on every rank."""
    if group is None:
        return f"rank 0: {mine}"
    lines: list[str | None] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(lines, mine, group=group)
    except RuntimeError as err:
        raise ProbeError(f"the probe's ranks could not agree: {_one_line(err)}") from None
    return next((f"rank {r}: {line}" for r, line in enumerate(lines) if line), "failed on some rank")


def _agree_flag(flag: bool, group: ProcessGroup | None) -> bool:
    """True on every rank when it is true on any (so all stop before the same candidate)."""
    return _all_reduce_max([1.0 if flag else 0.0], group)[0] > 0


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_reserved(device: torch.device) -> int:
    return int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else 0


def _free(device: torch.device) -> None:
    """Drop a candidate's compiled graphs, garbage and cached blocks."""
    import torch._dynamo

    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


@contextmanager
def _restored_rng(device: torch.device) -> Iterator[None]:
    """The RNG states as they were before the probe: the run draws what a run without one draws."""
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def earlier_choice(plan: Plan, termination_message: str) -> ProbeResult | None:
    """The choice an earlier start of this job made: in its checkpoint folder, the termination message
    (a restart in place) or the plan (the operator's copy); None when there is none for these candidates."""
    probe = plan.probe
    if probe is None:
        return None
    found = [_read_file(plan), ProbeResult.find(termination_message), probe.result]
    for result in found:
        if (
            result is not None
            and result.winner < len(probe.candidates)
            and result.chosen == probe.candidates[result.winner].candidate
        ):
            return result
    return None


def _read_file(plan: Plan) -> ProbeResult | None:
    if plan.checkpoint.path is None:
        return None
    path = Path(plan.checkpoint.path) / PROBE_FILE
    try:
        return ProbeResult.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def keep_choice(plan: Plan, result: ProbeResult, *, is_writer: bool) -> None:
    """Write the choice beside the job's checkpoints (one rank), so a restart trains with it."""
    if not is_writer or plan.checkpoint.path is None:
        return
    folder = Path(plan.checkpoint.path)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".tmp-{PROBE_FILE}"
    tmp.write_text(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True)))
    tmp.replace(folder / PROBE_FILE)


def describe_result(plan: Plan, result: ProbeResult) -> list[str]:
    """The log's lines: each candidate's prediction beside its measurement, then the winner."""
    lines = []
    for m in result.measurements:
        measured = f"{m.tokens_per_second_per_gpu:,.0f}" if m.tokens_per_second_per_gpu is not None else "-"
        lines.append(
            f"probe candidate {m.index}: {m.outcome.value}, predicted "
            f"{m.predicted_tokens_per_second_per_gpu:,.0f} tokens/s per GPU, measured {measured}"
            + (f" ({m.detail})" if m.detail else "")
        )
    lines.append(
        f"probe: training with candidate {result.winner} after {result.seconds:.1f} s"
        + (" (stopped at its time budget)" if result.stopped_early else "")
    )
    return lines

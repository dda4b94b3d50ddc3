"""The probe: time the plan's top candidates on the job's own GPUs and data, then train with the fastest.

Every rank times every candidate, and the ranks agree on one figure each (the tokens/s the slowest rank
saw, the peak reserved memory the fullest rank saw), so they choose the same winner. After the
candidates, the larger micro-batches of their settings whose peak, corrected by what was measured,
fits the memory budget are tried too, most promising first, each correction resting on the latest
measurement of its setting. Each candidate is built, warmed up, timed and released (model, optimizer,
compiled graphs, the allocator's cache) before the next; the run itself is built afterwards from
scratch, so the probe leaves no trace in its weights, optimizer, data position, loss curve or memory.
docs/probe.md has the design.
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
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from blackwell_trainer.loop.step_report import StepResult
from blackwell_trainer.plan.config import (
    Plan,
    ProbeCandidate,
    ProbeGrowth,
    ProbeMeasurement,
    ProbeOutcome,
    ProbePlan,
    ProbeResult,
)

if TYPE_CHECKING:
    from blackwell_trainer.data.tokens import Batch

log = logging.getLogger("blackwell_trainer.probe")
# Where a checkpointing job keeps its probe's choice (beside its step folders): a restart trains with it.
PROBE_FILE = "probe.json"
# Added to the budget for the probe's own agreement collectives: a rank that is this late is stuck.
COLLECTIVE_GRACE_SECONDS = 300.0
# Outcomes that say a size of a setting does not fit: no larger size of that setting is tried after one.
_TOO_LARGE = (ProbeOutcome.OUT_OF_MEMORY, ProbeOutcome.OVER_MEMORY)


class ProbeError(RuntimeError):
    """The probe could not finish on every rank (an agreement collective timed out or failed)."""


class Steppable(Protocol):
    """What the probe needs of a built candidate: one optimizer step over a step's micro-batches."""

    def step(self, batches: Sequence[Batch]) -> StepResult: ...


class Batches(Protocol):
    """What the probe needs of a token source: the next micro-batch, and closing it."""

    def next_batch(self) -> Batch: ...

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


class Gauge(Protocol):
    """The probe's memory reading: reset before a candidate, its peak reserved bytes after (None: none)."""

    def reset(self, index: int) -> None: ...

    def peak(self, index: int) -> int | None: ...


class AllocatorGauge:
    """The CUDA caching allocator's peak reserved bytes; no reading on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self, index: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self, index: int) -> int | None:
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.max_memory_reserved(self.device))


def default_gauge(device: torch.device) -> Gauge:
    """The memory reading a probe uses (tests replace it to inject peaks on CPU)."""
    return AllocatorGauge(device)


@dataclass(frozen=True)
class Builders:
    """How the loop builds a candidate's trainer and token source for a plan (train.py's own)."""

    trainer: Callable[[Plan], Steppable]
    source: Callable[[Plan], Batches]


def plan_for(plan: Plan, index: int) -> Plan:
    """The plan with probe option `index` (a candidate, or a grown one) as its chosen configuration."""
    assert plan.probe is not None
    picked = plan.probe.options[index]
    return plan.model_copy(update={"chosen": picked.candidate, "predicted": picked.prediction})


def run_probe(
    plan: Plan,
    builders: Builders,
    device: torch.device,
    timing: Timing | None = None,
    gauge: Gauge | None = None,
) -> ProbeResult:
    """Time each candidate (collective: every rank calls it), then the larger micro-batches the measured
    peaks showed room for, agree, and return the result with the winner."""
    probe = plan.probe
    assert probe is not None and probe.candidates
    clock = timing or default_timing(device)
    memory = gauge or default_gauge(device)
    group = _agreement_group(probe)

    def measure(index: int) -> ProbeMeasurement:
        return _candidate(plan, index, builders, device, clock, memory, group)

    measurements: list[ProbeMeasurement] = []
    stopped = False
    with _restored_rng(device):
        for index in range(len(probe.candidates)):
            if _agree_flag(clock.elapsed() > probe.budget_seconds, group):
                stopped = True
                measurements.extend(_not_run(probe, i) for i in range(index, len(probe.candidates)))
                break
            measurements.append(measure(index))
        if not stopped:
            measurements.extend(_grown(probe, measurements, measure, clock, group))
    winner = choose_winner(measurements, probe.memory_budget_bytes)
    result = ProbeResult(
        winner=winner,
        chosen=probe.options[winner].candidate,
        measurements=measurements,
        seconds=round(_all_reduce_max([clock.elapsed()], group)[0], 3),  # the slowest rank's
        stopped_early=stopped,
    )
    if group is not None:
        dist.destroy_process_group(group)
    return result


@dataclass(frozen=True)
class GrowthStep:
    """A grown candidate the measurements so far say fits: its option, the measurement of its setting its
    peak is corrected by (the largest smaller micro-batch measured), that corrected peak, and its promise
    (its predicted tokens/s times that measurement's measured share of its own prediction)."""

    index: int
    basis: ProbeMeasurement
    corrected_peak: float
    promise: float


def growth_steps(probe: ProbePlan, measurements: Sequence[ProbeMeasurement]) -> list[GrowthStep]:
    """The larger micro-batches (probe.growth) worth trying now, most promising first. One qualifies when
    it was not timed yet, no size of its setting at or below it ran out of memory or over the budget, and
    its peak, corrected by the latest measurement of its setting below it (corrected_growth), stays
    probe.fitMargin under the memory budget. No share of room is asked for first: the correction is the
    measurement's own verdict, and a size that then does not fit is dropped like any candidate. The
    figures are the agreed ones, so every rank returns the same list."""
    if not probe.memory_budget_bytes or not probe.max_grown:
        return []
    limit = (1.0 - probe.fit_margin) * probe.memory_budget_bytes
    options = probe.options
    tried = [options[m.index].candidate for m in measurements]
    first = len(probe.candidates)
    steps: list[GrowthStep] = []
    for i, grown in enumerate(probe.growth):
        size = grown.candidate.micro_batch_size
        mine = [m for m in measurements if _setting_of(probe, m.index) == grown.grows]
        if grown.candidate in tried or any(
            m.outcome in _TOO_LARGE and options[m.index].candidate.micro_batch_size <= size for m in mine
        ):
            continue
        below = [
            m
            for m in mine
            if m.outcome is ProbeOutcome.MEASURED
            and m.peak_reserved_bytes
            and m.tokens_per_second_per_gpu
            and options[m.index].candidate.micro_batch_size < size
        ]
        if not below:
            continue
        basis = max(below, key=lambda m: (options[m.index].candidate.micro_batch_size, -m.index))
        assert basis.peak_reserved_bytes is not None and basis.tokens_per_second_per_gpu is not None
        peak = corrected_growth(options[basis.index], grown, basis.peak_reserved_bytes)
        if peak > limit:
            continue
        predicted = basis.predicted_tokens_per_second_per_gpu
        share = basis.tokens_per_second_per_gpu / predicted if predicted > 0 else 1.0
        steps.append(GrowthStep(first + i, basis, peak, grown.prediction.tokens_per_second_per_gpu * share))
    steps.sort(key=lambda g: (-g.promise, g.index))
    return steps


def grown_options(probe: ProbePlan, measurements: Sequence[ProbeMeasurement]) -> list[int]:
    """growth_steps' options (indexes into probe.options), most promising first."""
    return [step.index for step in growth_steps(probe, measurements)]


def _setting_of(probe: ProbePlan, index: int) -> int:
    """The candidate whose setting option `index` has (itself, or the one a grown option enlarges)."""
    option = probe.options[index]
    return option.grows if isinstance(option, ProbeGrowth) else index


def corrected_growth(parent: ProbeCandidate, grown: ProbeCandidate, measured_peak: int) -> float:
    """A grown size's predicted peak, corrected by what its candidate (the same setting at a smaller
    micro-batch) measured. The two predictions make a line in the micro-batch; the model's error is taken
    to lie in its slope, what grows with the micro-batch (the activations: the constants the OOM re-plan
    scales), so the line keeps its intercept and turns to pass through the measurement. On one H200 that
    put llama3.2-3b at sequence 3072, mbs 12, within 0.2% of the fitted model from its mbs 8 figure, where
    scaling the whole peak by the measured share overshot it by 2.4% (docs/probe.md). Where there is no
    such line (no growth between them, or a measurement below the intercept), the whole prediction is
    scaled by the measured share."""
    small, large = parent.candidate.micro_batch_size, grown.candidate.micro_batch_size
    before, after = parent.prediction.memory.peak_reserved, grown.prediction.memory.peak_reserved
    if large > small and after > before:
        slope = (after - before) / (large - small)
        fixed = before - slope * small
        if fixed >= 0 and measured_peak > fixed:
            return fixed + (measured_peak - fixed) * large / small
    return after * measured_peak / before if before > 0 else float(after)


def _grown(
    probe: ProbePlan,
    measurements: Sequence[ProbeMeasurement],
    measure: Callable[[int], ProbeMeasurement],
    timing: Timing,
    group: ProcessGroup | None,
) -> list[ProbeMeasurement]:
    """Time grown candidates one at a time, the most promising that fits by the measurements so far
    (each one measured, or dropped, refines the next choice), at most probe.maxGrown, while the budget
    holds one more (its estimate: what the measurement its correction rests on took; the slowest rank's
    sum decides)."""
    done: list[ProbeMeasurement] = []
    while len(done) < probe.max_grown:
        steps = growth_steps(probe, [*measurements, *done])
        if not steps:
            break
        step = steps[0]
        finish = _all_reduce_max([timing.elapsed() + step.basis.seconds], group)[0]
        if finish > probe.budget_seconds:
            log.info("probe: no time left in the budget for grown candidate %d", step.index)
            break
        option = probe.options[step.index]
        assert isinstance(option, ProbeGrowth)
        log.info(
            "probe: trying grown candidate %d, its peak corrected by option %d's measurement to %.0f bytes",
            step.index,
            step.basis.index,
            step.corrected_peak,
        )
        done.append(measure(step.index).model_copy(update={"grown_from": option.grows}))
    return done


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
    gauge: Gauge,
    group: ProcessGroup | None,
) -> ProbeMeasurement:
    """Build, warm up and time one candidate on this rank, release it, and agree on its figures."""
    probe = plan.probe
    assert probe is not None
    began = timing.elapsed()
    gauge.reset(index)
    # Everything the candidate builds lives in _timed's frame only, and its failure comes back as a line
    # (never the exception, whose traceback would keep that frame's tensors): gone when it returns.
    seconds, tokens, failure = _timed(plan_for(plan, index), index, builders, timing)
    peak = gauge.peak(index)
    release(device)
    rate = tokens / seconds if seconds > 0 and failure is None else 0.0
    failed = 0.0 if failure is None else (1.0 if failure[0] else 2.0)
    # One all-reduce, MAX: the worst failure, the slowest rank's rate (as -rate), the fullest rank's peak
    # (-1: no reading, CPU).
    agreed = _all_reduce_max([failed, -rate, float(-1 if peak is None else peak)], group)
    worst, slowest, fullest = agreed[0], -agreed[1], int(agreed[2])
    outcome, detail = ProbeOutcome.MEASURED, ""
    if worst >= 1.0:  # every rank knows it: all gather the first failing rank's line, so all report it
        outcome = ProbeOutcome.FAILED if worst >= 2.0 else ProbeOutcome.OUT_OF_MEMORY
        detail = _first_failure(None if failure is None else failure[1], group)
    elif probe.memory_budget_bytes and fullest > probe.memory_budget_bytes:
        outcome = ProbeOutcome.OVER_MEMORY
        detail = f"peak reserved {fullest:,} bytes over the budget of {probe.memory_budget_bytes:,}"
    measured = outcome is ProbeOutcome.MEASURED or outcome is ProbeOutcome.OVER_MEMORY
    prediction = probe.options[index].prediction
    return ProbeMeasurement(
        index=index,
        outcome=outcome,
        predicted_tokens_per_second_per_gpu=prediction.tokens_per_second_per_gpu,
        predicted_peak_reserved_bytes=prediction.memory.peak_reserved,
        tokens_per_second_per_gpu=round(slowest, 1) if measured else None,
        peak_reserved_bytes=fullest if measured and fullest >= 0 else None,
        seconds=round(timing.elapsed() - began, 3),
        detail=detail,
    )


def _timed(
    candidate_plan: Plan, index: int, builders: Builders, timing: Timing
) -> tuple[float, float, tuple[bool, str] | None]:
    """Build the candidate, run its warm-up steps and time its timed steps: (seconds, tokens, failure),
    the failure as (out of memory?, its line). Its trainer and token source are closed and unreferenced
    when this returns, however it ended."""
    probe = candidate_plan.probe
    assert probe is not None
    chosen = candidate_plan.chosen
    counted: list[int] = []
    source: Batches | None = None
    try:
        trainer = builders.trainer(candidate_plan)
        source = builders.source(candidate_plan)

        def one_step() -> StepResult:
            assert source is not None
            return trainer.step([source.next_batch() for _ in range(chosen.gradient_accumulation_steps)])

        for _ in range(probe.warmup_steps):
            one_step()

        def timed() -> None:
            counted.extend(one_step().tokens for _ in range(probe.timed_steps))

        return timing.measure(index, timed), float(sum(counted)), None
    except torch.OutOfMemoryError as err:  # catchable: the allocator's state is whole; release and go on
        return 0.0, 0.0, (True, _one_line(err))
    except Exception as err:  # any other failure of a candidate is reported and it is dropped
        return 0.0, 0.0, (False, _one_line(err))
    finally:
        if source is not None:
            source.close()


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


def release(device: torch.device) -> None:
    """Release what a candidate built once nothing references it: its compiled graphs and the guards that
    hold its modules (torch._dynamo.reset), then the garbage (reference cycles of modules, hooks and
    optimizer state), then the allocator's cached blocks and its peak statistics, so the next candidate,
    and the run after the probe, start from the memory of a process that never built it."""
    import torch._dynamo

    torch._dynamo.reset()
    gc.collect()
    empty_cache(device)


def empty_cache(device: torch.device) -> None:
    """Give the allocator's cached blocks back to the driver and restart its peak statistics (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
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
    """The choice this job made: the plan's (the operator's copy, which every worker reads alike: the
    first result the operator took, or the planner's pick where it refused the figures), else an earlier
    start's in its checkpoint folder or termination message (a restart in place); None when there is none
    for these candidates."""
    probe = plan.probe
    if probe is None:
        return None
    found = [probe.result, _read_file(plan), ProbeResult.find(termination_message)]
    for result in found:
        if (
            result is not None
            and result.winner < len(probe.options)
            and result.chosen == probe.options[result.winner].candidate
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
        grown = "" if m.grown_from is None else f" (grown from candidate {m.grown_from})"
        lines.append(
            f"probe candidate {m.index}{grown}: {m.outcome.value}, predicted "
            f"{m.predicted_tokens_per_second_per_gpu:,.0f} tokens/s per GPU, measured {measured}"
            + (f" ({m.detail})" if m.detail else "")
        )
    lines.append(
        f"probe: training with candidate {result.winner} after {result.seconds:.1f} s"
        + (" (stopped at its time budget)" if result.stopped_early else "")
    )
    return lines

"""The probe on two gloo ranks: the ranks agree on one winner from different timings, the run it chooses
trains exactly as a run without a probe, a restart keeps the choice, a failing candidate is dropped and
reported, and a probe past its budget stops. Timings are injected per rank (probe.default_timing), never
read from the CPU's real speed."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from blackwell_trainer import probe
from blackwell_trainer.plan.config import (
    Plan,
    ProbeMeasurement,
    ProbeOutcome,
    ProbeResult,
)
from blackwell_trainer.train import main
from tests.ports import free_port
from tests.support.plans import tiny_plan_dict

from .conftest import join_two_rank_world, spawn_two_ranks

STEP_LINE = re.compile(r"step (\d+)/\d+ loss (\d+\.\d+)")
# The probe's candidates: the planner's pick, then two with the same global batch (2 ranks x 128 tokens).
CANDIDATES: list[dict[str, Any]] = [
    {"activationCheckpointing": "none", "microBatchSize": 4, "gradientAccumulationSteps": 1},
    {"activationCheckpointing": "full", "microBatchSize": 2, "gradientAccumulationSteps": 2},
    {"activationCheckpointing": "selective", "microBatchSize": 4, "gradientAccumulationSteps": 1},
]


def probe_plan_dict(
    folder: Path, *, steps: int = 4, budget: float = 600.0, checkpoint: bool = False
) -> dict[str, Any]:
    """The tiny 2-rank plan with a probe of CANDIDATES (the pick first)."""
    raw = tiny_plan_dict()
    raw.update(steps=steps, metricsPort=free_port(), logEverySteps=1)
    raw["parameterCount"] = Plan.model_validate(raw).architecture.parameter_count()
    if checkpoint:
        raw["checkpoint"] = {"path": str(folder / "ckpt"), "intervalSteps": 2, "keepLatest": 2}
    candidates = []
    for i, overrides in enumerate(CANDIDATES):
        prediction = json.loads(json.dumps(raw["predicted"]))
        prediction["tokensPerSecondPerGpu"] = 1000.0 - 10 * i
        candidates.append({"candidate": {**raw["chosen"], **overrides}, "prediction": prediction})
    raw["probe"] = {
        "policy": "auto",
        "enabled": True,
        "reason": "test",
        "candidates": candidates,
        "budgetSeconds": budget,
        "warmupSteps": 1,
        "timedSteps": 2,
        "memoryBudgetBytes": 0,
    }
    return raw


class ScriptedTiming:
    """Per candidate, the seconds this rank's timed steps "take"; the clock advances by them only.

    `fail`: candidates that run out of memory on this rank after their timed steps ran (so the other rank
    is never left alone in a collective)."""

    def __init__(self, seconds: list[float], fail: set[int], log: Path) -> None:
        self.seconds, self.fail, self.log, self.clock = seconds, fail, log, 0.0

    def elapsed(self) -> float:
        return self.clock

    def measure(self, index: int, run: Callable[[], None]) -> float:
        run()
        with self.log.open("a") as out:
            out.write(f"{index}\n")
        self.clock += self.seconds[index]
        if index in self.fail:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return self.seconds[index]


class ScriptedGauge:
    """Per candidate, the peak reserved bytes this rank "reads" (the CUDA reading, injected on CPU)."""

    def __init__(self, peaks: dict[int, int]) -> None:
        self.peaks = peaks

    def reset(self, index: int) -> None:
        pass

    def peak(self, index: int) -> int | None:
        return self.peaks.get(index)


def _rank(
    rank: int,
    plan: str,
    port: int,
    folder: str,
    seconds: list[list[float]],
    fail: list[int],
    peaks: list[dict[int, int]],
) -> None:
    """One rank of main() with injected probe timings (and peaks); its exit code and log lines land in
    `folder`."""
    join_two_rank_world(rank, port, f"{folder}/termination-log")
    measured = Path(folder, f"measured-{rank}")
    timing = ScriptedTiming(seconds[rank], set(fail) if rank == 1 else set(), measured)
    probe.default_timing = lambda device: timing
    if peaks:
        gauge = ScriptedGauge(peaks[rank])
        probe.default_gauge = lambda device: gauge
    handler = logging.FileHandler(Path(folder, f"log-{rank}"))
    logger = logging.getLogger("blackwell_trainer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    Path(folder, f"rc-{rank}").write_text(str(main(["--plan", plan])))


def run_two(
    folder: Path,
    raw: dict[str, Any],
    seconds: list[list[float]],
    fail: tuple[int, ...] = (),
    peaks: list[dict[int, int]] | None = None,
) -> tuple[list[str], dict[int, str]]:
    """Run the plan on two ranks: (rank 0's log lines, step -> loss); both exit 0."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("log-*"):
        stale.unlink()
    path = folder / "plan.json"
    path.write_text(json.dumps(raw))
    spawn_two_ranks(_rank, (str(path), free_port(), str(folder), seconds, list(fail), peaks or []))
    assert [(folder / f"rc-{r}").read_text() for r in (0, 1)] == ["0", "0"]
    lines = (folder / "log-0").read_text().splitlines()
    losses = {int(m[1]): m[2] for m in map(STEP_LINE.search, lines) if m}
    return lines, losses


def measured(folder: Path, rank: int) -> list[int]:
    path = folder / f"measured-{rank}"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.mark.distributed
def test_ranks_agree_on_the_winner_drop_a_failed_candidate_and_train_exactly_as_without_a_probe(
    tmp_path: Path,
) -> None:
    # Rank 0 alone would pick candidate 0, rank 1 alone candidate 1; the slowest rank's figure picks 1
    # for both. Candidate 2 would be fastest, but runs out of memory on rank 1.
    seconds = [[1.0, 2.0, 0.5], [3.0, 1.0, 0.5]]
    raw = probe_plan_dict(tmp_path)
    lines, losses = run_two(tmp_path / "probed", raw, seconds, fail=(2,))
    result = ProbeResult.find((tmp_path / "probed" / "termination-log").read_text())
    assert result is not None and result.winner == 1 and not result.stopped_early
    outcomes = [m.outcome for m in result.measurements]
    assert outcomes == [ProbeOutcome.MEASURED, ProbeOutcome.MEASURED, ProbeOutcome.OUT_OF_MEMORY]
    # Tokens/s per GPU: 2 timed steps of 128 tokens per rank, over the slowest rank's seconds.
    assert [m.tokens_per_second_per_gpu for m in result.measurements] == [85.3, 128.0, None]
    assert "CUDA out of memory" in result.measurements[2].detail
    assert result.measurements[0].predicted_tokens_per_second_per_gpu == 1000.0
    assert "probe: training with candidate 1 after 4.5 s" in lines
    assert any(line.startswith("probe candidate 2: out-of-memory") for line in lines)

    # The same job without a probe, planned with candidate 1 from the start: the same losses, bit for bit.
    plain = probe_plan_dict(tmp_path)
    plain["chosen"] = plain["probe"]["candidates"][1]["candidate"]
    plain["probe"] = None
    _, expected = run_two(tmp_path / "plain", plain, seconds)
    assert sorted(expected) == [1, 2, 3, 4]
    assert losses == expected


@pytest.mark.distributed
def test_a_restart_trains_with_the_kept_choice_and_never_probes_again(tmp_path: Path) -> None:
    seconds = [[2.0, 1.0, 3.0], [2.0, 1.0, 3.0]]
    raw = probe_plan_dict(tmp_path, checkpoint=True)
    run_two(tmp_path, raw, seconds)
    assert measured(tmp_path, 0) == [0, 1, 2]
    kept = ProbeResult.model_validate_json((tmp_path / "ckpt" / probe.PROBE_FILE).read_text())
    assert kept.winner == 1

    # The job goes on from its checkpoint of step 4 (steps raised): no candidate is built or timed again.
    (tmp_path / "measured-0").unlink()
    (tmp_path / "measured-1").unlink()
    lines, losses = run_two(tmp_path, {**raw, "steps": 6}, seconds)
    assert measured(tmp_path, 0) == [] and measured(tmp_path, 1) == []
    assert "probe: training with candidate 1, the choice of an earlier start" in lines
    assert sorted(losses) == [5, 6]


@pytest.mark.distributed
def test_a_probe_past_its_budget_stops_and_trains_with_the_best_measured(tmp_path: Path) -> None:
    # 40 s per candidate against a 60 s budget: after two, the third is not run.
    seconds = [[40.0, 40.0, 1.0], [40.0, 30.0, 1.0]]
    raw = probe_plan_dict(tmp_path, budget=60.0)
    lines, losses = run_two(tmp_path, raw, seconds)
    assert measured(tmp_path, 0) == [0, 1]
    result = ProbeResult.find((tmp_path / "termination-log").read_text())
    assert result is not None and result.stopped_early and result.winner == 0  # 40 s each on rank 0
    assert result.measurements[2].outcome is ProbeOutcome.NOT_RUN
    assert "budget of 60 s ran out" in result.measurements[2].detail
    assert "probe: training with candidate 0 after 80.0 s (stopped at its time budget)" in lines
    assert sorted(losses) == [1, 2, 3, 4]


def _m(
    index: int, rate: float | None, peak: int | None = None, outcome: str = "measured"
) -> ProbeMeasurement:
    return ProbeMeasurement(
        index=index,
        outcome=ProbeOutcome(outcome),
        predicted_tokens_per_second_per_gpu=100.0,
        predicted_peak_reserved_bytes=0,
        tokens_per_second_per_gpu=rate,
        peak_reserved_bytes=peak,
    )


def test_the_winner_is_the_fastest_within_the_memory_budget_else_the_planners_pick() -> None:
    assert probe.choose_winner([_m(0, 10.0), _m(1, 12.0, 90), _m(2, 11.0, 50)], 80) == 2
    assert probe.choose_winner([_m(0, 10.0), _m(1, 10.0)], 0) == 0  # a tie keeps the planner's rank
    assert probe.choose_winner([_m(0, None, outcome="out-of-memory"), _m(1, None, outcome="failed")], 0) == 0


def test_the_result_line_round_trips_through_a_termination_message() -> None:
    result = ProbeResult(winner=1, measurements=[_m(0, 10.0), _m(1, 12.0)], seconds=3.5)
    text = f"error: something\n{result.to_line()}\n"
    assert ProbeResult.find(text) == result
    assert ProbeResult.find("btj-probe/v1 {not json") is None


def test_a_kept_choice_counts_only_for_the_candidates_it_was_made_among(tmp_path: Path) -> None:
    plan = Plan.model_validate(probe_plan_dict(tmp_path, checkpoint=True))
    assert plan.probe is not None
    won = plan.probe.candidates[1].candidate
    result = ProbeResult(winner=1, chosen=won, measurements=[_m(0, 10.0), _m(1, 12.0)], seconds=3.5)
    probe.keep_choice(plan, result, is_writer=True)
    assert probe.earlier_choice(plan, "") == result
    assert (
        probe.earlier_choice(
            plan.model_copy(
                update={
                    "checkpoint": plan.checkpoint.model_copy(update={"path": str(tmp_path / "elsewhere")})
                }
            ),
            result.to_line(),
        )
        == result
    )  # a restart in place
    # A re-plan (after an OOM, or for another node count) made other candidates: the choice is not theirs.
    replanned = plan.model_copy(deep=True)
    assert replanned.probe is not None
    replanned.probe.candidates[1].candidate.micro_batch_size = 1
    assert probe.earlier_choice(replanned, result.to_line()) is None

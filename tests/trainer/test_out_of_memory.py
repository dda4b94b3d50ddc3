"""A CUDA out-of-memory error in forward, backward or the optimizer step becomes a structured result: one
permanent-error line and one OOM result line in the termination message, and a metric.

The error is a real torch.OutOfMemoryError raised where the trainer meets one (a module's forward, an
autograd hook in backward, the optimizer's step), worded as PyTorch's caching allocator words it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from blackwell_trainer.loop.metrics import TrainerMetrics
from blackwell_trainer.loop.oom import parse_message
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.plan.config import PERMANENT_ERROR_PREFIX, OomPhase, OomResult, Plan
from blackwell_trainer.plan.units import GIB
from blackwell_trainer.train import main
from tests.ports import free_port

from .conftest import REAL_STEP, before_step, join_two_rank_world, spawn_two_ranks
from .test_checkpoint_resume import error_lines, write_plan

# What the caching allocator says (c10/cuda/CUDACachingAllocator.cpp), figures of an H200.
MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "1.23 GiB is free. Including non-PyTorch memory, this process has 138.57 GiB memory in use. Of the "
    "allocated memory 135.20 GiB is allocated by PyTorch, and 2.10 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def _raise(*_: Any, **__: Any) -> None:
    raise torch.OutOfMemoryError(MESSAGE)


def in_forward(trainer: Trainer) -> None:
    trainer.model.norm.register_forward_pre_hook(_raise)


def before_the_blocks(trainer: Trainer) -> None:
    """In forward, before the first (compiled) block runs: the compile itself (tens of CPU seconds under
    inductor) is not what a compiling-step OOM message depends on, the plan and the step are."""
    trainer.model.register_forward_pre_hook(_raise)


def in_backward(trainer: Trainer) -> None:
    def hook_output(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
        output.register_hook(_raise)  # runs when autograd reaches the final norm's output

    trainer.model.norm.register_forward_hook(hook_output)


def in_optimizer(trainer: Trainer) -> None:
    trainer.optimizer.register_step_pre_hook(_raise)


def test_the_allocator_s_message_is_read_for_its_sizes() -> None:
    sizes = parse_message(MESSAGE)
    assert sizes["requested"] == 2 * GIB
    assert sizes["total"] == round(139.81 * GIB)
    assert sizes["in_use"] == round(138.57 * GIB)
    assert sizes["reserved"] == round(135.20 * GIB) + round(2.10 * GIB)
    assert parse_message("CUDA out of memory. Tried to allocate 20.00 MiB.") == {"requested": 20 * 2**20}
    assert parse_message("something else") == {}


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize(
    ("install", "phase"),
    [(in_forward, OomPhase.FORWARD), (in_backward, OomPhase.BACKWARD), (in_optimizer, OomPhase.OPTIMIZER)],
)
def test_an_oom_becomes_a_permanent_error_with_its_result_line_and_a_metric(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    install: Callable[[Trainer], None],
    phase: OomPhase,
) -> None:
    path = write_plan(tmp_path, steps=5, interval=10)
    plan = Plan.from_file(path)
    before_step(monkeypatch, 2, install)
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(termination))
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    recorded: list[OomResult] = []
    record = TrainerMetrics.record_out_of_memory

    def keep(self: TrainerMetrics, result: OomResult) -> None:
        record(self, result)
        recorded.append(result)
        # The exporter is still serving: what Prometheus would scrape now.
        counted = self.registry.get_sample_value(
            "btj_trainer_gpu_out_of_memory_total", {"phase": phase.value}
        )
        assert counted == 1.0
        assert (
            self.registry.get_sample_value("btj_trainer_gpu_out_of_memory_needed_bytes")
            == result.needed_bytes
        )

    monkeypatch.setattr(TrainerMetrics, "record_out_of_memory", keep)
    rc = main(["--plan", str(path)])

    assert rc == 2
    first, second = termination.read_text().splitlines()
    assert first.startswith(
        f"{PERMANENT_ERROR_PREFIX}CUDA out of memory in {phase.value} of step 2 on rank 0: tried to allocate "
        "2.00 GiB, "
    )
    assert "the operator re-plans with less memory" in first.lower()
    result = OomResult.find(termination.read_text())
    assert result is not None and recorded == [result]
    assert (result.phase, result.step, result.rank, result.compiling) == (phase, 2, 0, False)
    assert result.requested_bytes == 2 * GIB
    assert result.peak_reserved_bytes == round(135.20 * GIB) + round(2.10 * GIB)  # off CUDA: the message's
    assert result.non_pytorch_bytes == round(138.57 * GIB) - result.peak_reserved_bytes
    assert result.gpu_total_bytes == round(139.81 * GIB)
    assert result.predicted_peak_reserved_bytes == plan.predicted.memory.peak_reserved
    assert result.candidate == plan.chosen
    # The result line is also on stderr (the pod's fallback is the log's tail), after the error line.
    err = capsys.readouterr().err
    assert error_lines(err) == [f"error: {first.removeprefix(PERMANENT_ERROR_PREFIX)}"]
    assert second in err.splitlines()
    assert json.loads(second.partition(" ")[2])["phase"] == phase.value


@pytest.mark.usefixtures("world_of_one")
def test_the_first_step_of_a_compiled_plan_says_it_was_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_plan(tmp_path, steps=3, interval=10)
    raw = json.loads(path.read_text())
    raw["chosen"]["compile"] = True
    path.write_text(json.dumps(raw))
    before_step(monkeypatch, 1, before_the_blocks)
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(termination))
    assert main(["--plan", str(path)]) == 2
    result = OomResult.find(termination.read_text())
    assert result is not None and (result.phase, result.step, result.compiling) == (OomPhase.FORWARD, 1, True)
    assert "(the first step, with torch.compile)" in termination.read_text().splitlines()[0]


def test_a_reader_takes_the_last_result_line_of_its_version_and_ignores_the_rest() -> None:
    assert OomResult.find(None) is None
    assert OomResult.find("permanent error: x\nbtj-oom/v1 {not json}\nbtj-oom/v2 {}") is None


@pytest.mark.usefixtures("world_of_one")
def test_a_plan_that_ran_out_in_this_pod_is_not_run_again_by_a_restart_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_plan(tmp_path, steps=5, interval=10)
    before_step(monkeypatch, 2, in_backward)
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(termination))
    assert main(["--plan", str(path)]) == 2
    first = OomResult.find(termination.read_text())

    # torchrun starts the worker again with the same plan: refused before any model is built.
    def never(*_: Any) -> None:
        raise AssertionError("the plan that ran out was built again")

    monkeypatch.setattr(Trainer, "__init__", never)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert main(["--plan", str(path)]) == 2
    line = termination.read_text().splitlines()[0]
    assert line.startswith(f"{PERMANENT_ERROR_PREFIX}not run again: an earlier start of this pod ran out")
    assert OomResult.find(termination.read_text()) == first  # the operator re-plans from the same result

    # Another plan (the operator's re-plan, a new container) runs.
    raw = json.loads(path.read_text())
    raw["chosen"]["microBatchSize"] = 4
    path.write_text(json.dumps(raw))
    monkeypatch.undo()
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(termination))
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert main(["--plan", str(path)]) == 0


# --- two ranks of one pod run out together: one whole message in their shared termination file


def _two_ranks_out_of_memory(rank: int, plan: str, port: int, folder: str) -> None:
    """One rank of a 2-rank main() run in which both ranks run out in the optimizer step of step 2."""
    join_two_rank_world(rank, port, f"{folder}/termination-log")  # one pod: one file for both ranks

    def step(self: Trainer, batches: Any) -> Any:
        if self.step_index + 1 == 2:
            in_optimizer(self)
        return REAL_STEP(self, batches)

    Trainer.step = step  # type: ignore[method-assign]
    Path(folder, f"rc-{rank}").write_text(str(main(["--plan", plan])))


@pytest.mark.distributed
def test_two_ranks_that_run_out_together_leave_one_whole_message(tmp_path: Path) -> None:
    from tests.support.plans import tiny_plan_dict

    raw = tiny_plan_dict()
    raw.update(steps=5, metricsPort=free_port(), logEverySteps=1)
    raw["parameterCount"] = Plan.model_validate(raw).architecture.parameter_count()
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(raw))
    spawn_two_ranks(_two_ranks_out_of_memory, (str(plan_path), free_port(), str(tmp_path)))
    assert [(tmp_path / f"rc-{r}").read_text() for r in (0, 1)] == ["2", "2"]
    first, second = (tmp_path / "termination-log").read_text().splitlines()
    result = OomResult.find(second)
    assert result is not None and result.phase is OomPhase.OPTIMIZER and result.step == 2
    assert first.startswith(f"{PERMANENT_ERROR_PREFIX}CUDA out of memory in optimizer of step 2 on rank ")
    assert f"on rank {result.rank}:" in first  # both lines are the same rank's

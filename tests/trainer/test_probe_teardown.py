"""The probe leaves nothing behind: when it empties the allocator's cache after a candidate, the
candidate's model and optimizer are already unreferenced (so their blocks can go back), compiled graphs
were dropped first, and that holds for a candidate that ran out of memory mid-step too (its traceback
would otherwise keep the step's frames and tensors). Real Trainers on one CPU rank; the allocator is
CUDA's, so what is checked here is that nothing is left to keep its blocks: the GPU record
(docs/benchmarks/probe_h100.md) checks the memory itself."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.distributed as dist

from blackwell_trainer import probe
from blackwell_trainer.data.tokens import Batch
from blackwell_trainer.loop.step_report import StepResult
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import Plan, ProbeOutcome
from blackwell_trainer.plan.tuning import Tuning
from tests.ports import free_port
from tests.support.plans import tiny_plan_dict

CPU = torch.device("cpu")
ONE = Runtime(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.distributed.*:UserWarning")


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _plan() -> Plan:
    raw = tiny_plan_dict(shardDegree=1)
    raw["gpusPerNode"] = 1
    raw["parameterCount"] = Plan.model_validate(raw).architecture.parameter_count()
    options: list[dict[str, Any]] = [
        {"activationCheckpointing": "none", "microBatchSize": 4, "gradientAccumulationSteps": 1},
        {"activationCheckpointing": "full", "microBatchSize": 2, "gradientAccumulationSteps": 2},
        {"activationCheckpointing": "selective", "microBatchSize": 4, "gradientAccumulationSteps": 1},
    ]
    raw["probe"] = {
        "policy": "always",
        "enabled": True,
        "reason": "test",
        "candidates": [
            {"candidate": {**raw["chosen"], **o}, "prediction": raw["predicted"]} for o in options
        ],
        "budgetSeconds": 600,
        "warmupSteps": 1,
        "timedSteps": 1,
        "memoryBudgetBytes": 0,
    }
    return Plan.model_validate(raw)


class OutOfMemoryAfterStep:
    """A real trainer whose step runs, then raises torch.OutOfMemoryError from inside the step's frame
    (as the allocator does mid-backward): the traceback references this object, hence the trainer."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def step(self, batches: Sequence[Batch]) -> StepResult:
        self.trainer.step(batches)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


class Tokens:
    def __init__(self, plan: Plan) -> None:
        self.shape = (plan.chosen.micro_batch_size, plan.sequence_length + 1)

    def next_batch(self) -> Batch:
        tokens = torch.randint(0, 256, self.shape)
        return Batch(tokens[:, :-1], tokens[:, 1:])

    def close(self) -> None:
        pass


def test_each_candidate_is_unreferenced_when_the_cache_is_emptied_and_graphs_reset_first(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[list[weakref.ref[Any]]] = []
    events: list[str] = []

    def trainer(plan: Plan) -> probe.Steppable:
        made = Trainer(plan, ONE, tuning=Tuning())
        built.append([weakref.ref(made), weakref.ref(made.model), weakref.ref(made.optimizer)])
        # The third candidate runs out of memory inside its step.
        selective = plan.chosen.activation_checkpointing.value == "selective"
        return OutOfMemoryAfterStep(made) if selective else made

    reset = torch._dynamo.reset

    def dynamo_reset() -> None:
        events.append("dynamo-reset")
        reset()

    def emptied(device: torch.device) -> None:
        alive = [ref() is not None for ref in built[-1]]
        events.append(f"empty-cache alive={alive}")

    monkeypatch.setattr(torch._dynamo, "reset", dynamo_reset)
    monkeypatch.setattr(probe, "empty_cache", emptied)
    result = probe.run_probe(_plan(), probe.Builders(trainer=trainer, source=Tokens), CPU)

    assert [m.outcome for m in result.measurements] == [
        ProbeOutcome.MEASURED,
        ProbeOutcome.MEASURED,
        ProbeOutcome.OUT_OF_MEMORY,
    ]
    dead = "empty-cache alive=[False, False, False]"
    assert events == ["dynamo-reset", dead] * 3
    assert all(ref() is None for refs in built for ref in refs)

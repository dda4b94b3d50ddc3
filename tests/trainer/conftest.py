"""Shared pieces of the trainer tests: the tiny plan every CPU test trains."""

from __future__ import annotations

import contextlib
import os
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from blackwell_trainer.config import Plan
from blackwell_trainer.metrics import TrainerMetrics
from blackwell_trainer.trainer import Trainer
from tests.ports import free_port

TINY_ARCHITECTURE: dict[str, Any] = {
    "hiddenSize": 64,
    "numLayers": 2,
    "numAttentionHeads": 4,
    "numKeyValueHeads": 2,
    "intermediateSize": 128,
    "vocabSize": 256,
}


def tiny_plan_dict(**chosen: Any) -> dict[str, Any]:
    """A complete plan (wire form, camelCase) for the tiny model on 2 CPU processes.

    Keyword arguments override fields of `chosen` (e.g. activationCheckpointing="full").
    """
    candidate: dict[str, Any] = {
        "precision": "bf16",
        "precisionRecipe": "none",
        "activationCheckpointing": "none",
        "microBatchSize": 4,
        "gradientAccumulationSteps": 1,
        "sharding": "full",
        "shardDegree": 2,
        "replicateDegree": 1,
        "contextParallel": 1,
        "compile": False,
        "lossChunkTokens": 64,
    }
    candidate.update(chosen)
    memory = {
        "parameters": 1000,
        "gradients": 1000,
        "optimizerStates": 2000,
        "activations": 3000,
        "loss": 100,
        "fsdpTransient": 100,
        "precisionOverhead": 0,
        "workspace": 100,
        "fragmentation": 100,
        "peakPhase": "backward",
        "peakAllocated": 7_000_000,
        "peakReserved": 8_000_000,
    }
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "jobName": "tiny",
        "modelName": "custom",
        "architecture": dict(TINY_ARCHITECTURE),
        "parameterCount": 1,
        "gpu": {"name": "CPU", "computeCapability": "0.0", "memoryBytes": 0, "peakBf16Flops": 1e12},
        "instanceType": "local",
        "nodes": 1,
        "gpusPerNode": 2,
        "sequenceLength": 32,
        "globalBatchTokens": 2 * 4 * 32,
        "steps": 20,
        "chosen": candidate,
        "predicted": {
            "tokensPerSecondPerGpu": 1234.5,
            "stepTimeSeconds": 0.1,
            "modelFlopsUtilization": 0.42,
            "memory": memory,
        },
        "dataset": {"kind": "synthetic", "seed": 7},
        "checkpoint": {"path": None, "intervalSteps": 5, "keepLatest": 2},
        "optimizer": {
            "learningRate": 3e-3,
            "warmupSteps": 2,
            "weightDecay": 0.0,
            "minLearningRateRatio": 1.0,
        },
        "metricsPort": 9400,
        "logEverySteps": 1,
    }


def tiny_plan(**chosen: Any) -> Plan:
    """The tiny plan as the pydantic model (parameterCount made exact)."""
    plan = Plan.model_validate(tiny_plan_dict(**chosen))
    plan.parameter_count = plan.architecture.parameter_count()
    return plan


@pytest.fixture
def plan() -> Plan:
    return tiny_plan()


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process in-process: main() then runs a gloo world of one (environment restored after)."""
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }.items():
        monkeypatch.setenv(name, value)


REAL_STEP = Trainer.step


def before_step(monkeypatch: pytest.MonkeyPatch, step: int, hook: Callable[[Trainer], None]) -> None:
    """Run `hook` on this rank's trainer just before it takes `step` (1-based)."""

    def step_after_hook(self: Trainer, batches: Any) -> Any:
        if self.step_index + 1 == step:
            hook(self)
        return REAL_STEP(self, batches)

    monkeypatch.setattr(Trainer, "step", step_after_hook)


def join_two_rank_world(rank: int, port: int, termination_log: str) -> None:
    """This spawned process's environment as one rank of a 2-rank loopback world, as torchrun sets it."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        BTJ_TERMINATION_LOG=termination_log,
    )


# What each forked rank starts with already imported: torch and the whole trainer, loaded once per test
# process in the fork server instead of once per rank per test (a spawned rank spends seconds of CPU on
# these imports before its first collective; the suite starts dozens of them).
RANK_PRELOAD = ["blackwell_trainer.train"]


def _as_the_caller_ran(
    rank: int, environ: dict[str, str], caller: int, target: Callable[..., None], args: tuple[Any, ...]
) -> None:
    """A forked rank as a spawned one would start: the caller's environment now (the fork server kept its
    own from when it started) and the caller's stdout and stderr (the test's capture, not the server's)."""
    os.environ.clear()
    os.environ.update(environ)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(os.open(f"/proc/{caller}/fd/{fd}", os.O_WRONLY | os.O_APPEND), fd)
    target(rank, *args)


def spawn_two_ranks(target: Callable[..., None], args: tuple[Any, ...]) -> None:
    """Run target(rank, *args) in two fresh processes and wait for both; an exception in either is raised
    here with its traceback.

    The processes are forked from multiprocessing's fork server, which imported RANK_PRELOAD once: each
    rank is a clean copy of a process that never ran a test, so nothing one test patches reaches another.
    """
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)
    context = mp.start_processes(
        _as_the_caller_ran,
        args=(dict(os.environ), os.getpid(), target, args),
        nprocs=2,
        join=False,
        start_method="forkserver",
    )
    while not context.join(timeout=300):  # a safety net only; a hang fails on gloo's own timeout
        pass


@pytest.fixture
def scraped(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, float]]:
    """The trainer's /metrics as Prometheus would read it, scraped over HTTP just before run() closes it."""
    samples: dict[str, float] = {}
    close = TrainerMetrics.close

    def scrape_then_close(self: TrainerMetrics) -> None:
        if self.port is not None:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as response:
                text = response.read().decode()
            for family in text_string_to_metric_families(text):
                samples.update({s.name: float(s.value) for s in family.samples if not s.labels})
        close(self)

    monkeypatch.setattr(TrainerMetrics, "close", scrape_then_close)
    yield samples

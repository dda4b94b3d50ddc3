"""Shared pieces of the trainer tests: the tiny plan every CPU test trains."""

from __future__ import annotations

import contextlib
import os
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from blackwell_trainer.loop.metrics import TrainerMetrics
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.plan.config import Plan
from tests.ports import free_port
from tests.support.plans import tiny_plan


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

"""PreemptionGuard: SIGTERM is never lost, every rank stops together, and it is caught from process start."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from blackwell_trainer.loop.preemption import PreemptionGuard

from .test_train_e2e import RUN_TIMEOUT_S, STEP_LINE, write_plan


@pytest.fixture
def guard() -> Iterator[PreemptionGuard]:
    installed = PreemptionGuard()
    yield installed
    installed.restore()


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    """A real gloo process group of one rank (a file store: no port), so agreed() all-reduces."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_sigterm_sets_the_flag_and_does_not_kill(guard: PreemptionGuard) -> None:
    assert not guard.requested and not guard.agreed()
    signal.raise_signal(signal.SIGTERM)  # runs the Python handler before it returns
    assert guard.requested and guard.agreed()


def test_restore_puts_back_the_previous_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    guard = PreemptionGuard()
    assert signal.getsignal(signal.SIGTERM) == guard._handle
    guard.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_during_the_all_reduce_counts_at_the_next_step(
    guard: PreemptionGuard, world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race behind the flaky preempted e2e fixture: every rank got SIGTERM while inside agreed()'s
    # all-reduce, after its flag had gone out as 0; storing the reduced 0 over the handler's flag lost
    # the signal on every rank, and the workers trained on until torchrun's SIGKILL 30 s later.
    real_all_reduce = dist.all_reduce

    def signalled_meanwhile(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = real_all_reduce(tensor, *args, **kwargs)
        signal.raise_signal(signal.SIGTERM)  # lands after this rank's 0 was contributed
        return work

    monkeypatch.setattr(dist, "all_reduce", signalled_meanwhile)
    assert not guard.agreed()  # too late for this reduction: no rank stops at this step...
    monkeypatch.setattr(dist, "all_reduce", real_all_reduce)
    assert guard.requested  # ...but the signal is kept
    assert guard.agreed()  # and every rank stops after the next one


def test_once_agreed_the_stop_stays(guard: PreemptionGuard, world_of_one: None) -> None:
    signal.raise_signal(signal.SIGTERM)
    assert guard.agreed() and guard.agreed()


def test_the_guard_imports_no_torch() -> None:
    # Installed before torch loads (seconds on a loaded node), it must not pull torch in itself.
    probe = "import sys, blackwell_trainer.loop.preemption; print('torch' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "False"


# python -m blackwell_trainer, with SIGTERM raised the moment `import torch` starts: a preemption while
# the trainer starts up. The import hook makes the moment exact; the signal itself is real.
SIGTERM_DURING_TORCH_IMPORT = textwrap.dedent(
    """
    import os, runpy, signal, sys

    class SigtermAtTorchImport:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                sys.meta_path.remove(self)
                print("handler at torch import:", signal.getsignal(signal.SIGTERM), flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
            return None

    sys.meta_path.insert(0, SigtermAtTorchImport())
    sys.argv = ["blackwell_trainer", "--plan", sys.argv[1]]
    runpy.run_module("blackwell_trainer", run_name="__main__", alter_sys=True)
    """
)


def test_sigterm_while_the_trainer_starts_exits_0_before_the_first_step(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, steps=3, checkpoint=tmp_path / "ckpt", interval=1, shardDegree=1)
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "gpusPerNode": 1}))
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_DURING_TORCH_IMPORT, str(plan)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    out = done.stdout + done.stderr
    # Without the guard in place before torch loads, SIGTERM's default kills it here (rc -15).
    assert done.returncode == 0, out[-3000:]
    assert "handler at torch import: <bound method PreemptionGuard._handle" in out
    assert "received SIGTERM" in out
    assert "preempted before the first step (at step 0): nothing new to checkpoint, exiting 0" in out
    assert not STEP_LINE.search(out)  # not one step trained after the signal
    assert not (tmp_path / "ckpt").exists()

"""One trainer process on a plan, as the GPU record scripts launch it (`python -m blackwell_trainer`).

Every step logged, a free metrics port, and the plan, the log and the termination message kept in `out`
under the run's name; and what those scripts read back: each step's figures, a configuration's label.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from blackwell_trainer.plan.config import Candidate, Plan

# The rendered pods' allocator setting (render/environment.py DEFAULT_ENV, which the planner's fragmentation
# terms assume), set here as a literal so that the GPU machine needs only the trainer; a test keeps the two
# equal. The runs before 2026-12-07 lacked it (docs/benchmarks/probe_h100.md).
POD_ALLOCATOR_CONF = "expandable_segments:True"

# Every run's output, in one file of the script's output folder.
TRAINER_LOGS = "trainer_logs.txt"

# The trainer's step line: its tokens/s per GPU and the caching allocator's peak reserved memory.
STEP = re.compile(r"step (\d+)/\d+ .*tokens/s/gpu (\d+).*reserved ([0-9.]+) GiB")


def step_figures(text: str) -> list[dict[str, float]]:
    """Each logged step's number, tokens/s per GPU and peak reserved GiB, from a trainer's output."""
    return [
        {"step": int(m[1]), "tokens_per_second_per_gpu": int(m[2]), "reserved_gib": float(m[3])}
        for m in map(STEP.search, text.splitlines())
        if m
    ]


def candidate_label(candidate: Candidate) -> str:
    """A configuration as the records name it: recipe/AC/mbsN (a scenario fixes everything else)."""
    c = candidate
    return f"{c.precision_recipe.value}/{c.activation_checkpointing.value}/mbs{c.micro_batch_size}"


@dataclass(frozen=True)
class TrainerRun:
    """What one trainer process left: its exit code, wall time, output and termination message."""

    returncode: int
    seconds: float
    stdout: str
    stderr: str
    termination_message: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_trainer(plan: Plan, out: Path, name: str, timeout_s: float, tuning: str | None = None) -> TrainerRun:
    """Run the trainer on `plan` in its own process; `tuning`, where given, is its BTJ_TRAINER_TUNING.

    Its plan and termination files go to a temporary folder and its output to one file in `out`,
    out/trainer_logs.txt (a section headed by `name`): the GPU machine returns 8 files, and a script's
    record must be among them however many runs it makes."""
    plan = plan.model_copy(update={"log_every_steps": 1, "metrics_port": free_port()})
    work = Path(tempfile.mkdtemp(prefix="btj-run-"))
    plan_path, termination = work / "plan.json", work / "termination"
    plan_path.write_text(plan.to_json())
    termination.write_text("")
    env = {**os.environ, "BTJ_TERMINATION_LOG": str(termination), "PYTHONUNBUFFERED": "1"}
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", POD_ALLOCATOR_CONF)  # as a user's pod runs it
    if tuning is not None:
        env["BTJ_TRAINER_TUNING"] = tuning
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "blackwell_trainer", "--plan", str(plan_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    seconds = round(time.perf_counter() - started, 1)
    with open(out / TRAINER_LOGS, "a") as logs:
        logs.write(f"===== {name}: rc {proc.returncode}, {seconds} s\n{proc.stdout}{proc.stderr}\n")
    message = termination.read_text()
    shutil.rmtree(work, ignore_errors=True)
    return TrainerRun(proc.returncode, seconds, proc.stdout, proc.stderr, message)

"""GPU end-to-end checks of the real trainer entry point (NCCL): context parallel vs unsplit, SIGTERM, resume.

Run on a 2-GPU machine (one device call), writes $OUT/gpu_e2e_check.json:

    python3 benchmarks/gpu_e2e_check.py --out $OUT --budget-s 240

Each check runs `torchrun -m blackwell_trainer --plan` exactly as the PyTorchJob does, with the
Llama-3.2-1B shape (compile off to keep it short), and reads the loss lines the trainer logs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_h200 import Config, make_plan

STEP_LINE = re.compile(r"step (\d+)/\d+ loss (\d+\.\d+)")


def write_plan(
    folder: Path, name: str, *, gpus: int, cp: int, seq: int, steps: int, ckpt: Path | None
) -> Path:
    plan = make_plan(Config("1b", 1, "none", gpus=gpus, compile=False))
    plan.sequence_length = seq
    plan.steps = steps
    plan.log_every_steps = 1
    plan.global_batch_tokens = seq * max(1, gpus // cp)
    plan.chosen.context_parallel = cp
    plan.chosen.shard_degree = gpus
    plan.optimizer.warmup_steps = 2
    plan.checkpoint.path = str(ckpt) if ckpt else None
    plan.checkpoint.interval_steps = 1000
    path = folder / f"{name}.json"
    path.write_text(plan.to_json())
    return path


def launch(plan: Path, gpus: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
        "-m", "blackwell_trainer", "--plan", str(plan),
    ]  # fmt: skip
    # A new session so SIGTERM reaches torchrun the way the kubelet sends it to PID 1.
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def losses(log: Path) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP_LINE.finditer(log.read_text(errors="replace"))}


def run(plan: Path, gpus: int, log: Path, timeout: float) -> dict[str, Any]:
    proc = launch(plan, gpus, log)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = -9
    return {"rc": rc, "losses": losses(log)}


def check_context_parallel(work: Path, out: Path, timeout: float) -> dict[str, Any]:
    """CP=2 over two GPUs must see the same loss curve as the unsplit sequence on one GPU."""
    seq, steps = 8192, 6
    one = run(
        write_plan(work, "cp1", gpus=1, cp=1, seq=seq, steps=steps, ckpt=None), 1, out / "cp1.log", timeout
    )
    two = run(
        write_plan(work, "cp2", gpus=2, cp=2, seq=seq, steps=steps, ckpt=None), 2, out / "cp2.log", timeout
    )
    common = sorted(set(one["losses"]) & set(two["losses"]))
    worst = max((abs(one["losses"][s] - two["losses"][s]) / one["losses"][s] for s in common), default=None)
    both_ran = one["rc"] == 0 and two["rc"] == 0 and len(common) == steps
    return {
        "cp1": one, "cp2": two, "steps_compared": len(common), "worst_relative_loss_difference": worst,
        "passed": both_ran and worst is not None and worst < 2e-2,
    }  # fmt: skip


def check_preemption_and_resume(work: Path, out: Path, timeout: float) -> dict[str, Any]:
    """SIGTERM to torchrun mid-run saves a checkpoint; the rerun resumes after it and finishes."""
    ckpt = work / "ckpt"
    plan = write_plan(work, "resume", gpus=2, cp=1, seq=4096, steps=14, ckpt=ckpt)
    log = out / "preempt.log"
    proc = launch(plan, 2, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and max(losses(log), default=0) < 5:
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        first_rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        first_rc = -9
    text = log.read_text(errors="replace")
    saved = re.search(r"preempted: checkpoint at step (\d+) written", text)
    second = run(plan, 2, out / "resume.log", timeout)
    resumed = re.search(r"resumed at step (\d+)", (out / "resume.log").read_text(errors="replace"))
    return {
        "first_rc": first_rc,
        "preempted_at": int(saved.group(1)) if saved else None,
        "checkpoints": sorted(p.name for p in ckpt.glob("step-*")) if ckpt.exists() else [],
        "resumed_at": int(resumed.group(1)) if resumed else None,
        "second_rc": second["rc"],
        "first_losses": losses(log),
        "second_losses": second["losses"],
        "passed": bool(
            saved and resumed and second["rc"] == 0 and int(resumed.group(1)) == int(saved.group(1))
        ),
    }


def environment() -> dict[str, Any]:
    import torch

    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "command": "python3 benchmarks/gpu_e2e_check.py --out $OUT --budget-s 240",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=240)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/btj-gpu-e2e")
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    result: dict[str, Any] = {"environment": environment()}
    for name, check in (
        ("context_parallel", check_context_parallel),
        ("preemption", check_preemption_and_resume),
    ):
        left = args.budget_s - (time.monotonic() - start)
        if left < 30:
            result[name] = {"skipped": "budget"}
            continue
        try:
            result[name] = check(work, args.out, timeout=left / 2)
        except Exception as exc:  # a failed check is a result, not a crash of the others
            result[name] = {"error": repr(exc), "passed": False}
        (args.out / "gpu_e2e_check.json").write_text(json.dumps(result, indent=2))
    for name in ("context_parallel", "preemption"):
        print(name, {k: v for k, v in result[name].items() if "losses" not in k and k not in ("cp1", "cp2")})


if __name__ == "__main__":
    main()

"""The harness's scheduler: families on the visible GPUs, one subprocess per configuration, records appended.

One-GPU families run in parallel lanes, one per visible GPU; multi-GPU families take as many GPUs as they
need. Each configuration runs in its own process (torchrun for several GPUs), so an OOM or a crash becomes
a record instead of ending the grid.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.calibration.grid import Family, architecture, build_plan, single_device
from benchmarks.calibration.prewarm import WarmPool
from benchmarks.calibration.worker import LOG_FILE
from benchmarks.trainer_process import POD_ALLOCATOR_CONF
from blackwell_operator.calibrate.records import (
    CalibrationRecord,
    RecordStatus,
    Versions,
    append_record,
    config_key,
)
from blackwell_operator.calibration import Calibration

REPO = Path(__file__).resolve().parents[2]
WORKER = "benchmarks.calibration.worker"
# A grid whose first configurations all fail (not OOM) has a systematic fault: stop and return the logs
# instead of spending the GPU call on more of the same.
FAIL_FAST_ERRORS = 2
# Start no configuration with less of the call left than this: configurations take 20-90 s on H200, and one
# killed at the deadline is lost work.
MIN_START_S = 60.0


def _descendants(pid: int) -> list[int]:
    """Every live descendant of pid, from /proc (torchrun starts its workers in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a process, its group and every descendant (workers hold GPU memory until they die)."""
    victims = _descendants(pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def worker_environment(gpu_ids: list[int]) -> dict[str, str]:
    """A configuration's process environment on the GPUs `gpu_ids`."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", POD_ALLOCATOR_CONF)  # as the rendered pods set it
    return env


def environment() -> dict[str, Any]:
    """Versions and device of this machine."""
    import torch

    versions: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for mod in ("transformer_engine", "torchao", "triton"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"versions": versions, "gpu_name": gpu, "gpus": torch.cuda.device_count()}


def merge(
    stub: CalibrationRecord, results: list[dict[str, Any]], env: dict[str, Any], detail: str
) -> CalibrationRecord:
    """One record from every rank's result (OOM anywhere is an OOM; memory is the largest rank's)."""
    statuses = [r.get("status") for r in results]
    status = (
        RecordStatus.OOM
        if "oom" in statuses
        else RecordStatus.OK
        if statuses and all(s == "ok" for s in statuses)
        else RecordStatus.ERROR
    )
    rank0 = results[0] if results else {}
    times = [float(t) for t in rank0.get("step_times", [])]
    med = statistics.median(times) if times else None
    ok = status is RecordStatus.OK
    allocated = [r["peak_allocated_bytes"] for r in results if r.get("peak_allocated_bytes")]
    reserved = [r["peak_reserved_bytes"] for r in results if r.get("peak_reserved_bytes")]
    retries = [int(r["alloc_retries"]) for r in results if r.get("alloc_retries") is not None]
    losses = [float(v) for v in rank0.get("losses", [])]
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in (rank0.get("phases") or {}).items())
    notes = "; ".join(
        d
        for d in [
            *(str(r.get("detail", "")) for r in results if r.get("detail")),
            detail,
            f"rank 0: {phases}" if phases else "",
            # A pre-started worker (prewarm.py): its imports ran while the previous configuration trained.
            f"prewarmed (imports {rank0['imported_before']:.1f} s before)"
            if "imported_before" in rank0
            else "",
        ]
        if d
    )
    return stub.model_copy(
        update=dict(
            status=status,
            tokens_per_second_per_gpu=rank0.get("tokens_per_step", 0) / med if ok and med else None,
            step_time_seconds=med if ok else None,
            step_times_seconds=times,
            peak_allocated_bytes=max(allocated) if ok and allocated else None,
            peak_reserved_bytes=max(reserved) if ok and reserved else None,
            alloc_retries=max(retries) if retries else None,
            loss=losses[-1] if losses else None,
            losses=losses,
            # What the trainer ran (its one-GPU path or FSDP2), where it got as far as deciding.
            single_device_path=bool(rank0.get("single_device", stub.single_device_path)),
            gpu_name=env["gpu_name"],
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            versions=Versions(**env["versions"]),
            detail=notes[:1500],
        )
    )


@dataclass
class Harness:
    """Schedules families on the visible GPUs and appends records as configurations end."""

    out: Path
    cal: Calibration
    instance: str
    deadline: float
    gpus: int
    warmup: int
    timed: int
    max_mbs: int
    config_timeout: float
    start_from_prediction: bool
    below: int = 2
    # Sizes near the predicted limit instead of doublings: on an 80 GB card the size that decides a pick
    # (3B at micro-batch 3) lies between two doublings, and the doubling above it is a wasted OOM.
    fine: bool = False
    done: dict[str, CalibrationRecord] = field(default_factory=dict)
    records: list[CalibrationRecord] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    lock: threading.Condition = field(default_factory=threading.Condition)
    free: list[int] = field(default_factory=list)
    # One-GPU configurations start in a worker pre-started on their lane (prewarm.py); None: each cold.
    warm: WarmPool | None = None

    def ladder(self, fam: Family) -> list[int]:
        """Doubling micro-batch sizes; by default from 2**below under the planner's predicted limit. With
        `fine`: one step under the predicted limit, then up by that step (a quarter of it, at least 1)."""
        if self.fine:
            limit = self.predicted_limit(fam)
            step = max(1, limit // 4)
            return list(range(max(1, limit - step), self.max_mbs + 1, step))
        start = 1
        if self.start_from_prediction:
            limit = 1
            while limit * 2 <= self.max_mbs and self.fits(fam, limit * 2):
                limit *= 2
            start = max(1, limit >> self.below)
        sizes, m = [], start
        while m <= self.max_mbs:
            sizes.append(m)
            m *= 2
        return sizes

    def fits(self, fam: Family, mbs: int) -> bool:
        """Whether the planner predicts the configuration's peak within the GPU's memory."""
        plan, _ = build_plan(fam, mbs, self.cal, self.instance)
        return plan.predicted.memory.peak_reserved <= plan.gpu.memory_bytes

    def predicted_limit(self, fam: Family) -> int:
        """The largest micro-batch the planner predicts to fit (1 when none does), by bisection."""
        low, high = 1, 2
        while high <= self.max_mbs and self.fits(fam, high):
            low, high = high, high * 2
        high = min(high, self.max_mbs + 1)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.fits(fam, mid) else (low, mid)
        return low

    def run_config(self, fam: Family, mbs: int, gpu_ids: list[int]) -> CalibrationRecord:
        plan, stub = build_plan(fam, mbs, self.cal, self.instance)
        remaining = self.deadline - time.time()
        if remaining < MIN_START_S:
            return stub.model_copy(update=dict(status=RecordStatus.SKIPPED, detail="call budget exhausted"))
        lane = tuple(gpu_ids)
        warm = self.warm.take(lane) if self.warm is not None and fam.gpus == 1 else None
        tmp = warm.folder if warm is not None else Path(tempfile.mkdtemp(prefix="btj-cal-"))
        (tmp / "plan.json").write_text(plan.to_json())
        env = worker_environment(gpu_ids)
        started = time.time()
        detail = ""
        log_path = tmp / LOG_FILE
        if warm is not None:
            warm.start(tmp / "plan.json", tmp, self.warmup, self.timed)
            proc = warm.proc
        else:
            proc = self._start_cold(fam, tmp, env)
        if self.warm is not None and fam.gpus == 1 and self.deadline - time.time() > MIN_START_S:
            self.warm.spawn(lane, env)  # the lane's next configuration imports while this one runs
        cut_by_deadline = remaining - 10 < self.config_timeout
        killed = False
        try:
            proc.wait(timeout=min(self.config_timeout, remaining - 10))
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            killed = True
            detail = f"killed after {time.time() - started:.0f} s"
        tail = log_path.read_text(errors="replace").splitlines()[-60:] if log_path.exists() else []
        with self.lock, open(self.out / "worker_logs.txt", "a") as f:
            f.write(f"===== {stub.key} (last 60 lines)\n" + "\n".join(tail) + "\n")
        if killed and cut_by_deadline:
            # The call's budget ran out, not the configuration: leave it for the next call (its log is kept
            # above, to see how far it got).
            return stub.model_copy(
                update=dict(status=RecordStatus.SKIPPED, detail=f"call budget exhausted ({detail})")
            )
        results = [json.loads(p.read_text()) for p in sorted(tmp.glob("result.rank*.json"))]
        if not results:
            status = RecordStatus.TIMEOUT if detail else RecordStatus.ERROR
            return stub.model_copy(
                update=dict(
                    status=status,
                    detail=(detail or "no result; " + " | ".join(tail[-5:]))[:1500],
                    gpu_name=self.env["gpu_name"],
                    versions=Versions(**self.env["versions"]),
                )
            )
        return merge(stub, results, self.env, f"wall {time.time() - started:.0f} s {detail}".strip())

    def _start_cold(self, fam: Family, tmp: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A new worker process for the configuration planned in tmp/plan.json (torchrun for several GPUs)."""
        # The worker is a module of this repository, run from its root; it imports the installed packages.
        args = [
            "-m",
            WORKER,
            str(tmp / "plan.json"),
            "--result-dir",
            str(tmp),
            "--warmup",
            str(self.warmup),
            "--timed",
            str(self.timed),
        ]
        if fam.gpus > 1:
            from blackwell_trainer.parallel.runtime import free_port

            port = free_port()
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc-per-node={fam.gpus}",
                f"--master-port={port}",
                *args,
            ]
        else:
            cmd = [sys.executable, *args]
        with open(tmp / LOG_FILE, "w") as log:
            # Its own session: on a timeout the whole group goes (torchrun's workers hold GPU memory).
            return subprocess.Popen(
                cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def failing(self) -> bool:
        """True when nothing has run yet and the first configurations all failed."""
        statuses = [r.status for r in self.records]
        errors = statuses.count(RecordStatus.ERROR)
        return errors >= FAIL_FAST_ERRORS and not any(
            s in (RecordStatus.OK, RecordStatus.OOM) for s in statuses
        )

    def add(self, rec: CalibrationRecord) -> None:
        with self.lock:
            self.records.append(rec)
            append_record(self.out / "records.jsonl", rec)
        tps = f"{rec.tokens_per_second_per_gpu:,.0f} tok/s/GPU" if rec.tokens_per_second_per_gpu else ""
        mem = f"reserved {rec.peak_reserved_bytes / 2**30:.1f} GiB" if rec.peak_reserved_bytes else ""
        if rec.alloc_retries:
            mem += f" ({rec.alloc_retries} allocator retries: at capacity)"
        pred = rec.predicted
        p = (
            f"(predicted {pred.tokens_per_second_per_gpu:,.0f}, {pred.memory.peak_reserved / 2**30:.1f} GiB)"
            if pred
            else ""
        )
        print(
            f"[{time.strftime('%H:%M:%S')}] {rec.key}: {rec.status.value} {tps} {mem} {p} {rec.detail[:160]}",
            flush=True,
        )

    def measure(self, fam: Family, mbs: int, gpu_ids: list[int]) -> CalibrationRecord:
        """The record of a configuration: from --resume when it ran or OOMed there, else run it now."""
        name, _ = architecture(fam.model)
        cand = fam.candidate(mbs, self.cal.trainer.loss_chunk_tokens)
        path = single_device(fam, self.cal)
        rec = self.done.get(config_key(name, fam.sequence_length, fam.gpus, cand, single_device=path))
        if rec is None or rec.status not in (RecordStatus.OK, RecordStatus.OOM):
            if self.failing():
                _, stub = build_plan(fam, mbs, self.cal, self.instance)
                return stub.model_copy(update=dict(status=RecordStatus.SKIPPED, detail="fail-fast"))
            rec = self.run_config(fam, mbs, gpu_ids)
            self.add(rec)
        return rec

    def run_family(self, fam: Family, gpu_ids: list[int]) -> None:
        sizes = self.ladder(fam)
        for i, mbs in enumerate(sizes):
            rec = self.measure(fam, mbs, gpu_ids)
            if rec.status is RecordStatus.OK:
                continue
            if i == 0 and rec.status is RecordStatus.OOM:
                # The prediction was optimistic: walk down until a size runs (or mbs 1 OOMs too).
                smaller = mbs // 2
                while smaller >= 1 and self.measure(fam, smaller, gpu_ids).status is RecordStatus.OOM:
                    smaller //= 2
            break  # the first OOM (or a failure) ends the family's ladder

    def run(self, families: list[Family]) -> None:
        self.free = list(range(self.gpus))
        pending = [f for f in families if f.gpus <= self.gpus]
        for fam in families:
            if fam.gpus > self.gpus:
                print(f"skipped {fam.label()}: needs {fam.gpus} GPUs, {self.gpus} visible", flush=True)
        threads: list[threading.Thread] = []
        while pending and time.time() < self.deadline - MIN_START_S and not self.failing():
            with self.lock:
                # The first family in priority order that the free GPUs can take.
                ready = next((f for f in pending if f.gpus <= len(self.free)), None)
                if ready is None:
                    self.lock.wait(timeout=5)
                    continue
                pending.remove(ready)
                ids, self.free = self.free[: ready.gpus], self.free[ready.gpus :]
            t = threading.Thread(target=self._family_thread, args=(ready, ids))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        if self.warm is not None:
            self.warm.close(kill_tree)
        why = "fail-fast: the first configurations all failed" if self.failing() else "budget"
        for fam in pending:
            print(f"not started ({why}): {fam.label()}", flush=True)

    def _family_thread(self, fam: Family, ids: list[int]) -> None:
        try:
            self.run_family(fam, ids)
        except Exception as err:  # a planning failure of one family must not end the grid
            print(f"family {fam.label()} failed: {type(err).__name__}: {err}", flush=True)
        finally:
            with self.lock:
                self.free.extend(ids)
                self.lock.notify_all()


def summary(records: list[CalibrationRecord]) -> str:
    """A plain table of what ran."""
    lines = [
        f"{'configuration':70s} {'status':7s} {'tok/s/GPU':>10s} {'pred':>10s} {'resv GiB':>8s} {'pred':>8s}"
    ]
    for r in records:
        pred = r.predicted
        pred_tps = pred.tokens_per_second_per_gpu if pred else 0.0
        pred_mem = pred.memory.peak_reserved if pred else 0
        lines.append(
            f"{r.key:70s} {r.status.value:7s} "
            f"{r.tokens_per_second_per_gpu or 0:10,.0f} {pred_tps:10,.0f} "
            f"{(r.peak_reserved_bytes or 0) / 2**30:8.1f} {pred_mem / 2**30:8.1f}"
        )
    return "\n".join(lines)

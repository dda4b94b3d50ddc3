"""Calibration harness: run this project's trainer over a grid of configurations and write one record each.

On the GPU machine, from the repository root (pydantic carried as wheels, see docs/calibration/README.md):

    python benchmarks/calibration/harness.py --grid issue6 --out $OUT --budget-s 560
    python benchmarks/calibration/harness.py --grid issue7 --out $OUT --budget-s 560     # 8 GPUs
    python benchmarks/calibration/harness.py --cpu-smoke --out /tmp/smoke                # CPU, gloo

Every configuration is a family (model, sequence, GPUs, precision/recipe, AC, sharding) at one micro-batch
size; a family's micro-batch sizes run in doubling order until the first OOM. Each configuration runs in its
own process (torchrun for several GPUs), so an OOM or a crash becomes a record instead of ending the grid.
Its Plan is built with the planner (`evaluate`), so the record carries the prediction next to the
measurement. One-GPU families run in parallel lanes, one per visible GPU; multi-GPU families take as many
GPUs as they need. Records are appended to OUT/records.jsonl (one JSON CalibrationRecord per line) as
each configuration ends; configurations already in --resume files are skipped, so a grid larger than one
call finishes over several calls. Tokens/s per GPU = tokens per step per GPU / the median timed step.
"""

from __future__ import annotations

import argparse
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
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for _src in (REPO / "operator" / "src", REPO / "trainer_image" / "src"):
    if str(_src) not in sys.path:
        sys.path.insert(0, str(_src))

from blackwell_operator.calibrate.coverage import LADDER_TOP  # noqa: E402
from blackwell_operator.calibrate.records import (  # noqa: E402
    CalibrationRecord,
    RecordStatus,
    Versions,
    append_record,
    config_key,
    read_records,
)
from blackwell_operator.calibration import Calibration  # noqa: E402
from blackwell_trainer.config import (  # noqa: E402
    ActivationCheckpointing,
    Architecture,
    Candidate,
    Plan,
    Precision,
    PrecisionRecipe,
    Sharding,
)

H200_INSTANCE = "ml.p5en.48xlarge"
PRESETS = {"1b": "llama3.2-1b", "3b": "llama3.2-3b", "8b": "llama3.1-8b"}
# Custom architectures (Llama-3 vocabulary and GQA): a 13B class (Llama-2-13B widths) and a ~30B class
# (LLaMA-33B widths); tiny is the CPU smoke model.
CUSTOM: dict[str, dict[str, Any]] = {
    "custom-13b": dict(
        hidden_size=5120,
        num_layers=40,
        num_attention_heads=40,
        num_key_value_heads=8,
        intermediate_size=13824,
        vocab_size=128256,
    ),
    "custom-30b": dict(
        hidden_size=6656,
        num_layers=60,
        num_attention_heads=52,
        num_key_value_heads=4,
        intermediate_size=17920,
        vocab_size=128256,
    ),
    "tiny": dict(
        hidden_size=256,
        num_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=1024,
        tie_word_embeddings=True,
    ),
}
FP8_RECIPE = "torchao-tensorwise"  # TE is not installed on the H200 machines; torchao is carried as a wheel
OOM_EXIT = 3
# A grid whose first configurations all fail (not OOM) has a systematic fault: stop and return the logs
# instead of spending the GPU call on more of the same.
FAIL_FAST_ERRORS = 2
# Start no configuration with less of the call left than this: configurations take 20-90 s on H200, and one
# killed at the deadline is lost work.
MIN_START_S = 60.0


@dataclass(frozen=True)
class Family:
    """Everything but the micro-batch size."""

    model: str
    sequence_length: int
    gpus: int
    precision: str
    recipe: str
    ac: str
    sharding: str = "full"
    compile: bool = True

    def candidate(self, mbs: int, loss_chunk: int) -> Candidate:
        shard = self.gpus if self.sharding == "full" else 1
        return Candidate(
            precision=Precision(self.precision),
            precision_recipe=PrecisionRecipe(self.recipe),
            activation_checkpointing=ActivationCheckpointing(self.ac),
            micro_batch_size=mbs,
            gradient_accumulation_steps=1,
            sharding=Sharding(self.sharding),
            shard_degree=shard,
            replicate_degree=self.gpus // shard,
            compile=self.compile,
            loss_chunk_tokens=loss_chunk,
        )

    def label(self) -> str:
        prec = self.precision if self.recipe == "none" else self.recipe
        return f"{self.model} s{self.sequence_length} g{self.gpus} {prec} ac-{self.ac} shard-{self.sharding}"


def _families(
    models: list[str],
    seqs: list[int],
    gpus: int,
    precisions: list[str],
    acs: list[str],
    shardings: tuple[str, ...] = ("full",),
    compile_blocks: bool = True,
) -> list[Family]:
    out = []
    for seq in seqs:
        for model in models:
            for sharding in shardings:
                for prec in precisions:
                    recipe = "none" if prec == "bf16" else FP8_RECIPE
                    for ac in acs:
                        out.append(Family(model, seq, gpus, prec, recipe, ac, sharding, compile_blocks))
    return out


ACS = ["none", "selective", "full"]
PRECS = ["bf16", "fp8"]
# Priority order (lanes take from the front): sequence 4096 first (it matches the reference grid),
# then 8192, 2048.
GRIDS: dict[str, list[Family]] = {
    "issue6": [
        *_families(["1b", "3b", "8b"], [4096, 8192, 2048], 1, PRECS, ACS),
        *_families(["8b", "custom-13b"], [4096, 8192, 2048], 2, PRECS, ACS),
    ],
    "issue7": [
        *_families(["8b"], [4096, 8192], 8, PRECS, ACS, ("full", "none")),
        *_families(["custom-13b", "custom-30b"], [4096, 8192], 8, PRECS, ACS),
    ],
    "cpu-smoke": [
        Family("tiny", 128, 1, "bf16", "none", "none", compile=False),
        Family("tiny", 128, 2, "bf16", "none", "full", compile=False),
    ],
}


def architecture(model: str) -> tuple[str, Architecture]:
    """Catalog name and architecture of a grid model."""
    if model in CUSTOM:
        return model, Architecture(**CUSTOM[model])
    from blackwell_operator.catalogs import resolve_model
    from blackwell_operator.models.spec import ModelSpec

    return resolve_model(ModelSpec(preset=PRESETS.get(model, model)))


def build_plan(fam: Family, mbs: int, cal: Calibration, instance: str) -> tuple[Plan, CalibrationRecord]:
    """The Plan the trainer executes (the planner's evaluate() of the pinned candidate) and a record stub."""
    from blackwell_operator.catalogs import get_gpu, get_instance
    from blackwell_operator.models.spec import BlackwellTrainingJobSpec
    from blackwell_operator.planner import evaluate
    from blackwell_trainer.config import GpuInfo, OptimizerConfig

    name, arch = architecture(fam.model)
    spec = BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"architecture": arch.model_dump(by_alias=True)},
            "cluster": {"instanceType": instance, "nodes": 1, "gpusPerNode": fam.gpus},
            "training": {"sequenceLength": fam.sequence_length},
            "tuning": {"memoryHeadroom": 0.0, "compile": fam.compile},
        }
    )
    ev = evaluate(spec, fam.candidate(mbs, cal.trainer.loss_chunk_tokens), calibration=cal)
    gpu = get_gpu(get_instance(instance).gpu)
    data_parallel = fam.gpus // ev.candidate.context_parallel
    plan = Plan(
        job_name="calibration",
        model_name=name,
        architecture=arch,
        parameter_count=arch.parameter_count(),
        gpu=GpuInfo(
            name=gpu.name,
            compute_capability=gpu.compute_capability,
            memory_bytes=gpu.memory_bytes,
            peak_bf16_flops=gpu.peak_flops["bf16"],
        ),
        instance_type=instance,
        nodes=1,
        gpus_per_node=fam.gpus,
        sequence_length=fam.sequence_length,
        global_batch_tokens=mbs * fam.sequence_length * data_parallel,
        steps=1000,
        chosen=ev.candidate,
        predicted=ev.prediction,
        calibration=f"{cal.name} ({cal.status})",
        optimizer=OptimizerConfig(warmup_steps=10),
    )
    stub = CalibrationRecord(
        source="harness",
        trainer="btj-trainer",
        model_name=name,
        architecture=arch,
        instance_type=instance,
        gpus_per_node=fam.gpus,
        sequence_length=fam.sequence_length,
        candidate=ev.candidate,
        status=RecordStatus.ERROR,
        predicted=ev.prediction,
        predicted_calibration=cal.name,
        command=" ".join(sys.argv),
    )
    return plan, stub


# --------------------------------------------------------------------------------------------------- worker


def _is_oom(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def worker(plan_path: Path, result_dir: Path, warmup: int, timed: int) -> None:
    """Run one configuration in this process; every rank writes result.rank<R>.json."""
    # Where a configuration's wall time goes (the timed steps are a few seconds of 20-90): the next
    # speed-up of the harness starts from these.
    phases: dict[str, float] = {}
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - mark
        mark = now

    import torch

    from blackwell_trainer.train import Runtime, Trainer, allocator_stats, init_distributed

    lap("import")
    runtime = Runtime.from_env()
    result: dict[str, Any] = {"status": "error", "detail": "", "phases": phases}
    code = 0
    try:
        plan = Plan.from_file(plan_path)
        init_distributed(runtime)
        trainer = Trainer(plan, runtime)
        lap("setup")
        gen = torch.Generator(device=runtime.device).manual_seed(1234 + runtime.rank)
        shape = (plan.chosen.micro_batch_size, plan.sequence_length)
        vocab = plan.architecture.vocab_size
        batches = [
            (
                torch.randint(0, vocab, shape, device=runtime.device, generator=gen),
                torch.randint(0, vocab, shape, device=runtime.device, generator=gen),
            )
        ]
        times, losses = [], []
        for i in range(warmup + timed):
            step = trainer.step(batches)
            losses.append(step.loss)
            if i >= warmup:
                times.append(step.seconds)
            lap("warmup" if i < warmup else "timed")
        result.update(
            status="ok", step_times=times, losses=losses, tokens_per_step=trainer.tokens_per_micro_batch
        )
    except BaseException as err:  # recorded, not raised: the grid goes on
        if _is_oom(err):
            result.update(status="oom", detail=str(err).splitlines()[0][:300])
            code = OOM_EXIT
        else:
            result.update(
                detail=f"{type(err).__name__}: {err}"[:600] + " | " + traceback.format_exc()[-1500:]
            )
            code = 1
    finally:
        if torch.cuda.is_available():
            stats = allocator_stats(runtime.device)
            result["peak_allocated_bytes"] = stats.peak_allocated
            result["peak_reserved_bytes"] = stats.peak_reserved
            # >0 means the allocator hit the GPU's capacity and freed its cache to go on (slow steps).
            result["alloc_retries"] = stats.retries
        (result_dir / f"result.rank{runtime.rank}.json").write_text(json.dumps(result))
        sys.stdout.flush()
        sys.stderr.flush()
        # No destroy_process_group: after an OOM a peer may sit in a collective. A non-zero exit makes
        # torchrun stop the other ranks.
        os._exit(code)


# --------------------------------------------------------------------------------------------------- parent


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
    done: dict[str, CalibrationRecord] = field(default_factory=dict)
    records: list[CalibrationRecord] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    lock: threading.Condition = field(default_factory=threading.Condition)
    free: list[int] = field(default_factory=list)

    def ladder(self, fam: Family) -> list[int]:
        """Doubling micro-batch sizes; by default from 2**below under the planner's predicted limit."""
        start = 1
        if self.start_from_prediction:
            limit = 1
            while limit * 2 <= self.max_mbs:
                plan, _ = build_plan(fam, limit * 2, self.cal, self.instance)
                if plan.predicted.memory.peak_reserved > plan.gpu.memory_bytes:
                    break
                limit *= 2
            start = max(1, limit >> self.below)
        sizes, m = [], start
        while m <= self.max_mbs:
            sizes.append(m)
            m *= 2
        return sizes

    def run_config(self, fam: Family, mbs: int, gpu_ids: list[int]) -> CalibrationRecord:
        plan, stub = build_plan(fam, mbs, self.cal, self.instance)
        remaining = self.deadline - time.time()
        if remaining < MIN_START_S:
            return stub.model_copy(update=dict(status=RecordStatus.SKIPPED, detail="call budget exhausted"))
        tmp = Path(tempfile.mkdtemp(prefix="btj-cal-"))
        (tmp / "plan.json").write_text(plan.to_json())
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # as the rendered pods set it
        src = f"{REPO / 'operator' / 'src'}:{REPO / 'trainer_image' / 'src'}"
        env["PYTHONPATH"] = f"{src}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else src
        args = [
            str(Path(__file__).resolve()),
            "--worker",
            str(tmp / "plan.json"),
            "--result-dir",
            str(tmp),
            "--warmup",
            str(self.warmup),
            "--timed",
            str(self.timed),
        ]
        if fam.gpus > 1:
            from blackwell_trainer.train import free_port

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
        started = time.time()
        detail = ""
        log_path = tmp / "log.txt"
        with open(log_path, "w") as log:
            # Its own session: on a timeout the whole group goes (torchrun's workers hold GPU memory).
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
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
        rec = self.done.get(config_key(name, fam.sequence_length, fam.gpus, cand))
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


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", default="issue6", choices=sorted(GRIDS))
    parser.add_argument(
        "--cpu-smoke",
        "--dry-run",
        action="store_true",
        help="2 configurations of a tiny model on CPU (gloo), for tests",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "calibration-out"))
    parser.add_argument("--models", default="", help="keep only these grid models (e.g. 1b,8b,custom-13b)")
    parser.add_argument("--seqs", default="", help="keep only these sequence lengths")
    parser.add_argument("--gpus", default="", help="keep only families of these GPU counts")
    parser.add_argument("--precisions", default="", help="keep only bf16 and/or fp8")
    parser.add_argument("--acs", default="", help="keep only these AC modes")
    parser.add_argument("--max-mbs", type=int, default=LADDER_TOP)
    parser.add_argument(
        "--full-ladder",
        action="store_true",
        help="start every ladder at mbs 1 (default: see --below)",
    )
    parser.add_argument(
        "--below",
        type=int,
        default=2,
        help="start each ladder this many doublings under the largest size the planner predicts to fit",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (the first compiles)")
    parser.add_argument("--timed", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=540.0, help="start nothing after this many seconds")
    parser.add_argument("--config-timeout", type=float, default=240.0)
    parser.add_argument("--resume", nargs="*", default=[], help="record files whose configurations to skip")
    parser.add_argument("--calibration", default="btj-trainer", help="calibration for the plans' predictions")
    parser.add_argument("--instance-type", default=H200_INSTANCE)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--result-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(Path(args.worker), Path(args.result_dir), args.warmup, args.timed)
        return 0

    import torch

    from blackwell_operator.calibrate.predict import load_any_calibration

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    families = GRIDS["cpu-smoke" if args.cpu_smoke else args.grid]
    if args.cpu_smoke:
        args.warmup, args.timed, args.max_mbs, args.full_ladder = 1, 2, 1, True
    keep: dict[str, list[Any]] = {
        "model": _csv(args.models),
        "sequence_length": [int(s) for s in _csv(args.seqs)],
        "gpus": [int(g) for g in _csv(args.gpus)],
        "precision": _csv(args.precisions),
        "ac": _csv(args.acs),
    }
    families = [f for f in families if all(not v or getattr(f, k) in v for k, v in keep.items())]
    # Earlier calls' records (files or folders; missing ones are fine on the first call).
    done = {r.key: r for r in read_records([p for p in args.resume if Path(p).exists()])}
    # On CPU (smoke) three "lanes" let the one- and two-process configurations run at once.
    gpus = torch.cuda.device_count() or (3 if args.cpu_smoke else 1)
    harness = Harness(
        out=out,
        cal=load_any_calibration(args.calibration),
        instance=args.instance_type,
        deadline=time.time() + args.budget_s,
        gpus=gpus,
        warmup=args.warmup,
        timed=args.timed,
        max_mbs=args.max_mbs,
        config_timeout=args.config_timeout,
        start_from_prediction=not args.full_ladder,
        below=args.below,
        done=done,
        env=environment(),
    )
    print(json.dumps({"families": len(families), "gpus": gpus, **harness.env}), flush=True)
    harness.run(families)
    text = summary(harness.records)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

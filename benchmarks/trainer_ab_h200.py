"""A/B of the trainer's speed and memory switches on one H200: each configuration in its own process.

The lead's command (one device call, nvidia-h200, from the repository root; torchao comes as a carried
wheel, as for benchmarks/trainer_h200.py):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
    PYTHONPATH=/tmp/site:trainer_image/src python3 benchmarks/trainer_ab_h200.py --out $OUT --budget-s 440

A second call: the same with ``--grid gpu-rest`` (the batch-4 half, 1B, the other variants).

FSDP2's float8 all-gather (tuning.py ``fp8_all_gather``) on one H100 rank, ``--grid fp8-all-gather``: FSDP2
on one rank (``single_device=fsdp``), FP8 tensorwise, Llama-3.2-1B untied batch 4 and 3B untied batch 2,
each with the weights all-gathered in bf16 (``fp8_all_gather=off``) and as float8 (``=on``), the same seed;
its summary (``fp8_all_gather`` in the JSON) gives tokens/s, peak reserved and the largest relative loss
difference over every step both ran. One device call (nvidia-h100-x1), wheels from titan_prepare.py:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
    PYTHONPATH=/tmp/site:trainer_image/src python3 benchmarks/trainer_ab_h200.py --grid fp8-all-gather \
        --out $OUT --budget-s 330

CPU plumbing test (tiny shape, gloo): ``python benchmarks/trainer_ab_h200.py --grid cpu --out X``.

What it measures (Llama-3.2-3B shape, untied embeddings: 3.61B parameters; sequence 4096; no AC;
torch.compile per block), in priority order until ``--budget-s`` is spent (what does not fit is recorded
as skipped):
- the single-device path (tuning.py ``single_device=auto``, the default since this measured it on 2026-12-02)
  against FSDP2 on one rank (``single_device=fsdp``), BF16 and FP8 tensorwise (torchao), batch 2 and 4;
  the single-device path with Q/K/V and gate/up fused (``fuse_projections``, BF16), and with each block's
  bf16 weight copies freed after its forward and cast again in backward (``recast_blocks``);
- inside each single-device process, step-level switches timed in interleaved windows of the same process
  (``clip_in_optimizer=false``, ``parameter_check=true``, both: the defaults' opposites): they change no
  memory;
- other switches in their own process: loss chunk 16384 at batch 4, FP8 power-of-two scales, compile
  mode max-autotune-no-cudagraphs, the Llama-3.2-1B shape at batch 4;
- one profiled process (single-device BF16 batch 2): GPU kernel time by category (torch.profiler) and the
  CUDA allocator's history replayed to its peak, live bytes by category (parameters, gradients and backward,
  optimizer state, activations, loss, other) from each block's allocation stack.
Every process re-initialises the weights from one seeded generator per parameter, so the FSDP2 and
single-device runs of one shape start from the same weights and their losses can be compared (the
summary's ``loss_max_rel_diff``).

Output (under --out): ``trainer_ab.json`` (meta, records, summary), ``profile_ab.json`` (the profiled
process), ``worker_logs.txt`` (each worker's last lines).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainer_h200 as base

REPO = Path(__file__).resolve().parents[1]
# The shapes: trainer_h200.SHAPES ("3b-untied": Llama-3.2-3B untied, 3,606,752,256 parameters, and
# "1b-untied"), the ones benchmarks/titan_h200.py runs torchtitan on.
# Each against the trainer's defaults (the clip folded into the optimizer step, the parameters scanned only
# on steps whose state is written; since 2026-12-06): the results before that date name the old switches
# (clip-in-optimizer, no-parameter-check, both) measured against the old defaults.
STEP_TOGGLES = {
    "separate-clip": "clip_in_optimizer=false",
    "parameter-check": "parameter_check=true",
    "neither": "clip_in_optimizer=false,parameter_check=true",
}


@dataclass
class AB:
    """One process: a benchmark Config plus the trainer's tuning string and what else it does."""

    cfg: base.Config
    tuning: str = ""  # BTJ_TRAINER_TUNING for the whole process
    label: str = ""
    toggles: bool = False  # time STEP_TOGGLES in windows after the base windows
    profile: bool = False  # profiler + allocator history (profile_ab.json)
    estimate_s: float = 45.0  # wall time it needs, for the budget

    @property
    def name(self) -> str:
        return f"{self.cfg.name}-{self.label}" if self.label else self.cfg.name


def _cfg(model: str, mbs: int, fp8: bool, **kw: Any) -> base.Config:
    if fp8:
        return base.fp8(model, mbs, "none", warmup=3, timed=5, **kw)
    return base.bf16(model, mbs, "none", warmup=3, timed=5, **kw)


def _gpu_grid() -> list[AB]:
    m, auto, fsdp = "3b-untied", "single_device=auto", "single_device=fsdp"
    fused, recast = f"{auto},fuse_projections=true", f"{auto},recast_blocks=true"
    grid = [
        AB(_cfg(m, 2, False), auto, "single", toggles=True, estimate_s=55),
        AB(_cfg(m, 2, False), fsdp, "fsdp", estimate_s=50),
        AB(_cfg(m, 2, True), auto, "single", toggles=True, estimate_s=55),
        AB(_cfg(m, 2, True), fsdp, "fsdp", estimate_s=50),
        AB(_cfg(m, 2, False), recast, "single-recast", estimate_s=50),
        # Where the time and the memory go, before the rest.
        AB(_cfg(m, 2, False), auto, "single-profiled", profile=True, estimate_s=55),
        AB(_cfg(m, 2, False), fused, "single-fused", toggles=True, estimate_s=55),
        AB(_cfg(m, 2, True), recast, "single-recast", estimate_s=50),
        AB(_cfg(m, 4, False), auto, "single", toggles=True, estimate_s=60),
        AB(_cfg(m, 4, True), auto, "single", toggles=True, estimate_s=60),
        AB(_cfg(m, 4, False), fsdp, "fsdp", estimate_s=55),
        AB(_cfg(m, 4, True), fsdp, "fsdp", estimate_s=55),
        AB(_cfg(m, 4, False), recast, "single-recast", estimate_s=55),
        AB(_cfg(m, 4, True), recast, "single-recast", estimate_s=55),
        AB(_cfg(m, 4, False), fused, "single-fused", estimate_s=55),
        AB(_cfg(m, 4, False, loss_chunk=16384), auto, "single-chunk16k", estimate_s=50),
        AB(_cfg(m, 2, True), f"{auto},fp8_pow2_scales=true", "single-pow2", estimate_s=50),
        AB(_cfg("1b-untied", 4, False), auto, "single", estimate_s=35),
        AB(_cfg("1b-untied", 4, False), fsdp, "fsdp", estimate_s=35),
        AB(_cfg("1b-untied", 4, True), auto, "single", estimate_s=35),
        AB(_cfg("1b-untied", 4, True), fsdp, "fsdp", estimate_s=35),
        AB(_cfg(m, 2, False), f"{auto},compile_mode=max-autotune-no-cudagraphs", "single-autotune",
           estimate_s=120),
    ]  # fmt: skip
    return grid


def _fp8_all_gather_grid() -> list[AB]:
    """FSDP2 on one rank, FP8 tensorwise: weights all-gathered in bf16, then as float8 (same seed)."""
    fsdp = "single_device=fsdp,fp8_all_gather"
    return [
        AB(base.fp8(model, mbs, "none", warmup=3, timed=12), f"{fsdp}={switch}", label, estimate_s=estimate)
        for model, mbs, estimate in (("1b-untied", 4, 45.0), ("3b-untied", 2, 60.0))
        for switch, label in (("off", "fsdp"), ("on", "fsdp-fp8gather"))
    ]


def _fp8_all_gather_cpu() -> list[AB]:
    """The same pairs on the tiny shape, FSDP2 on one gloo rank (float8 matmuls run on the CPU too)."""
    fsdp = "single_device=fsdp,fp8_all_gather"
    tiny = base.fp8("tiny", 2, "none", compile=False, warmup=1, timed=2)
    return [
        AB(tiny, f"{fsdp}=off", "fsdp", estimate_s=5),
        AB(tiny, f"{fsdp}=on", "fsdp-fp8gather", estimate_s=5),
    ]


def _cpu_grid() -> list[AB]:
    def tiny() -> base.Config:
        return base.bf16("tiny", 2, "none", compile=False, warmup=1, timed=2)

    return [
        AB(tiny(), "single_device=auto", "single", toggles=True, estimate_s=5),
        AB(tiny(), "single_device=fsdp", "fsdp", estimate_s=5),
        AB(tiny(), "single_device=auto,fuse_projections=true", "single-fused", estimate_s=5),
        AB(tiny(), "single_device=auto,recast_blocks=true", "single-recast", estimate_s=5),
        # The compiled blocks (inductor on the CPU), as on the GPU: fused projections, the switches.
        AB(
            base.bf16("tiny", 2, "none", warmup=2, timed=2),
            "single_device=auto,fuse_projections=true",
            "single-fused",
            toggles=True,
            estimate_s=5,
        ),
        AB(tiny(), "single_device=auto", "single-profiled", profile=True, estimate_s=5),
        AB(tiny(), "single_device=auto", "never-fits", estimate_s=10**6),  # the budget's skip path
    ]


def _gpu_rest() -> list[AB]:
    """What one 440 s call of ``gpu`` leaves out (its first 8 processes fit): batch 4 and the rest."""
    return _gpu_grid()[8:]


GRIDS = {
    "gpu": _gpu_grid,
    "gpu-rest": _gpu_rest,
    "cpu": _cpu_grid,
    "fp8-all-gather": _fp8_all_gather_grid,
    "fp8-all-gather-cpu": _fp8_all_gather_cpu,
}


@dataclass
class Result:
    """What one process measured (or why it did not)."""

    name: str
    tuning: str
    config: dict[str, Any]
    status: str  # ok | oom | error | skipped | timeout
    single_device: bool | None = None
    fp8_all_gather: bool | None = None  # FSDP2 gathered the float8 weights as float8 (as built)
    architecture: dict[str, Any] = field(default_factory=dict)  # trainer_h200.SHAPES[model], as trained
    parameters: int | None = None
    tokens_per_s: float | None = None
    step_seconds: list[float] = field(default_factory=list)
    windows: dict[str, list[float]] = field(default_factory=dict)  # toggle -> step seconds
    toggle_tokens_per_s: dict[str, float] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    alloc_retries: int | None = None  # the caching allocator's cudaFree-and-retry count (slow steps)
    first_step_seconds: float | None = None
    setup_seconds: float | None = None
    wall_seconds: float | None = None
    detail: str = ""


# ----------------------------------------------------------------------------------------------- worker


def _reinit(model: Any, device: Any) -> None:
    """Every parameter from its own seeded generator (normal, std 0.02; norm scales 1): the same start
    for FSDP2 (one-rank DTensors: the local tensor is the whole) and the single-device module."""
    import torch

    with torch.no_grad():
        for index, (_name, param) in enumerate(model.named_parameters()):
            local = param.to_local() if hasattr(param, "to_local") else param
            if local.dim() < 2:
                local.fill_(1.0)
                continue
            gen = torch.Generator(device=device).manual_seed(10_000 + index)
            local.copy_(torch.randn(local.shape, generator=gen, device=device, dtype=torch.float32) * 0.02)


def _time_window(trainer: Any, batches: list[Any], steps: int, losses: list[float]) -> list[float]:
    times = []
    for _ in range(steps):
        result = trainer.step(batches)
        losses.append(round(result.loss, 5))
        times.append(round(result.seconds, 5))
    return times


def worker(ab: AB, out: Path) -> None:
    """Run one process's measurement; writes ``out/record.json`` (and ``out/profile.json``)."""
    import torch

    from blackwell_trainer.data.tokens import Batch
    from blackwell_trainer.loop.trainer import Trainer
    from blackwell_trainer.parallel.runtime import Runtime, init_distributed
    from blackwell_trainer.plan.tuning import Tuning

    cfg = ab.cfg
    rec = Result(ab.name, ab.tuning, asdict(cfg), "error", architecture=dict(base.SHAPES[cfg.model]))
    cuda = torch.cuda.is_available()
    try:
        if ab.profile and cuda:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
        started = time.perf_counter()
        runtime = Runtime.from_env()
        init_distributed(runtime)
        trainer = Trainer(base.make_plan(cfg), runtime, tuning=Tuning.parse(ab.tuning))
        rec.single_device = trainer.single_device
        rec.fp8_all_gather = trainer.precision.fp8_all_gather
        rec.parameters = sum(p.numel() for p in trainer.model.parameters())
        _reinit(trainer.model, runtime.device)
        gen = torch.Generator(device=runtime.device).manual_seed(1234)
        vocab, shape = trainer.plan.architecture.vocab_size, (cfg.mbs, trainer.plan.sequence_length)
        batches = [Batch(torch.randint(0, vocab, shape, device=runtime.device, generator=gen),
                         torch.randint(0, vocab, shape, device=runtime.device, generator=gen))]  # fmt: skip
        rec.setup_seconds = round(time.perf_counter() - started, 2)
        losses: list[float] = []
        warm = _time_window(trainer, batches, cfg.warmup, losses)
        rec.first_step_seconds = warm[0] if warm else None
        plain = trainer.tuning
        rec.step_seconds = _time_window(trainer, batches, cfg.timed, losses)
        if ab.toggles:
            # Interleaved windows in this process (no memory change): toggle, base, toggle, ...
            for _round in range(2):
                for label, text in STEP_TOGGLES.items():
                    trainer.tuning = Tuning.parse(f"{ab.tuning},{text}")
                    rec.windows.setdefault(label, []).extend(_time_window(trainer, batches, 3, losses))
                trainer.tuning = plain
                rec.step_seconds += _time_window(trainer, batches, 3, losses)
        rec.losses = losses
        tokens = trainer.tokens_per_micro_batch
        rec.tokens_per_s = round(tokens / statistics.median(rec.step_seconds), 1)
        rec.toggle_tokens_per_s = {k: round(tokens / statistics.median(v), 1) for k, v in rec.windows.items()}
        if cuda:
            rec.peak_allocated_gib = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            rec.peak_reserved_gib = round(torch.cuda.max_memory_reserved() / 2**30, 3)
            rec.alloc_retries = int(torch.cuda.memory_stats().get("num_alloc_retries", 0))
        rec.status = "ok"
        if ab.profile:
            _write_profile(trainer, batches, out / "profile.json", ab.name, cuda)
    except torch.OutOfMemoryError as err:
        rec.status, rec.detail = "oom", str(err).splitlines()[0][:300]
        if cuda:
            rec.peak_reserved_gib = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    except Exception as err:  # recorded, not raised: the grid goes on
        rec.detail = f"{type(err).__name__}: {err}"[:600] + " | " + traceback.format_exc()[-1500:]
    finally:
        (out / "record.json").write_text(json.dumps(asdict(rec)))
        sys.stdout.flush()
        os._exit(0)


def _write_profile(trainer: Any, batches: list[Any], path: Path, name: str, cuda: bool) -> None:
    """Allocator history replayed to its peak (by category) and two profiled steps' kernel time."""
    import torch

    report: dict[str, Any] = {"name": name}
    if cuda:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        report["memory_at_peak"] = memory_categories(snapshot)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            trainer.step(batches)
        if cuda:
            torch.cuda.synchronize()
    totals: dict[str, float] = {}
    top: list[tuple[float, int, str]] = []
    for evt in prof.key_averages():
        if "#" in evt.key or evt.key.startswith("Profiler"):
            continue
        if cuda and evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        t = (
            float(getattr(evt, "self_device_time_total", 0.0) or 0.0)
            if cuda
            else float(evt.self_cpu_time_total)
        )
        totals[base._categorise(evt.key)] = totals.get(base._categorise(evt.key), 0.0) + t
        top.append((t, evt.count, evt.key[:160]))
    top.sort(reverse=True)
    report["kernel_seconds_by_category_2_steps"] = {k: round(v / 1e6, 4) for k, v in totals.items()}
    report["top_kernels"] = [{"seconds": round(t / 1e6, 4), "count": c, "name": k} for t, c, k in top[:30]]
    path.write_text(json.dumps(report, indent=1))


# Frames that say what an allocation is (first match in the stack, innermost first).
_CATEGORIES = (
    ("parameters", ("init_weights", "to_empty", "_reinit", "_apply")),
    ("optimizer state", ("_init_group", "adam", "adamw")),
    ("loss", ("loss.py",)),
    ("grad norm / clip / checks", ("clip_grad", "get_total_norm", "finite_check", "_optimizer_step")),
    ("data", ("randint",)),
)


def _category(frames: list[dict[str, Any]]) -> str:
    if not frames:
        return "backward thread (gradients, backward temporaries)"
    for category, keys in _CATEGORIES:
        for frame in frames:
            text = f"{frame.get('filename', '')}:{frame.get('name', '')}"
            if any(key in text for key in keys):
                return category
    # The compiled backward runs as Python on autograd's device thread: its frames say "backward".
    if any("backward" in f.get("name", "") for f in frames):
        return "backward thread (gradients, backward temporaries)"
    if any(
        k in f.get("filename", "") for f in frames for k in ("model/transformer.py", "inductor", "_dynamo")
    ):
        return "activations (forward)"
    return "other"


def memory_categories(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Replay the allocator's trace; the live bytes by category at the moment of the most live bytes."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[str, int] = {}
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            action, addr, size = event.get("action"), event.get("addr"), int(event.get("size", 0))
            if action == "alloc":
                live[addr] = (size, _category(event.get("frames", [])))
                total += size
                if total > peak:
                    peak = total
                    at_peak = {}
                    for s, c in live.values():
                        at_peak[c] = at_peak.get(c, 0) + s
            elif action in ("free_completed",) and addr in live:
                total -= live.pop(addr)[0]
    reserved = sum(int(s.get("total_size", 0)) for s in snapshot.get("segments", []))
    events = sum(len(trace) for trace in snapshot.get("device_traces", []))
    return {
        # At the history's cap (1,000,000) the oldest allocations (the weights) fell out of the replay.
        "trace_events": events,
        "peak_live_gib": round(peak / 2**30, 3),
        "by_category_gib": {
            k: round(v / 2**30, 3) for k, v in sorted(at_peak.items(), key=lambda kv: -kv[1])
        },
        "reserved_at_snapshot_gib": round(reserved / 2**30, 3),
    }


# ----------------------------------------------------------------------------------------------- parent


def run_one(ab: AB, deadline: float, logs: Path, out: Path) -> Result:
    remaining = deadline - time.time()
    if remaining < ab.estimate_s:
        return Result(ab.name, ab.tuning, asdict(ab.cfg), "skipped",
                      detail=f"budget: {remaining:.0f} s left, needs ~{ab.estimate_s:.0f} s")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="btj-ab-"))
    env = dict(os.environ)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    env["PYTHONPATH"] = f"{REPO / 'trainer_image' / 'src'}:{env.get('PYTHONPATH', '')}"
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, __file__, "--worker", json.dumps(_ab_json(ab)), "--out", str(tmp)]
    started = time.time()
    log_path = tmp / "log.txt"
    try:
        with open(log_path, "w") as log_file:
            subprocess.run(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                           timeout=max(remaining - 5, 1), check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return Result(ab.name, ab.tuning, asdict(ab.cfg), "timeout", wall_seconds=time.time() - started)
    finally:
        lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
        with open(logs, "a") as f:
            f.write(f"===== {ab.name} [{ab.tuning}] (last 60 lines)\n" + "\n".join(lines[-60:]) + "\n")
    path = tmp / "record.json"
    if not path.exists():
        tail = log_path.read_text(errors="replace")[-1200:] if log_path.exists() else ""
        return Result(ab.name, ab.tuning, asdict(ab.cfg), "error", detail=f"no record; log tail: {tail}")
    rec = Result(**json.loads(path.read_text()))
    rec.wall_seconds = round(time.time() - started, 1)
    if (tmp / "profile.json").exists():
        (out / "profile_ab.json").write_text((tmp / "profile.json").read_text())
    return rec


def _ab_json(ab: AB) -> dict[str, Any]:
    data = asdict(ab)
    data["cfg"] = asdict(ab.cfg)
    return data


def _ab_from_json(data: dict[str, Any]) -> AB:
    return AB(**{**data, "cfg": base.Config(**data["cfg"])})


def summary(records: list[Result]) -> list[dict[str, Any]]:
    """Each single-device record (of each variant) against its FSDP2 twin (same shape, batch, precision)."""
    by_key = {(r.config["model"], r.config["mbs"], r.config["recipe"], r.name.rsplit("-", 1)[-1]): r
              for r in records if r.status == "ok"}  # fmt: skip
    rows = []
    for (model, mbs, recipe, label), rec in by_key.items():
        twin = by_key.get((model, mbs, recipe, "fsdp"))
        # The profiled run records allocator history as it goes (slower): not a speed figure. The float8
        # all-gather is an FSDP2 variant: fp8_all_gather_summary pairs it.
        if (
            label in ("fsdp", "profiled", "fp8gather")
            or twin is None
            or not rec.tokens_per_s
            or not twin.tokens_per_s
        ):
            continue
        n = min(len(rec.losses), len(twin.losses), rec.config["warmup"] + rec.config["timed"])
        diffs = [abs(a - b) / max(abs(b), 1e-6) for a, b in zip(rec.losses[:n], twin.losses[:n], strict=True)]
        rows.append({
            "config": rec.config["model"] + f" mbs{mbs} {recipe}",
            "variant": label,
            "single_tokens_per_s": rec.tokens_per_s,
            "fsdp_tokens_per_s": twin.tokens_per_s,
            "speedup": round(rec.tokens_per_s / twin.tokens_per_s, 4),
            "toggles_speedup": {k: round(v / rec.tokens_per_s, 4)
                                for k, v in rec.toggle_tokens_per_s.items()},
            "single_reserved_gib": rec.peak_reserved_gib,
            "fsdp_reserved_gib": twin.peak_reserved_gib,
            "loss_max_rel_diff_first_steps": round(max(diffs), 6) if diffs else None,
        })  # fmt: skip
    return rows


def fp8_all_gather_summary(records: list[Result]) -> list[dict[str, Any]]:
    """Each float8 all-gather run against its bf16-gather twin (FSDP2, same shape, batch and seed)."""
    by_key = {(r.config["model"], r.config["mbs"], r.name.rsplit("-", 1)[-1]): r
              for r in records if r.status == "ok" and r.config["recipe"] != "none"}  # fmt: skip
    rows = []
    for (model, mbs, label), on in by_key.items():
        off = by_key.get((model, mbs, "fsdp"))
        if label != "fp8gather" or off is None or not on.tokens_per_s or not off.tokens_per_s:
            continue
        n = min(len(on.losses), len(off.losses))
        diffs = [abs(a - b) / max(abs(b), 1e-6) for a, b in zip(on.losses[:n], off.losses[:n], strict=True)]
        rows.append({
            "config": f"{model} mbs{mbs} {on.config['recipe']} fsdp2 one rank",
            "bf16_gather_tokens_per_s": off.tokens_per_s,
            "fp8_gather_tokens_per_s": on.tokens_per_s,
            "speedup": round(on.tokens_per_s / off.tokens_per_s, 4),
            "bf16_gather_reserved_gib": off.peak_reserved_gib,
            "fp8_gather_reserved_gib": on.peak_reserved_gib,
            "steps_compared": n,
            # Both runs learn one fixed batch by heart: the relative difference of two losses near zero
            # is large however close the runs are, so the first step's and each step's are given too.
            "loss_first_step_rel_diff": round(diffs[0], 6) if diffs else None,
            "loss_rel_diff_per_step": [round(d, 4) for d in diffs],
            "loss_max_rel_diff": round(max(diffs), 6) if diffs else None,
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", default="gpu", choices=sorted(GRIDS))
    parser.add_argument("--out", default=os.environ.get("OUT", "ab-out"))
    parser.add_argument("--budget-s", type=float, default=430.0, help="start nothing that would end later")
    parser.add_argument("--only", default="", help="comma-separated names to keep")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        worker(_ab_from_json(json.loads(args.worker)), out)
        return
    deadline = time.time() + args.budget_s
    grid = GRIDS[args.grid]()
    if args.only:
        grid = [ab for ab in grid if ab.name in set(args.only.split(","))]
    meta = base.environment()
    meta["command"] = " ".join([sys.executable, *sys.argv])
    meta["budget_s"] = args.budget_s
    records: list[Result] = []
    logs = out / "worker_logs.txt"
    for ab in grid:
        rec = run_one(ab, deadline, logs, out)
        records.append(rec)
        data = {
            "meta": meta,
            "records": [asdict(r) for r in records],
            "summary": summary(records),
            "fp8_all_gather": fp8_all_gather_summary(records),
        }
        (out / "trainer_ab.json").write_text(json.dumps(data, indent=1))
        tok = f"{rec.tokens_per_s:,.0f} tok/s" if rec.tokens_per_s else ""
        mem = f"resv {rec.peak_reserved_gib} GiB" if rec.peak_reserved_gib else ""
        print(f"[{time.strftime('%H:%M:%S')}] {rec.name}: {rec.status} {tok} {mem} "
              f"{rec.toggle_tokens_per_s or ''} {rec.detail[:300]}", flush=True)  # fmt: skip
    print(
        json.dumps({"summary": summary(records), "fp8_all_gather": fp8_all_gather_summary(records)}, indent=1)
    )


if __name__ == "__main__":
    main()

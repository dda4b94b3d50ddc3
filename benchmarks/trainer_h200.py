"""H200 throughput grid for the trainer: one call runs every configuration, each in its own process.

Usage (on the GPU machine, from the repository root, trainer_image/src on PYTHONPATH):

    python benchmarks/trainer_h200.py --grid one --out $OUT --budget-s 540

Grids: ``smoke`` (GPU correctness checks + two small configurations), ``one`` (1B/3B/8B on one GPU),
``two`` (8B on two GPUs). One-GPU configurations run in parallel lanes, one per visible GPU; two-GPU
configurations run under torchrun when both GPUs are free. Each configuration is a subprocess, so an OOM
or a crash becomes a record instead of ending the grid. Records go to ``OUT/trainer_h200.json`` after
every configuration; a short table is printed last. Tokens/s per GPU = tokens per step per GPU / the
median time of the timed steps (after warm-up steps, the first of which compiles).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SEQ = 4096
LLAMA32_ROPE_SCALING = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position_embeddings=8192)  # fmt: skip
PEAK_BF16 = 989e12  # the reference grid's MFU denominator (H200 SXM dense BF16)
REPO = Path(__file__).resolve().parents[1]

# Preset shapes (Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B), hard-coded: the script needs only the trainer.
SHAPES: dict[str, dict[str, Any]] = {
    "1b": dict(hidden_size=2048, num_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),
    "3b": dict(hidden_size=3072, num_layers=28, num_attention_heads=24, num_key_value_heads=8,
               intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, num_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
    # benchmarks/titan_h200.py's side by side with torchtitan, whose llama3 has no tying: the same two
    # shapes untied, with Llama 3.2's RoPE scaling (benchmarks/titan_shapes.py: torchtitan's spelling; a
    # test holds the two equal).
    "3b-untied": dict(hidden_size=3072, num_layers=28, num_attention_heads=24, num_key_value_heads=8,
                      intermediate_size=8192, vocab_size=128256, tie_word_embeddings=False,
                      rope_scaling=LLAMA32_ROPE_SCALING),
    "1b-untied": dict(hidden_size=2048, num_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=8192, vocab_size=128256, tie_word_embeddings=False,
                      rope_scaling=LLAMA32_ROPE_SCALING),
    "tiny": dict(hidden_size=256, num_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512, vocab_size=1024, tie_word_embeddings=True),
}  # fmt: skip


@dataclass
class Config:
    """One benchmark point."""

    model: str
    mbs: int
    ac: str = "none"
    precision: str = "bf16"
    recipe: str = "none"
    gpus: int = 1
    compile: bool = True
    loss_chunk: int = 8192
    sdpa: str = "default"
    warmup: int = 3
    timed: int = 6
    profile: bool = False
    kind: str = "train"  # train | check | te-check | flex-check
    # Packed chat rows (issue 28): the mean conversation length in tokens (0: plain rows, no document
    # mask). Conversations of lengths drawn around it fill each row; the first half of each is masked
    # out of the loss (the user's turn), as a chat data set's mask would.
    docmask: int = 0
    # This run's trainer switches (BTJ_TRAINER_TUNING syntax, over the environment's): a process-level A/B.
    tuning: str = ""
    # In-process A/B after the timed steps: ";"-separated switch sets, each timed over `window` steps and
    # followed by `window` steps of the run's own switches, so each variant has a baseline beside it.
    windows: str = ""
    window: int = 10

    @property
    def name(self) -> str:
        prec = "bf16" if self.precision == "bf16" else self.recipe.replace("torchao-", "fp8-")
        prec = prec if prec == "bf16" or prec.startswith("fp8-") else f"te-{prec}"  # TE recipes
        extra = "" if self.compile else "-eager"
        extra += "" if self.loss_chunk else "-fullce"
        extra += "" if self.sdpa == "default" else f"-{self.sdpa}"
        extra += f"-docs{self.docmask}" if self.docmask else ""
        extra += "".join(
            f"-{item.strip().replace('=', '_')}" for item in self.tuning.split(",") if item.strip()
        )
        return f"{self.model}-g{self.gpus}-mbs{self.mbs}-{self.ac}-{prec}{extra}"


def fp8(
    model: str, mbs: int, ac: str, gpus: int = 1, recipe: str = "torchao-tensorwise", **kw: Any
) -> Config:
    return Config(model, mbs, ac, "fp8", recipe, gpus, **kw)


def bf16(model: str, mbs: int, ac: str, gpus: int = 1, **kw: Any) -> Config:
    return Config(model, mbs, ac, gpus=gpus, **kw)


GRIDS: dict[str, list[Config]] = {
    "smoke": [
        Config("tiny", 2, kind="check"),
        bf16("1b", 4, "none"),
        fp8("1b", 4, "selective"),
        bf16("3b", 4, "selective", sdpa="cudnn", warmup=2, timed=3),
    ],
    # Ordered by priority (lanes take from the front): the targets' candidates first.
    "one": [
        bf16("3b", 4, "none"),
        fp8("3b", 4, "none"),
        bf16("3b", 6, "none"),
        fp8("3b", 6, "none"),
        bf16("3b", 8, "selective"),
        fp8("3b", 8, "selective"),
        fp8("3b", 4, "none", recipe="torchao-rowwise"),
        bf16("3b", 4, "none", compile=False),
        bf16("8b", 2, "full", timed=4),
        fp8("8b", 4, "full", timed=4),
        bf16("8b", 4, "full", timed=4),
        bf16("1b", 8, "none"),
        fp8("1b", 8, "none"),
        bf16("1b", 16, "selective"),
        bf16("8b", 1, "selective", timed=4),
        bf16("3b", 4, "none", loss_chunk=0),
    ],
    # Repeat of each target's best configuration, one at a time (no parallel lane), plus the one skipped.
    "confirm": [
        bf16("3b", 8, "selective"),
        fp8("3b", 8, "selective"),
        bf16("8b", 4, "selective", gpus=2),
        fp8("8b", 4, "selective", gpus=2),
        bf16("8b", 8, "full", gpus=2),
    ],
    # Transformer Engine (installed beside torch): correctness on the tiny model, then the torchao FP8
    # targets' configurations with each TE FP8 recipe (TE modules run eager: compile is skipped for them).
    "te": [
        Config("tiny", 2, kind="te-check"),
        fp8("3b", 8, "selective", recipe="delayed"),
        fp8("3b", 8, "selective", recipe="current"),
        fp8("3b", 8, "selective", recipe="block"),
        fp8("1b", 8, "none", recipe="delayed"),
        fp8("1b", 8, "none", recipe="current"),
        fp8("1b", 8, "none", recipe="block"),
        fp8("3b", 8, "full", recipe="delayed"),
        bf16("3b", 8, "selective", compile=False),
    ],
    # The single-device path (the default on one GPU since 2026-12-02) on the planner's one-GPU picks of
    # "one", AC and the document mask included, which its A/B (trainer_ab_h200.py) did not run: the
    # GPU-only failures its CPU tests cannot show, and records to compare with the FSDP2 ones of "one".
    "single": [
        bf16("8b", 2, "full", timed=4, docmask=2048),
        bf16("8b", 2, "full", timed=4),
        fp8("8b", 4, "full", timed=4),
        bf16("3b", 8, "selective"),
        fp8("3b", 8, "selective"),
        bf16("3b", 4, "none"),
        fp8("1b", 8, "none"),
        bf16("1b", 16, "selective"),
        bf16("8b", 4, "full", timed=4),
        bf16("1b", 8, "none"),
    ],
    # Issue 37: what a 3B FP8 step pays beyond the planner's model on the H100 (its AC-none runs measured
    # 5-6% under the fit where 1B's matched): each model at an AC-none size of the calibration grid, in
    # FP8 and in BF16, to profile side by side (--profile with every name) and set the cast kernels apart.
    "fp8cost": [
        fp8("3b", 2, "none"),
        bf16("3b", 2, "none"),
        fp8("1b", 8, "none"),
        bf16("1b", 8, "none"),
    ],
    # Issue 28: packed, document-masked fine-tuning against plain rows of the same 8B-size plan, on one GPU.
    "sft": [
        Config("3b", 2, kind="flex-check"),
        bf16("8b", 2, "full", timed=4),
        bf16("8b", 2, "full", timed=4, docmask=512),
        bf16("8b", 2, "full", timed=4, docmask=2048),
        bf16("8b", 2, "full", timed=4, docmask=4096),
        bf16("3b", 4, "none"),
        bf16("3b", 4, "none", docmask=512),
        bf16("3b", 4, "none", docmask=2048),
    ],
    "sft-cpu": [
        bf16("tiny", 2, "none", compile=False, warmup=1, timed=2),
        bf16("tiny", 2, "none", compile=False, warmup=1, timed=2, docmask=24),
    ],
    # Plumbing test on a CPU machine (gloo): python benchmarks/trainer_h200.py --grid cpu
    "cpu": [
        Config("tiny", 2, kind="check"),
        bf16("tiny", 2, "selective", compile=False, warmup=1, timed=2),
        bf16("tiny", 2, "full", gpus=2, compile=False, warmup=1, timed=2),
    ],
    "two": [
        bf16("8b", 2, "none", gpus=2),
        fp8("8b", 4, "selective", gpus=2),
        fp8("8b", 2, "none", gpus=2),
        bf16("8b", 4, "selective", gpus=2),
        fp8("8b", 8, "full", gpus=2),
        bf16("8b", 8, "full", gpus=2),
    ],
}


@dataclass
class Record:
    """What one configuration measured (or why it did not)."""

    name: str
    config: dict[str, Any]
    status: str  # ok | oom | error | skipped | timeout
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    step_seconds: list[float] = field(default_factory=list)
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    setup_seconds: float | None = None
    first_step_seconds: float | None = None
    losses: list[float] = field(default_factory=list)
    detail: str = ""
    # Tokens over the wall time of all timed steps together (host clock from the end of the last warm-up
    # step to the end of the last timed one): what a peer's tokens/s over a logging window measures.
    window_tokens_per_s: float | None = None
    ab_windows: list[dict[str, Any]] = field(default_factory=list)
    # The allocator's history was recorded while it ran (BTJ_BENCH_MEMORY_SNAPSHOT, memory_snapshot.py):
    # every allocation paid for its stack trace, so its step times are no calibration record's.
    memory_history: bool = False


# ----------------------------------------------------------------------------------------------- worker


def make_plan(cfg: Config) -> Any:
    from blackwell_trainer.plan.config import (
        Architecture,
        Candidate,
        GpuInfo,
        MemoryBreakdown,
        OptimizerConfig,
        Plan,
        Prediction,
    )

    arch = Architecture(**SHAPES[cfg.model])
    zero = dict.fromkeys(
        ["parameters", "gradients", "optimizer_states", "activations", "loss", "fsdp_transient",
         "precision_overhead", "workspace", "fragmentation", "peak_allocated", "peak_reserved"], 0
    )  # fmt: skip
    return Plan(
        model_name=cfg.model,
        architecture=arch,
        parameter_count=arch.parameter_count(),
        gpu=GpuInfo(
            name="H200", compute_capability="9.0", memory_bytes=141 * 10**9, peak_bf16_flops=PEAK_BF16
        ),
        instance_type="ml.p5e.48xlarge",
        nodes=1,
        gpus_per_node=cfg.gpus,
        sequence_length=SEQ if cfg.model != "tiny" else 256,
        global_batch_tokens=cfg.mbs * SEQ * cfg.gpus,
        steps=1000,
        chosen=Candidate(
            precision=cfg.precision,
            precision_recipe=cfg.recipe,
            activation_checkpointing=cfg.ac,
            micro_batch_size=cfg.mbs,
            gradient_accumulation_steps=1,
            sharding="full",
            shard_degree=cfg.gpus,
            replicate_degree=1,
            compile=cfg.compile,
            loss_chunk_tokens=cfg.loss_chunk,
        ),
        predicted=Prediction(
            tokens_per_second_per_gpu=0,
            step_time_seconds=0,
            model_flops_utilization=0,
            memory=MemoryBreakdown(peak_phase="forward", **zero),
        ),
        optimizer=OptimizerConfig(warmup_steps=10, learning_rate=3e-4),
    )


def _sdpa_context(name: str) -> contextlib.AbstractContextManager[Any]:
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]
    return sdpa_kernel([backend])


def _categorise(name: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "communication (NCCL)"
    if any(k in n for k in ("flash", "fmha", "attention", "cudnn")):
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "xmma", "cutlass", "matmul", "sm90", "cublas")):
        return "matmul"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer"
    if "triton" in n:
        return "compiled fusions (triton)"
    return "other (eager elementwise, copies, reductions)"


def _profile(trainer: Any, batches: list[Any], out: Path, name: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            trainer.step(batches)
        if torch.cuda.is_available():  # a CPU run profiles too (tests): host operations only
            torch.cuda.synchronize()
    rows = []
    totals: dict[str, float] = {}
    for evt in prof.key_averages():
        # Kernels only: skip user annotations ("Optimizer.step#AdamW.step", "ProfilerStep*") on the timeline.
        if (
            evt.device_type != torch.autograd.DeviceType.CUDA
            or "#" in evt.key
            or evt.key.startswith("Profiler")
        ):
            continue
        t = float(getattr(evt, "self_device_time_total", 0.0) or getattr(evt, "self_cuda_time_total", 0.0))
        rows.append((t, evt.count, evt.key))
        cat = _categorise(evt.key)
        totals[cat] = totals.get(cat, 0.0) + t
    rows.sort(reverse=True)
    total = sum(totals.values()) or 1.0
    lines = [f"### profile {name}: GPU kernel time over 2 steps, {total / 1e6:.3f} s", ""]
    lines += [
        f"{cat:48s} {t / 1e6:8.3f} s  {100 * t / total:5.1f}%"
        for cat, t in sorted(totals.items(), key=lambda kv: -kv[1])
    ]
    lines += ["", "top kernels (self GPU time):"]
    lines += [f"{t / 1e3:10.1f} ms {c:6d}x  {k[:150]}" for t, c, k in rows[:25]]
    out.write_text("\n".join(lines) + "\n")
    # Every kernel, not just the top 25: what a model's fit needs (cast and amax kernels are many small ones).
    kernels = [{"us": t, "count": c, "kernel": k, "category": _categorise(k)} for t, c, k in rows]
    (out.parent / f"kernels_{name}.json").write_text(json.dumps(kernels, indent=1) + "\n")
    # The kernels' sum is not the step: where the GPU waited for the host, and on what (gpu_gaps.py).
    from benchmarks.gpu_gaps import summarise

    trace = out.parent / f"trace_{name}.json"
    prof.export_chrome_trace(str(trace))
    gaps = summarise(json.loads(trace.read_text()).get("traceEvents", []))
    trace.unlink()  # hundreds of MB at 3B, and its summary is what comes back
    (out.parent / f"gaps_{name}.json").write_text(json.dumps(gaps, indent=1) + "\n")
    with open(out, "a") as f:
        f.write(
            f"\nGPU idle over the 2 steps: {gaps['idle_us'] / 1e3:.1f} ms of {gaps['window_us'] / 1e3:.1f} ms"
            f" ({gaps['host_bound_us'] / 1e3:.1f} ms host-bound); by the host operations around the launch:\n"
        )
        f.writelines(
            f"{g['idle_us'] / 1e3:10.2f} ms {g['gaps']:6d}x  {g['host_ops'][:150]}\n" for g in gaps["groups"]
        )


def _check(out: Path) -> Record:
    """GPU correctness: chunked loss vs plain CE (values, grads), AC modes vs none, FP8 step runs."""
    import torch

    from blackwell_trainer.model.loss import chunked_cross_entropy, plain_cross_entropy
    from blackwell_trainer.model.transformer import build_model
    from blackwell_trainer.parallel.parallelize import apply_ac, apply_compile
    from blackwell_trainer.plan.config import ActivationCheckpointing, Architecture

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    notes = []
    torch.manual_seed(0)
    h = torch.randn(4096, 512, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (0.05 * torch.randn(32000, 512, device=dev, dtype=torch.bfloat16)).requires_grad_()
    y = torch.randint(0, 32000, (4096,), device=dev)
    y[::7] = -100
    ref = plain_cross_entropy(h, w, y)
    gh_ref, gw_ref = torch.autograd.grad(ref, (h, w))
    got = chunked_cross_entropy(h, w, y, 1000)
    gh, gw = torch.autograd.grad(got, (h, w))

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b.float()).norm() / b.float().norm())

    notes.append(f"chunked CE bf16: loss rel {abs(got.item() - ref.item()) / ref.item():.2e} "
                 f"grad_h rel {rel(gh, gh_ref):.2e} grad_w rel {rel(gw, gw_ref):.2e}")  # fmt: skip
    arch = Architecture(**SHAPES["tiny"])
    grads = {}
    tokens = torch.randint(0, arch.vocab_size, (2, 256), device=dev)
    for mode in ActivationCheckpointing:
        model = build_model(arch, max_seq_len=256, loss_chunk_tokens=128)
        apply_ac(model.layers, mode)
        apply_compile(model.layers)
        model.to_empty(device=dev)
        torch.manual_seed(1)
        model.init_weights(buffer_device=dev)
        loss = model(tokens, tokens)
        loss.backward()
        grads[mode.value] = torch.cat([p.grad.flatten() for p in model.parameters()])
    for mode in ("selective", "full"):
        notes.append(f"AC {mode} vs none (compiled, fp32): grad rel {rel(grads[mode], grads['none']):.2e}")
    if dev.type == "cuda":
        notes += _sdpa_timings()
    (out / "check.txt").write_text("\n".join(notes) + "\n")
    return Record("check", {}, "ok", detail="; ".join(notes))


def _te_check(out: Path) -> Record:
    """TE FP8 recipes vs BF16 on the tiny model through the trainer (6 steps, one fixed batch, each AC mode
    for DelayedScaling): every loss finite and within 5% (relative) of the BF16 run's loss at that step."""
    import math

    import torch

    # TE before any BF16 step: its core library dlopens the system cuDNN, which fails with an undefined
    # symbol (libcudnn_graph.so.9) once torch's attention has loaded the pip package's cuDNN (2026-11-29).
    import transformer_engine.pytorch  # noqa: F401

    from blackwell_trainer.data.tokens import Batch
    from blackwell_trainer.loop.trainer import Trainer
    from blackwell_trainer.parallel.runtime import Runtime, init_distributed

    runtime = Runtime.from_env()
    init_distributed(runtime)
    runs = [("none", "bf16", "none"), ("none", "fp8", "delayed"), ("none", "fp8", "current"),
            ("none", "fp8", "block"), ("selective", "fp8", "delayed"), ("full", "fp8", "delayed"),
            ("selective", "bf16", "none")]  # fmt: skip
    curves: dict[str, list[float]] = {}
    notes, ok = [], True
    for ac, precision, recipe in runs:
        cfg = Config("tiny", 4, ac, precision, recipe, compile=False)
        try:
            trainer = Trainer(make_plan(cfg), runtime)
            gen = torch.Generator(device=runtime.device).manual_seed(1234)
            shape = (cfg.mbs, trainer.plan.sequence_length)
            vocab = trainer.plan.architecture.vocab_size
            batch = [Batch(torch.randint(0, vocab, shape, device=runtime.device, generator=gen),
                           torch.randint(0, vocab, shape, device=runtime.device, generator=gen))]  # fmt: skip
            curves[cfg.name] = [trainer.step(batch).loss for _ in range(6)]
            losses = " ".join(f"{v:.4f}" for v in curves[cfg.name])
            note = f"{cfg.name} ({trainer.precision.backend}): {losses}"
            ref = curves["tiny-g1-mbs4-none-bf16-eager"]  # AC does not change BF16 numerics
            if precision != "bf16":
                worst = max(abs(a - b) / abs(b) for a, b in zip(curves[cfg.name], ref, strict=True))
                good = all(math.isfinite(v) for v in curves[cfg.name]) and worst < 0.05
                ok &= good
                note += f"; max rel diff vs bf16 {worst:.2e} {'PASS' if good else 'FAIL'}"
        except Exception as err:
            ok = False
            note = f"{cfg.name}: FAILED {type(err).__name__}: {str(err)[:300]}"
            note += " | " + traceback.format_exc()[-800:]
        notes.append(note)
        print(note, flush=True)
    (out / "check.txt").write_text("\n".join(notes) + "\n")
    return Record("te-check", {}, "ok" if ok else "error", detail="; ".join(notes)[:3000])


def _flex_check(out: Path, mbs: int) -> Record:
    """Document-masked FlexAttention on the GPU (issue 28): the same function as SDPA with the boolean
    mask (bf16 outputs and gradients against a float32 reference), and its fwd+bwd time against dense
    causal attention (cuDNN) at the 3B attention shape, for packed conversations of several mean lengths.
    The planner models FlexAttention at 0.86 of dense flash attention (calibration/profile.py); the
    ratio of dense time to masked time at equal useful work is what this measures."""
    import torch
    import torch.nn.functional as F

    from blackwell_trainer.model.document_mask import build_document_mask, document_attention

    gen = torch.Generator(device="cuda").manual_seed(7)
    heads, kv, dim = 24, 8, 128

    def qkv() -> list[torch.Tensor]:
        shapes = [(mbs, heads, SEQ, dim), (mbs, kv, SEQ, dim), (mbs, kv, SEQ, dim)]
        return [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
                for s in shapes]  # fmt: skip

    def timed(fn: Any, reps: int = 10) -> float:
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end) / reps)

    notes, ok = [], True
    q, k, v = qkv()

    def dense() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()

    dense_ms = timed(dense)
    notes.append(f"dense causal SDPA (default backend) mbs {mbs}: {dense_ms:.2f} ms fwd+bwd")
    for mean in (512, 2048, 4096):
        _, _, documents = _packed_rows((torch.zeros(mbs, SEQ, dtype=torch.long, device="cuda"),) * 2, mean,
                                       torch.Generator(device="cuda").manual_seed(mean))  # fmt: skip
        mask = build_document_mask(documents)
        attn = document_attention(q, k, v, mask)
        grads = torch.autograd.grad(attn.float().square().sum(), (q, k, v))
        ref_mask = build_document_mask(documents, flex=False)
        q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=ref_mask, enable_gqa=True)
        ref_grads = torch.autograd.grad(ref.square().sum(), (q32, k32, v32))
        rel = float((attn.float() - ref).norm() / ref.norm())
        grel = max(float((g.float() - r).norm() / r.norm()) for g, r in zip(grads, ref_grads, strict=True))
        good = rel < 1e-2 and grel < 2e-2
        ok &= good
        # Useful work: the allowed (query, key) pairs; dense causal has seq*(seq+1)/2 per row.
        same = documents.unsqueeze(2) == documents.unsqueeze(1)
        pairs = float((same & torch.ones(SEQ, SEQ, dtype=torch.bool, device="cuda").tril()).sum())
        share = pairs / (mbs * SEQ * (SEQ + 1) / 2)
        ms = timed(lambda m=mask: document_attention(q, k, v, m).sum().backward())
        efficiency = (dense_ms * share) / ms
        notes.append(f"docs~{mean}: out rel {rel:.2e} grad rel {grel:.2e} {'PASS' if good else 'FAIL'}; "
                     f"{ms:.2f} ms fwd+bwd for {share:.3f} of the causal pairs: "
                     f"per-pair speed {efficiency:.2f} of dense")  # fmt: skip
        del ref_mask, q32, k32, v32, ref, ref_grads, grads, attn
    (out_file := out / "check.txt").write_text("\n".join(notes) + "\n")
    print(out_file.read_text(), flush=True)
    return Record("flex-check", {"mbs": mbs}, "ok" if ok else "error", detail="; ".join(notes))


def _sdpa_timings() -> list[str]:
    """Causal GQA attention fwd+bwd at the 3B shape (mbs 2, seq 4096) per SDPA backend."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 24, SEQ, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 8, SEQ, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 8, SEQ, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    flops = 4 * 2 * 24 * SEQ * SEQ * 128 / 2 * 3.5  # causal fwd (4 b h s^2 d / 2) + bwd (2.5x)
    notes = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                for i in range(13):
                    if i == 3:
                        start, end = (
                            torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True),
                        )
                        start.record()
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    o.sum().backward()
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end) / 10
            notes.append(f"SDPA {backend.name}: {ms:.2f} ms fwd+bwd, {flops / ms / 1e9:.0f} TFLOP/s (causal)")
        except Exception as err:
            notes.append(f"SDPA {backend.name}: failed {type(err).__name__}: {str(err)[:150]}")
    return notes


def _packed_rows(batch: tuple[Any, Any], mean_tokens: int, gen: Any) -> tuple[Any, Any, Any]:
    """Random rows as packed conversations: document numbers from lengths around `mean_tokens` (uniform
    in [mean/2, 3*mean/2]), the labels of each conversation's first half and its last token ignored."""
    import torch

    from blackwell_trainer.model.loss import IGNORE_INDEX

    inputs, labels = batch
    rows, seq = inputs.shape
    documents = torch.empty_like(inputs)
    labels = labels.clone()
    for row in range(rows):
        at, number = 0, 0
        while at < seq:
            low, high = max(2, mean_tokens // 2), max(3, 3 * mean_tokens // 2)
            length = min(int(torch.randint(low, high, (1,), generator=gen, device=inputs.device)), seq - at)
            documents[row, at : at + length] = number
            labels[row, at : at + length // 2] = IGNORE_INDEX
            labels[row, at + length - 1] = IGNORE_INDEX
            at, number = at + length, number + 1
    return inputs, labels, documents


def run_tuning(cfg: Config, variant: str = "") -> Any:
    """The switches of this run: the environment's BTJ_TRAINER_TUNING, then cfg.tuning, then `variant`."""
    from blackwell_trainer.plan.tuning import TUNING_ENV, Tuning

    return Tuning.parse(",".join([os.environ.get(TUNING_ENV, ""), cfg.tuning, variant]))


def _timed_window(trainer: Any, batches: list[Any], steps: int) -> tuple[float, list[float]]:
    """One settling step (a switch's first use), then `steps` timed ones: (tokens/s, their losses)."""
    trainer.step(batches)
    start = time.perf_counter()
    losses = [trainer.step(batches).loss for _ in range(steps)]
    return trainer.tokens_per_micro_batch * steps / (time.perf_counter() - start), losses


def window_variants(windows: str, label: str) -> list[str]:
    """The ";"-separated switch sets of ``windows``; ValueError naming ``label`` for one the trainer refuses
    or one that names a switch the trainer reads only when it is built (a window changes the switches of a
    trainer already built, so it would time the same trainer twice)."""
    from blackwell_trainer.plan.tuning import PER_STEP_SWITCHES, Tuning, TuningError

    variants = [v.strip() for v in windows.split(";") if v.strip()]
    for variant in variants:
        try:
            built = Tuning.built_once(variant)
        except TuningError as err:
            raise ValueError(f"{label}: {err}") from None
        if built:
            raise ValueError(
                f"{label}: {variant!r}: {', '.join(built)} act only when the trainer is built; a window "
                f"can change {', '.join(PER_STEP_SWITCHES)} (give the others as a run's own switches)"
            )
    return variants


def _ab_windows(trainer: Any, batches: list[Any], cfg: Config) -> list[dict[str, Any]]:
    """cfg.windows' switch sets in this process, each beside a window of the run's own switches."""
    import gc

    base = run_tuning(cfg)
    results = []
    for variant in window_variants(cfg.windows, "windows"):
        trainer.tuning = run_tuning(cfg, variant)
        tps, losses = _timed_window(trainer, batches, cfg.window)
        trainer.tuning = base
        if not base.manual_gc:
            gc.enable()  # manual_gc turned the collector off; the baseline runs Python's own schedule
        base_tps, _ = _timed_window(trainer, batches, cfg.window)
        results.append({
            "tuning": variant, "tokens_per_s": round(tps, 1), "base_tokens_per_s": round(base_tps, 1),
            "gain": round(tps / base_tps - 1, 4), "losses": [round(v, 5) for v in losses],
        })  # fmt: skip
        print(f"window {variant}: {tps:,.0f} against {base_tps:,.0f} tok/s", flush=True)
    return results


def worker(cfg: Config, out: Path) -> None:
    """Run one configuration in this process (rank 0 writes ``out/record.json``)."""
    import torch

    from blackwell_trainer.data.tokens import Batch
    from blackwell_trainer.loop.trainer import Trainer
    from blackwell_trainer.parallel.runtime import Runtime, init_distributed

    runtime = Runtime.from_env()
    rec = Record(cfg.name, asdict(cfg), "error")
    if str(REPO) not in sys.path:  # run as a script: the repository's benchmarks package
        sys.path.append(str(REPO))
    from benchmarks import memory_snapshot

    # BTJ_BENCH_MEMORY_SNAPSHOT: the allocator's history from before the model is built (memory_snapshot.py)
    snapshots = memory_snapshot.start() if cfg.kind == "train" and runtime.rank == 0 else None
    try:
        if cfg.kind == "check":
            rec = _check(out)
            return
        if cfg.kind == "te-check":
            rec = _te_check(out)
            return
        if cfg.kind == "flex-check":
            rec = _flex_check(out, cfg.mbs)
            return
        started = time.perf_counter()
        plan = make_plan(cfg)
        init_distributed(runtime)
        with _sdpa_context(cfg.sdpa):
            trainer = Trainer(plan, runtime, tuning=run_tuning(cfg))
            gen = torch.Generator(device=runtime.device).manual_seed(1234 + runtime.rank)
            vocab = plan.architecture.vocab_size
            shape = (cfg.mbs, plan.sequence_length)
            inputs = torch.randint(0, vocab, shape, device=runtime.device, generator=gen)
            batches = [Batch(inputs, torch.randint(0, vocab, shape, device=runtime.device, generator=gen))]
            if cfg.docmask:
                batches = [Batch(*_packed_rows((batches[0].inputs, batches[0].labels), cfg.docmask, gen))]
            rec.setup_seconds = time.perf_counter() - started
            times, losses = [], []
            window_start = time.perf_counter()
            for i in range(cfg.warmup + cfg.timed):
                result = trainer.step(batches)  # ends in a synchronising read of the loss
                losses.append(result.loss)
                if i == 0:
                    rec.first_step_seconds = result.seconds
                if i >= cfg.warmup:
                    times.append(result.seconds)
                if i == cfg.warmup - 1:
                    window_start = time.perf_counter()
            window_seconds = time.perf_counter() - window_start
            rec.window_tokens_per_s = trainer.tokens_per_micro_batch * cfg.timed / window_seconds
            median = statistics.median(times)
            rec.step_seconds = [round(t, 4) for t in times]
            rec.losses = [round(v, 4) for v in losses]
            rec.tokens_per_s_per_gpu = trainer.tokens_per_micro_batch / median
            rec.mfu = trainer.flops_per_token * rec.tokens_per_s_per_gpu / PEAK_BF16
            if torch.cuda.is_available():
                rec.peak_allocated_gib = torch.cuda.max_memory_allocated() / 2**30
                rec.peak_reserved_gib = torch.cuda.max_memory_reserved() / 2**30
            rec.status = "ok"
            if cfg.windows:
                rec.ab_windows = _ab_windows(trainer, batches, cfg)
            if cfg.profile and runtime.rank == 0:
                _profile(trainer, batches, out / "profile.txt", cfg.name)
            elif cfg.profile:
                trainer.step(batches)
                trainer.step(batches)
    except torch.cuda.OutOfMemoryError as err:
        rec.status = "oom"
        rec.detail = str(err).splitlines()[0][:300]
        rec.peak_reserved_gib = torch.cuda.max_memory_reserved() / 2**30
    except Exception as err:  # recorded, not raised: the grid goes on
        rec.status = "error"
        rec.detail = f"{type(err).__name__}: {err}"[:600] + " | " + traceback.format_exc()[-1500:]
    finally:
        rec.memory_history = snapshots is not None
        try:
            memory_snapshot.dump(snapshots, cfg.name)
        except Exception as err:  # the record matters more than its snapshot
            rec.detail = f"{rec.detail} | memory snapshot not written: {type(err).__name__}: {err}"[:900]
        if runtime.rank == 0:
            (out / "record.json").write_text(json.dumps(asdict(rec)))
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip destroy_process_group after an OOM: a rank may be stuck in a collective.
        os._exit(0)


# ----------------------------------------------------------------------------------------------- parent


class Grid:
    """Schedules configurations on the visible GPUs and collects their records."""

    def __init__(self, out: Path, deadline: float, gpus: int) -> None:
        self.out = out
        self.deadline = deadline
        self.gpus = gpus
        self.lanes = gpus
        self.records: list[Record] = []
        self.lock = threading.Lock()

    def save(self) -> None:
        meta = environment()
        with self.lock:
            data = {"meta": meta, "records": [asdict(r) for r in self.records]}
        (self.out / "trainer_h200.json").write_text(json.dumps(data, indent=1))

    def run_one(self, cfg: Config, gpu_ids: list[int]) -> Record:
        remaining = self.deadline - time.time()
        if remaining < (100 if cfg.model == "8b" else 50):
            return Record(cfg.name, asdict(cfg), "skipped", detail="call budget exhausted")
        tmp = Path(tempfile.mkdtemp(prefix="btj-bench-"))
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        env["PYTHONPATH"] = f"{REPO / 'trainer_image' / 'src'}:{env.get('PYTHONPATH', '')}"
        args = ["--worker", json.dumps(asdict(cfg)), "--out", str(tmp)]
        if cfg.gpus > 1:
            port = 29500 + int(time.time()) % 1000
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={cfg.gpus}",
                   f"--master-port={port}", __file__, *args]  # fmt: skip
        else:
            cmd = [sys.executable, __file__, *args]
        log_path = tmp / "log.txt"
        started = time.time()
        try:
            with open(log_path, "w") as log_file:
                subprocess.run(
                    cmd,
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    timeout=remaining - 10,
                    check=False,
                )
        except subprocess.TimeoutExpired:
            return Record(
                cfg.name, asdict(cfg), "timeout", detail=f"killed after {time.time() - started:.0f} s"
            )
        finally:
            # One combined log file: only a few files come back from the machine.
            with self.lock, open(self.out / "worker_logs.txt", "a") as f:
                lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
                f.write(f"===== {cfg.name} (last 80 lines)\n" + "\n".join(lines[-80:]) + "\n")
        rec_path = tmp / "record.json"
        if not rec_path.exists():
            tail = log_path.read_text()[-1200:]
            return Record(cfg.name, asdict(cfg), "error", detail=f"no record; log tail: {tail}")
        rec = Record(**json.loads(rec_path.read_text()))
        for extra in ("profile.txt", "check.txt"):
            if (tmp / extra).exists():
                with open(self.out / "profiles.txt", "a") as f:
                    f.write((tmp / extra).read_text() + "\n")
        # A profile's kernel list and idle gaps (small JSON) come back too.
        for summary in [*tmp.glob("kernels_*.json"), *tmp.glob("gaps_*.json")]:
            shutil.copy(summary, self.out / summary.name)
        rec.detail = (rec.detail + f" wall {time.time() - started:.0f} s").strip()
        return rec

    def add(self, rec: Record) -> None:
        with self.lock:
            self.records.append(rec)
        self.save()
        tok = f"{rec.tokens_per_s_per_gpu:,.0f} tok/s/GPU" if rec.tokens_per_s_per_gpu else ""
        print(f"[{time.strftime('%H:%M:%S')}] {rec.name}: {rec.status} {tok} {rec.detail[:200]}", flush=True)

    def lane(self, gpu: int, queue: list[Config]) -> None:
        while True:
            with self.lock:
                if not queue:
                    return
                cfg = queue.pop(0)
            self.add(self.run_one(cfg, [gpu]))

    def run(self, configs: list[Config]) -> None:
        singles = [c for c in configs if c.gpus == 1]
        multis = [c for c in configs if c.gpus > 1]
        threads = [threading.Thread(target=self.lane, args=(g, singles)) for g in range(self.lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for cfg in multis:
            if cfg.gpus > self.gpus:
                self.add(Record(cfg.name, asdict(cfg), "skipped", detail=f"needs {cfg.gpus} GPUs"))
                continue
            self.add(self.run_one(cfg, list(range(cfg.gpus))))


def environment() -> dict[str, Any]:
    import torch

    from blackwell_trainer.plan.tuning import Tuning

    meta: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpus_visible": torch.cuda.device_count(),
        "sequence_length": SEQ,
        "peak_bf16_flops_for_mfu": PEAK_BF16,
        "command": " ".join(sys.argv),
        # The command line does not show the environment; the trainer's switches change its figures. Written
        # resolved (every switch, key=value), so the file names the path one GPU ran whatever the default
        # (`btj calibrate import` reads single_device from it).
        "trainer_tuning": ",".join(f"{k}={v}" for k, v in asdict(Tuning.from_env()).items()),
    }
    for mod in ("torchao", "transformer_engine", "triton"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception:
            meta[mod] = None
    return meta


def table(records: list[Record]) -> str:
    head = f"{'config':44s} {'status':7s} {'tok/s/GPU':>10s} {'MFU':>6s} {'alloc':>6s} {'resv':>6s}"
    head += f" {'1st s':>6s}"
    lines = [head]
    for r in records:
        tok = f"{r.tokens_per_s_per_gpu:10,.0f}" if r.tokens_per_s_per_gpu else " " * 10
        mfu = f"{100 * r.mfu:5.1f}%" if r.mfu else " " * 6
        alloc = f"{r.peak_allocated_gib:6.1f}" if r.peak_allocated_gib else " " * 6
        resv = f"{r.peak_reserved_gib:6.1f}" if r.peak_reserved_gib else " " * 6
        first = f"{r.first_step_seconds:6.1f}" if r.first_step_seconds else " " * 6
        lines.append(f"{r.name:44s} {r.status:7s} {tok} {mfu} {alloc} {resv} {first}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", default="smoke", help="comma-separated: " + ", ".join(GRIDS))
    parser.add_argument("--only", default="", help="comma-separated config names to keep")
    parser.add_argument("--profile", default="", help="comma-separated config names to profile")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    parser.add_argument("--lanes", type=int, default=0, help="parallel one-GPU lanes (default: one per GPU)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting configs after this")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        worker(Config(**json.loads(args.worker)), out)
        return
    import torch

    configs = [c for g in args.grid.split(",") for c in GRIDS[g]]
    if args.only:
        keep = set(args.only.split(","))
        configs = [c for c in configs if c.name in keep]
    for c in configs:
        c.profile = c.name in set(args.profile.split(","))
    # On a CPU machine (plumbing test) pretend to have two "GPUs" so the torchrun path runs too.
    grid = Grid(out, time.time() + args.budget_s, torch.cuda.device_count() or 2)
    if args.lanes:
        grid.lanes = args.lanes
    print(json.dumps(environment()), flush=True)
    grid.run(configs)
    grid.save()
    print(table(grid.records))


if __name__ == "__main__":
    main()

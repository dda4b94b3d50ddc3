"""H200 record for Hugging Face weights in and out: an 8B-size checkpoint loaded, trained from, exported.

Usage (on the GPU machine, from the repository root, trainer_image/src on PYTHONPATH):

    python benchmarks/weights_h200.py --out $OUT --work /tmp/btj-weights --steps 12
    python benchmarks/weights_h200.py --out $OUT --steps 12 --precision fp8-tensorwise --identity

``--precision fp8-tensorwise`` (or ``fp8-rowwise``) trains through torchao's Float8Linear (torchao on
PYTHONPATH). ``--identity`` adds a third run from the checkpoint at a learning rate of 1e-30 and no weight
decay: every update is far below a bf16 ulp, so its export must equal the source checkpoint bit for bit,
tensor by tensor (names, shapes, dtypes, values). It shows that loading into the trainer's model (with
the FP8 layers swapped in) and exporting out of it lose or rename nothing.

1. Writes a synthetic checkpoint of Llama-3.1-8B's shape to local disk: random bf16 tensors under the
   Hugging Face names, ~5 GB safetensors files with model.safetensors.index.json, and Llama-3.1-8B's
   config.json (written here with safetensors directly, not by the trainer's exporter).
2. Drops the page cache where the machine lets it (else asks the kernel to forget each file), so the
   load reads the disk.
3. Runs the real trainer (``python -m blackwell_trainer``) twice with one plan (1 GPU, BF16, full AC,
   micro-batch 2, sequence 4096): from the checkpoint (plan.weights, plan.output) and from random init.
   Records the load time the trainer logs, the tokens/s of every step and the export time.
4. Reloads the export twice, with the trainer's loader and with transformers (both float32), and
   compares their logits on 64 tokens (relative error, argmax agreement).

Writes ``OUT/weights_h200.json`` (``weights_h200_<precision>.json`` for FP8) after every phase; prints a
short table last. ``--shape tiny
--device cpu --no-compile`` runs the same plumbing on a CPU machine in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SEQ = 4096
PEAK_BF16 = 989e12  # the reference grid's MFU denominator (H200 SXM dense BF16)
SHARD_BYTES = 5 * 10**9  # Hugging Face's default max_shard_size
WARMUP_STEPS = 2  # the first compiles; tokens/s is the median of the steps after these

# Llama-3.1-8B's published config.json (huggingface.co/meta-llama/Llama-3.1-8B), and a tiny one for CPU.
LLAMA31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
TINY = {**LLAMA31_8B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}  # fmt: skip
# ~100M parameters: enough weights (about 10 exact zeros of torch.randn) to exercise the identity check's
# zero allowance on a CPU.
SMALL = {**LLAMA31_8B, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 32000}  # fmt: skip


def hf_tensors(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Llama checkpoint, Hugging Face names and shapes, in the order the Hub stores them."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * d
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return out


def write_checkpoint(folder: Path, config: dict[str, Any], device: str) -> dict[str, Any]:
    """Random bf16 weights (std 0.02, norm scales near 1) in ~5 GB safetensors files, index, config.json."""
    import torch
    from safetensors.torch import save_file

    started = time.perf_counter()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    gen = torch.Generator(device=device).manual_seed(0)
    tensors = hf_tensors(config)
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensors:
        nbytes = 2 * int(torch.Size(shape).numel())
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        buffer = {}
        for name, shape in group:
            t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02
            if name.endswith("norm.weight"):
                t += 1.0
            buffer[name] = t.to(torch.bfloat16).cpu()
            weight_map[name] = file
            total += buffer[name].numel() * 2
        save_file(buffer, str(folder / file), metadata={"format": "pt"})
        with open(folder / file, "rb") as f:
            os.fsync(f.fileno())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "bytes": total,
        "files": len(groups),
        "tensors": len(tensors),
    }


def drop_page_cache(folder: Path) -> str:
    """Make the next read come from the disk: drop_caches where allowed, else fadvise(DONTNEED) per file."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        pass
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "posix_fadvise(DONTNEED) per file (drop_caches refused)"


# --precision -> the plan's (precision, precisionRecipe).
PRECISIONS = {
    "bf16": ("bf16", "none"),
    "fp8-tensorwise": ("fp8", "torchao-tensorwise"),
    "fp8-rowwise": ("fp8", "torchao-rowwise"),
}
IDENTITY_LR = 1e-30  # far below a bf16 ulp of any weight: the exported weights must equal the loaded ones


def make_plan(arch: Any, *, steps: int, device: str, compile_: bool, seq: int, weights: str | None,
              output: str | None, precision: str = "bf16", learning_rate: float = 1e-5,
              weight_decay: float = 0.1) -> Any:  # fmt: skip
    from blackwell_trainer.plan.config import (
        Candidate,
        GpuInfo,
        MemoryBreakdown,
        OptimizerConfig,
        OutputConfig,
        Plan,
        Prediction,
        WeightsConfig,
    )

    zero = dict.fromkeys(
        ["parameters", "gradients", "optimizer_states", "activations", "loss", "fsdp_transient",
         "precision_overhead", "workspace", "fragmentation", "peak_allocated", "peak_reserved"], 0
    )  # fmt: skip
    gpu = (
        GpuInfo(name="H200", compute_capability="9.0", memory_bytes=141 * 10**9, peak_bf16_flops=PEAK_BF16)
        if device == "cuda"
        else GpuInfo(name="CPU", compute_capability="0.0", memory_bytes=0, peak_bf16_flops=1e12)
    )
    mbs = 2
    return Plan(
        job_name="weights-h200",
        model_name="llama3.1-8b" if arch.hidden_size == 4096 else "tiny",
        architecture=arch,
        parameter_count=arch.parameter_count(),
        gpu=gpu,
        instance_type="ml.p5e.48xlarge",
        nodes=1,
        gpus_per_node=1,
        sequence_length=seq,
        global_batch_tokens=mbs * seq,
        steps=steps,
        chosen=Candidate(
            precision=PRECISIONS[precision][0],
            precision_recipe=PRECISIONS[precision][1],
            activation_checkpointing="full",
            micro_batch_size=mbs,
            gradient_accumulation_steps=1,
            sharding="full",
            shard_degree=1,
            replicate_degree=1,
            compile=compile_,
            loss_chunk_tokens=8192,
        ),
        predicted=Prediction(
            tokens_per_second_per_gpu=0,
            step_time_seconds=0,
            model_flops_utilization=0,
            memory=MemoryBreakdown(peak_phase="backward", **zero),
        ),
        optimizer=OptimizerConfig(warmup_steps=2, learning_rate=learning_rate, weight_decay=weight_decay),
        weights=WeightsConfig(uri=weights) if weights else None,
        output=OutputConfig(uri=output) if output else None,
        log_every_steps=1,
        metrics_port=9401,
    )


STEP = re.compile(r"step (\d+)/\d+ loss (\S+) lr \S+ tokens/s/gpu (\d+) mfu (\S+)% step (\S+)s")
LOADED = re.compile(r"loaded (\d+) tensors \((\S+) GiB of this rank's slices\) from \S+ in (\S+) s")
EXPORTED = re.compile(r"exported the trained weights to \S+ \((\S+)\) in (\S+) s")


def run_trainer(plan: Any, work: Path, name: str, out: Path, timeout: float) -> dict[str, Any]:
    """The real entry point on this machine; what its log says about loading, steps and export."""
    plan_path = work / f"{name}.json"
    plan_path.write_text(plan.to_json())
    started = time.perf_counter()
    termination = work / f"{name}.termination"
    # The trainer reads its pod's last termination message and refuses a plan that ran out of memory
    # before (train.py): each run here is a new pod, not a restart of an earlier one.
    termination.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BTJ_TERMINATION_LOG": str(termination)}
    proc = subprocess.run(
        [sys.executable, "-m", "blackwell_trainer", "--plan", str(plan_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    log = proc.stdout + proc.stderr
    (out / f"{name}.log").write_text(log[-200_000:])
    steps = [
        {"step": int(m[1]), "loss": float(m[2]), "tokens_per_s": int(m[3]), "mfu_pct": float(m[4]),
         "seconds": float(m[5])}
        for m in STEP.finditer(log)
    ]  # fmt: skip
    timed = [s["tokens_per_s"] for s in steps if s["step"] > WARMUP_STEPS]
    record: dict[str, Any] = {
        "rc": proc.returncode,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "steps": steps,
        "median_tokens_per_s": statistics.median(timed) if timed else None,
        "error": next((line for line in log.splitlines() if line.startswith("error: ")), None),
    }
    if m := LOADED.search(log):
        record["load"] = {"tensors": int(m[1]), "gib": float(m[2]), "seconds": float(m[3])}
    if m := EXPORTED.search(log):
        record["export"] = {"dtype": m[1], "seconds": float(m[2])}
    return record


def logits_check(folder: Path, arch: Any, device: str) -> dict[str, Any]:
    """The export reloaded by the trainer's loader and by transformers (float32): logits on 64 tokens."""
    import torch

    from blackwell_trainer.model.transformer import build_model
    from blackwell_trainer.weights.load import load_pretrained

    record: dict[str, Any] = {}
    seq = 64
    ids = torch.randint(0, arch.vocab_size, (1, seq), generator=torch.Generator().manual_seed(5)).to(device)
    started = time.perf_counter()
    model = build_model(arch, max_seq_len=seq, loss_chunk_tokens=0)
    model.to_empty(device=device)
    model.init_weights(buffer_device=torch.device(device))
    load_pretrained(model, str(folder), arch, seq)
    with torch.no_grad():
        ours = (model(ids) @ model.output_weight().T).float().cpu()
    record["trainer_reload_seconds"] = round(time.perf_counter() - started, 1)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as err:
        record["transformers"] = f"not importable: {err}"
        return record
    import transformers

    started = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager")
    hf = hf.to(device).eval()
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits.float().cpu()
    record["transformers_reload_seconds"] = round(time.perf_counter() - started, 1)
    record["transformers_version"] = transformers.__version__
    record["relative_error"] = float((ours - theirs).norm() / theirs.norm())
    record["max_abs_error"] = float((ours - theirs).abs().max())
    del hf
    if device == "cuda":  # this process's cache would shrink a later trainer run's GPU
        torch.cuda.empty_cache()
    record["argmax_agreement"] = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    return record


# Adam moves a weight by at most about lr x (1 - beta1) / sqrt(1 - beta2) per step (3.2 x lr at the trainer's
# betas); a weight that was exactly 0.0 shows even a 1e-30 update, since bf16 represents it.
ADAM_STEP_BOUND = 4.0


def identity_check(source: Path, exported: Path, *, steps: int = 0, lr: float = 0.0) -> dict[str, Any]:
    """Whether the export holds exactly the source checkpoint's tensors: names, shapes, dtypes, bits.

    The one allowed difference: a weight that was exactly 0.0 in the source (torch.randn's Box-Muller
    gives exact zeros about once in 10^7 draws) moved by no more than `steps` Adam steps of `lr` can move
    it. Anything else is a difference.
    """
    from safetensors import safe_open

    def tensors(folder: Path) -> dict[str, Path]:
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            return {name: folder / file for name, file in json.loads(index.read_text())["weight_map"].items()}
        with safe_open(str(folder / "model.safetensors"), "pt") as single:  # small exports: one file
            return dict.fromkeys(single.keys(), folder / "model.safetensors")

    started = time.perf_counter()
    bound = steps * lr * ADAM_STEP_BOUND
    ours, theirs = tensors(source), tensors(exported)
    record: dict[str, Any] = {
        "missing_in_export": sorted(set(ours) - set(theirs)),
        "extra_in_export": sorted(set(theirs) - set(ours)),
        "zero_bound": bound,
    }
    differ: list[str] = []
    zeros_moved = 0
    for name in sorted(set(ours) & set(theirs)):
        with safe_open(str(ours[name]), "pt") as a, safe_open(str(theirs[name]), "pt") as b:
            x, y = a.get_tensor(name), b.get_tensor(name)
        if x.dtype != y.dtype or x.shape != y.shape:
            differ.append(f"{name}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
            continue
        changed = x != y
        if not bool(changed.any()):
            continue
        zero_moved = changed & (x == 0) & (y.float().abs() <= bound)
        zeros_moved += int(zero_moved.sum())
        other = changed & ~zero_moved
        if bool(other.any()):
            step = ((x.float() - y.float()).abs() / x.float().abs().clamp_min(1e-30))[other]
            differ.append(
                f"{name}: {int(other.sum())} of {x.numel()} elements differ, relative change up to "
                f"{float(step.max()):.2e} (median {float(step.median()):.2e})"
            )
    record.update(
        compared=len(set(ours) & set(theirs)),
        source_zeros_moved_within_bound=zeros_moved,
        differ=differ[:20],
        differ_count=len(differ),
        identical=not differ and not record["missing_in_export"] and not record["extra_in_export"],
        seconds=round(time.perf_counter() - started, 1),
    )
    return record


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/btj-weights"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--shape", choices=("8b", "small", "tiny"), default="8b")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--timeout-s", type=float, default=240)
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="bf16")
    parser.add_argument("--identity", action="store_true", help="also the bit-for-bit export check")
    parser.add_argument("--identity-only", action="store_true", help="only the bit-for-bit export check")
    args = parser.parse_args()
    import torch

    from blackwell_trainer.plan.config import architecture_from_hf_config

    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    config = {"8b": LLAMA31_8B, "small": SMALL, "tiny": TINY}[args.shape]
    seq = SEQ if args.shape == "8b" else 128
    arch = architecture_from_hf_config(config, sequence_length=seq)
    record: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "shape": args.shape,
        "parameters": arch.parameter_count(),
        "sequence_length": seq,
        "plan": f"1 GPU, {args.precision}, full activation checkpointing, micro-batch 2, compile "
        + ("off" if args.no_compile else "on"),
        "disk_free_bytes": shutil.disk_usage(args.work).free,
    }
    if args.precision != "bf16":
        import torchao

        record["versions"]["torchao"] = torchao.__version__
    suffix = "" if args.precision == "bf16" else f"_{args.precision.replace('-', '_')}"
    result = args.out / f"weights_h200{suffix}.json"

    def save() -> None:
        result.write_text(json.dumps(record, indent=2) + "\n")

    source, exported = args.work / "in", args.work / "out"
    record["checkpoint"] = write_checkpoint(source, config, args.device)
    save()
    # Only on the GPU machine (a lone lease): dropping a shared machine's page cache slows its other users.
    record["page_cache"] = drop_page_cache(source) if args.device == "cuda" else "kept (cpu dry run)"
    common = dict(
        steps=args.steps, device=args.device, compile_=not args.no_compile, seq=seq, precision=args.precision
    )
    if args.identity_only:
        args.identity = True
    else:
        record["from_checkpoint"] = run_trainer(
            make_plan(arch, weights=str(source), output=str(exported), **common),  # type: ignore[arg-type]
            args.work, "from_checkpoint", args.out, args.timeout_s,
        )  # fmt: skip
        save()
    if args.identity:
        same = args.work / "out-identity"
        shutil.rmtree(same, ignore_errors=True)
        plan = make_plan(
            arch, weights=str(source), output=str(same), learning_rate=IDENTITY_LR, weight_decay=0.0, **common
        )  # type: ignore[arg-type]
        record["identity_run"] = run_trainer(plan, args.work, "identity", args.out, args.timeout_s)
        save()
        if (same / "config.json").is_file():
            record["identity"] = identity_check(source, same, steps=args.steps, lr=IDENTITY_LR)
        save()
    if args.identity_only:
        print(f"identity: {record.get('identity')} (rc {record['identity_run']['rc']})")
        return 0
    record["from_random_init"] = run_trainer(
        make_plan(arch, weights=None, output=None, **common),  # type: ignore[arg-type]
        args.work, "from_random_init", args.out, args.timeout_s,
    )  # fmt: skip
    save()
    a, b = record["from_checkpoint"]["median_tokens_per_s"], record["from_random_init"]["median_tokens_per_s"]
    record["tokens_per_s_ratio"] = round(a / b, 4) if a and b else None
    if (exported / "config.json").is_file():
        record["export_files"] = sorted(p.name for p in exported.iterdir())
        record["export_bytes"] = sum(p.stat().st_size for p in exported.iterdir())
        record["reload"] = logits_check(exported, arch, args.device)
    save()
    load = record["from_checkpoint"].get("load", {})
    print(f"checkpoint written: {record['checkpoint']}")
    print(f"page cache: {record['page_cache']}")
    print(f"load: {load}  (rc {record['from_checkpoint']['rc']}, {record['from_checkpoint']['error']})")
    print(f"tokens/s from checkpoint {a}, from random init {b}, ratio {record['tokens_per_s_ratio']}")
    print(f"export: {record['from_checkpoint'].get('export')}")
    print(f"reload: {record.get('reload')}")
    if args.identity:
        print(f"identity: {record.get('identity')} (rc {record['identity_run']['rc']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Side by side on one GPU: torchtitan (its published wheel, run as its users run it) and this trainer.

Usage, on the GPU machine from the repository root, with the wheels of benchmarks/titan_prepare.py on
PYTHONPATH (docs/benchmarks/titan_h100.md has the whole device command):

    python benchmarks/titan_side_by_side.py --card h100 --configs same --out $OUT --budget-s 520
    python benchmarks/titan_side_by_side.py --configs all --dry-run   # CPU: commands, parameter counts

A configuration is `{3b|1b}-{bf16|fp8}-b{N}` (both trainers at local batch N) or `...-t{N}-o{M}`
(torchtitan at N, this trainer at M: each one's best batch); `ours-` in front runs this trainer alone, and
`+key=value` after it sets this trainer's switches for that run (BTJ_TRAINER_TUNING's keys), e.g.
`ours-3b-bf16-b2+attention=cudnn`: a process-level A/B beside the same call's pair. Every configuration:
sequence 4096, no activation checkpointing, torch.compile on, FP8 = torchao float8 tensorwise on the blocks'
Linear layers (output head BF16). This trainer runs through benchmarks/trainer_h200.py's worker (its Plan,
Trainer and single-device path, random tokens); torchtitan through `torchrun ... -m torchtitan.train
--job.config_file benchmarks/titan_side_by_side.toml` plus overrides, on the tokenizer and text of .titan/,
at its own defaults for everything not compared (logging every 10 steps included). Each launch is its own
process tree, one after another on GPU 0.

Both are read the same way: WARMUP steps (the first compiles), then TIMED steps whose tokens are divided by
their wall time together. torchtitan's figure is its `tps` log field on the lines after warm-up (at its
default log_freq of 10 a line every 10 steps: the tokens of those steps over the time since the previous
line, which ended in a synchronising loss read); this trainer's is the same window measured by a host clock
from the end of its last warm-up step to the end of its last timed one (each step ends in a synchronising
loss read). Memory: the peak reserved by the caching allocator over the run (torchtitan's `memory: X GiB` is
`reserved_bytes.all.peak` since its last log line: the largest over the lines is the run's peak).
`--windows-on NAME --windows "a=b;c=d"` adds in-process A/B windows to this trainer's run of NAME: each
switch set for TIMED steps, then as many of the run's own, so every variant has its baseline beside it. A
window may change only the switches the trainer reads every step (tuning.PER_STEP_SWITCHES); the others are
built once, and a window naming one is refused before anything runs.
OUT/titan_side_by_side_<card>.json is rewritten after every launch (a timeout keeps what finished); a table
is printed last. First, torchtitan's side is dry-run on this machine (benchmarks/titan_dry_run.py): a
failure there stops the script before any GPU time is spent. `--card` must name the GPU nvidia-smi reports.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import itertools
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# `python benchmarks/titan_side_by_side.py` puts benchmarks/, not the root, on the path; the parent
# process also reads this trainer's Plan (parameter counts), as trainer_h200's workers do.
for _path in (REPO, REPO / "trainer_image" / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from benchmarks import trainer_h200  # noqa: E402
from benchmarks.titan_shapes import MODELS, TRAIN_SPEC  # noqa: E402
from blackwell_trainer.plan.tuning import Tuning  # noqa: E402

SEQ = trainer_h200.SEQ
# Steps: the first compiles; the TIMED after WARMUP are the figure. torchtitan 0.2.2 logs at step 1 and every
# TITAN_LOG_FREQ steps (its default metrics.log_freq, not overridden), so both are multiples of it: each
# timed log line then covers TITAN_LOG_FREQ steps after warm-up and nothing before.
TITAN_LOG_FREQ = 10
WARMUP, TIMED = 10, 10
TOML = REPO / "benchmarks" / "titan_side_by_side.toml"
CARDS = ("h100", "h200")
ASSETS = REPO / ".titan"
FLAVORS_MODULE = "benchmarks.titan_flavors"
FP8_CONVERTER = "quantize.linear.float8"  # torchtitan 0.2.2's registered name for torchao float8 Linear
# Seconds a launch needs, start to exit (compile included), before the budget lets it start.
# Measured on one H100 (2026-12-06): 37-44 s and 24-56 s (the first compile of the call) at 3B, 34-44 s and
# 30-37 s at 1B, with 20 steps.
LAUNCH_SECONDS = {("titan", "3b"): 60, ("ours", "3b"): 50, ("titan", "1b"): 50, ("ours", "1b"): 40}
HANG_FACTOR = 3  # a torchtitan launch is killed (its process group) past this many times its estimate
PREFLIGHT_SECONDS = 180
SUBSETS: dict[str, list[str]] = {
    # Issue 38's same-batch rows on an 80 GB card: 3B at batch 2, 1B at batch 4, BF16 and FP8.
    "same": ["3b-bf16-b2", "3b-fp8-b2", "1b-bf16-b4", "1b-fp8-b4"],
    # Issue 25's same-batch rows: 3B at batch 2 and 4, BF16 and FP8 (8 launches, about 7 minutes).
    "same-3b": ["3b-bf16-b2", "3b-bf16-b4", "3b-fp8-b2", "3b-fp8-b4"],
    # 1B at batch 4, and each one's best 3B batch: torchtitan's found by hand (FP8 batch 8 in the issue),
    # this trainer's the planner's pick (FP8 mbs 9 in the issue); BF16 batch 6 for both.
    "1b-best": ["1b-bf16-b4", "1b-fp8-b4", "3b-bf16-t6-o6", "3b-fp8-t8-o9"],
}
SUBSETS["all"] = SUBSETS["same-3b"] + SUBSETS["1b-best"]
POINT = re.compile(
    r"^(?P<only>ours-)?(?P<model>3b|1b)-(?P<precision>bf16|fp8)-"
    r"(?:b(?P<both>\d+)|t(?P<titan>\d+)-o(?P<ours>\d+))(?P<tuning>(?:\+[a-z][a-z0-9_]*=[a-z0-9_.-]+)*)$"
)
# torchtitan 0.2.2's per-step log line (components/metrics.py, MetricsProcessor.log), colours off.
STEP_LINE = re.compile(
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)\s+grad_norm:\s*\S+\s+"
    r"memory:\s*(?P<reserved>[\d.]+)GiB\((?P<pct>[\d.]+)%\)\s+tps:\s*(?P<tps>[\d,]+)"
)
PARAMS_LINE = re.compile(r"size:\s*(?P<n>[\d,]+) total parameters")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
OOM = ("OutOfMemoryError", "CUDA out of memory")


def plan_loss_chunk() -> int:
    """The loss chunk every plan runs: the shipped profile's (4,096 tokens since 2026-12-07; the side by
    sides before ran 8,192, the harness's own default then)."""
    from blackwell_operator.calibration import load_calibration

    return load_calibration().trainer.loss_chunk_tokens


@dataclass(frozen=True)
class Point:
    """One row of the comparison."""

    name: str
    model: str  # key of titan_shapes.MODELS
    precision: str  # bf16 | fp8
    titan_batch: int
    our_batch: int
    ours_only: bool = False  # this trainer alone: no torchtitan launch
    tuning: str = ""  # this trainer's switches for the run, BTJ_TRAINER_TUNING's syntax
    loss_chunk: int = field(default_factory=plan_loss_chunk)  # the plan's loss_chunk_tokens (`+loss_chunk=N`)


def parse_point(name: str) -> Point:
    m = POINT.match(name)
    if not m:
        raise ValueError(
            f"--configs: {name!r} is neither a subset ({', '.join(SUBSETS)}) nor a configuration "
            "like 3b-bf16-b4 (both at batch 4), 3b-fp8-t8-o9 (torchtitan at 8, this trainer at 9) or "
            "ours-3b-bf16-b2+attention=cudnn (this trainer alone, with a switch)"
        )
    both = m["both"]
    titan, ours = (int(both), int(both)) if both else (int(m["titan"]), int(m["ours"]))
    if min(titan, ours) < 1:
        raise ValueError(f"--configs: {name!r}: a batch is at least 1")
    items = [item for item in m["tuning"].split("+") if item]
    chunks = [int(item.split("=")[1]) for item in items if item.startswith("loss_chunk=")]
    tuning = ",".join(item for item in items if not item.startswith("loss_chunk="))
    if tuning:
        from blackwell_trainer.plan.tuning import Tuning, TuningError

        try:
            Tuning.parse(tuning)
        except TuningError as err:
            raise ValueError(f"--configs: {name!r}: {err}") from None
    chunk = chunks[-1] if chunks else plan_loss_chunk()
    return Point(name, m["model"], m["precision"], titan, ours, bool(m["only"]), tuning, chunk)


def expand(configs: str) -> list[Point]:
    names = [n for part in configs.split(",") if part for n in SUBSETS.get(part, [part])]
    return [parse_point(n) for n in dict.fromkeys(names)]


# ------------------------------------------------------------------------------------------- torchtitan


@dataclass
class TitanResult:
    """What one torchtitan launch logged (or why it did not)."""

    status: str = "error"  # ok | oom | error | skipped | timeout
    tokens_per_s_per_gpu: float | None = None
    peak_reserved_gib: float | None = None
    parameters: int | None = None
    tps_steps: list[int] = field(default_factory=list)  # the tps of each log line after warm-up
    window_steps: list[int] = field(default_factory=list)  # the steps each of those lines covers
    losses: list[float] = field(default_factory=list)  # those of the logged steps
    logged_steps: list[int] = field(default_factory=list)
    wall_seconds: float | None = None
    command: str = ""
    detail: str = ""


def titan_args(point: Point, assets: Path, dump: Path, steps: int = WARMUP + TIMED) -> list[str]:
    """torchtitan.train's arguments: the shared TOML and this point's overrides."""
    args = [
        "--job.config_file", str(TOML),
        "--experimental.custom_import", FLAVORS_MODULE,
        "--model.name", TRAIN_SPEC,
        "--model.flavor", MODELS[point.model].flavor,
        "--model.hf_assets_path", str(assets / "tokenizer"),
        "--training.dataset_path", str(assets / "data"),
        "--training.local_batch_size", str(point.titan_batch),
        "--training.seq_len", str(SEQ),
        "--training.steps", str(steps),
        "--job.dump_folder", str(dump),
    ]  # fmt: skip
    if point.precision == "fp8":
        args += ["--model.converters", FP8_CONVERTER]
    return args


def titan_command(point: Point, assets: Path, dump: Path) -> list[str]:
    """torchtitan's run_train.sh launch for one GPU (torchrun is `python -m torch.distributed.run`)."""
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint=localhost:0",
        "--local-ranks-filter",
        "0",
        "--role",
        "rank",
        "--tee",
        "3",
    ]
    return [*torchrun, "-m", "torchtitan.train", *titan_args(point, assets, dump)]


def parse_titan_log(text: str, warmup: int = WARMUP) -> TitanResult:
    """Figures from a torchtitan log: the tokens/s of the steps after `warmup`, the largest `memory`.

    Each log line's `tps` covers the steps since the previous line; the lines whose window starts at or
    after `warmup` make the figure: their tokens over their time together (equal tokens per step, so the
    step-weighted harmonic mean of their tps).
    """
    res = TitanResult()
    steps: dict[int, tuple[int, float, float]] = {}
    for raw in text.splitlines():
        line = ANSI.sub("", raw)
        if m := STEP_LINE.search(line):
            steps[int(m["step"])] = (int(m["tps"].replace(",", "")), float(m["reserved"]), float(m["loss"]))
        elif m := PARAMS_LINE.search(line):
            res.parameters = int(m["n"].replace(",", ""))
    logged = sorted(steps)
    if steps:
        res.peak_reserved_gib = max(r for _, r, _ in steps.values())
        res.losses = [steps[s][2] for s in logged]
        res.logged_steps = logged
    for before, step in itertools.pairwise(logged):
        if before >= warmup:
            res.tps_steps.append(steps[step][0])
            res.window_steps.append(step - before)
    if any(marker in text for marker in OOM):
        res.status, res.detail = "oom", _first_line_with(text, OOM)
    elif res.tps_steps and all(res.tps_steps):
        seconds_per_token = sum(n / t for n, t in zip(res.window_steps, res.tps_steps, strict=True))
        res.status, res.tokens_per_s_per_gpu = "ok", sum(res.window_steps) / seconds_per_token
    else:
        res.detail = f"no log line after step {warmup} logged; log tail: {text[-1500:]}"
    return res


def _first_line_with(text: str, markers: tuple[str, ...]) -> str:
    return next((ln.strip()[:300] for ln in text.splitlines() if any(k in ln for k in markers)), "")


def titan_env(tmp: Path) -> dict[str, str]:
    """The launch environment: run_train.sh's allocator setting, this repository on the path, offline."""
    env = dict(os.environ)
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    env.update({
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",  # as torchtitan's run_train.sh sets it
        "LOG_RANK": "0",
        "PYTHONPATH": f"{REPO}:{env.get('PYTHONPATH', '')}",  # benchmarks.titan_flavors
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp / "hf"),
    })  # fmt: skip
    return env


def launch(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[str, int | None]:
    """Run `cmd` in a session of its own; past `timeout` kill the whole group (torchrun and its worker,
    which would otherwise live on holding the GPU). (output, exit code or None when killed)."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        return proc.communicate(timeout=max(timeout, 1))[0], proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()[0], None


def run_titan(point: Point, assets: Path, out: Path, deadline: float) -> TitanResult:
    estimate = LAUNCH_SECONDS[("titan", point.model)]
    remaining = deadline - time.time()
    if remaining < estimate:
        return TitanResult(status="skipped", detail=f"budget: {remaining:.0f} s left")
    tmp = Path(tempfile.mkdtemp(prefix="btj-titan-"))
    cmd = titan_command(point, assets, tmp / "dump")
    started = time.time()
    # A hung launch may not take the rest of the call: at most HANG_FACTOR times its estimate.
    text, rc = launch(cmd, titan_env(tmp), min(remaining - 5, HANG_FACTOR * estimate))
    res = parse_titan_log(text)
    res.wall_seconds = round(time.time() - started, 1)
    res.command = " ".join(cmd)
    if rc is None and not (res.status == "ok" and sum(res.window_steps) == TIMED):
        res.status, res.detail = "timeout", f"killed after {res.wall_seconds:.0f} s; {res.detail}"[:2000]
    elif rc is None:
        res.detail = f"all steps logged, then killed at exit after {res.wall_seconds:.0f} s"
    elif rc != 0 and res.status == "ok":
        res.status, res.detail = "error", f"exit {rc} after its steps; tail: {text[-800:]}"
    with open(out / "titan_logs.txt", "a") as f:
        f.write(f"===== {point.name}: torchtitan batch {point.titan_batch} (exit {rc})\n{text}\n")
    shutil.rmtree(tmp, ignore_errors=True)
    return res


def preflight(point: Point, assets: Path, out: Path) -> str | None:
    """The dry run of one configuration on this machine, in the launch environment (torchtitan's imports,
    its config parser, the flavors, the parameter count, one batch from its data loader), before any GPU
    time is spent. None when it passed, else its output's tail."""
    tmp = Path(tempfile.mkdtemp(prefix="btj-titan-pre-"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--configs", point.name, "--dry-run",
           "--assets", str(assets), "--out", str(tmp)]  # fmt: skip
    text, rc = launch(cmd, titan_env(tmp), PREFLIGHT_SECONDS)
    with open(out / "titan_logs.txt", "a") as f:
        f.write(f"===== preflight ({point.name} --dry-run, exit {rc})\n{text}\n")
    shutil.rmtree(tmp, ignore_errors=True)
    return None if rc == 0 else text[-3000:]


# ------------------------------------------------------------------------------------------ this trainer


def our_config(point: Point, windows: str = "") -> trainer_h200.Config:
    """This trainer's run of `point`; `windows`: in-process A/B switch sets after its timed steps."""
    shape = MODELS[point.model].ours
    common: dict[str, Any] = dict(warmup=WARMUP, timed=TIMED, tuning=point.tuning, windows=windows,
                                  window=TIMED, loss_chunk=point.loss_chunk)  # fmt: skip
    if point.precision == "fp8":
        return trainer_h200.fp8(shape, point.our_batch, "none", **common)
    return trainer_h200.bf16(shape, point.our_batch, "none", **common)


def our_parameters(point: Point) -> tuple[int, int]:
    """(the plan's count, the count of the model the trainer builds, on the meta device)."""
    from blackwell_trainer.model.transformer import build_model

    plan = trainer_h200.make_plan(our_config(point))
    model = build_model(plan.architecture, max_seq_len=SEQ)
    return plan.parameter_count, sum(p.numel() for p in model.parameters())


def run_ours(point: Point, out: Path, deadline: float, windows: str = "") -> trainer_h200.Record:
    cfg = our_config(point, windows)
    remaining = deadline - time.time()
    if remaining < LAUNCH_SECONDS[("ours", point.model)]:
        return trainer_h200.Record(cfg.name, asdict(cfg), "skipped", detail=f"budget: {remaining:.0f} s left")
    return trainer_h200.Grid(out, deadline, gpus=1).run_one(cfg, [0])


# ------------------------------------------------------------------------------------------------ report


def versions() -> dict[str, str | None]:
    names = ["torch", "torchtitan", "torchao", "triton", "torchdata", "datasets", "tyro", "tokenizers",
             "pydantic", "huggingface-hub", "fsspec", "pyarrow"]  # fmt: skip
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def environment(argv: list[str], card: str) -> dict[str, Any]:
    """Command, date, device and versions. nvidia-smi, not torch.cuda: the parent holds no CUDA context."""
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = "no GPU (nvidia-smi not found or failed)"
    # A copy of a branch run inside another checkout names its commit here (git would read the outer one).
    commit: str | None = os.environ.get("BTJ_BENCH_COMMIT")
    try:
        commit = (
            commit
            or subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "command": " ".join([Path(sys.executable).name, *argv]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "card": card, "device": smi, "python": platform.python_version(), "git_commit": commit,
        "versions": versions(), "sequence_length": SEQ, "warmup_steps": WARMUP, "timed_steps": TIMED,
        "torchtitan_log_freq": TITAN_LOG_FREQ,
        "measure": "tokens of the timed steps over their wall time together, both trainers: torchtitan's "
                   "tps of its log lines after warm-up (its default log_freq), this trainer's host clock",
        "settings": "one GPU, AC none, torch.compile on, FP8 = torchao float8 tensorwise (output head BF16)",
        # The command line does not show the environment; this trainer's switches change its figures.
        # Written resolved (every switch), so the file names the path it ran whatever the default was.
        "ours_tuning": ",".join(f"{k}={v}" for k, v in asdict(Tuning.from_env()).items()),
    }  # fmt: skip


def row(point: Point, ours: trainer_h200.Record | None, titan: TitanResult | None) -> dict[str, Any]:
    model = MODELS[point.model]
    plan_count, built_count = our_parameters(point)
    ratio = None
    if ours and titan and ours.window_tokens_per_s and titan.tokens_per_s_per_gpu:
        ratio = round(ours.window_tokens_per_s / titan.tokens_per_s_per_gpu, 4)
    counts = {plan_count, built_count, model.parameters} | (
        {titan.parameters} if titan and titan.parameters else set()
    )
    return {
        "name": point.name, "model": point.model, "precision": point.precision, "ours_tuning": point.tuning,
        "batch": {"ours": point.our_batch, "torchtitan": point.titan_batch},
        "parameters": {"expected": model.parameters, "ours_plan": plan_count, "ours_model": built_count,
                       "torchtitan": titan.parameters if titan else None, "equal": len(counts) == 1},
        "ratio_tokens_per_s": ratio,
        "ours": asdict(ours) if ours else None, "torchtitan": asdict(titan) if titan else None,
    }  # fmt: skip


def result_name(card: str) -> str:
    return f"titan_side_by_side_{card}.json"


def save(out: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    (out / result_name(meta["card"])).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'config':16s} {'ours tok/s':>11s} {'titan tok/s':>11s} {'ratio':>6s}"
    lines = [head + f" {'resv ours/titan GiB':>20s} params"]
    for r in rows:
        o, t = r["ours"] or {}, r["torchtitan"] or {}
        ot, tt = _ours_figure(o), t.get("tokens_per_s_per_gpu")
        om, tm = o.get("peak_reserved_gib"), t.get("peak_reserved_gib")
        ours_tps = f"{ot:,.0f}" if ot else o.get("status", "-")
        titan_tps = f"{tt:,.0f}" if tt else t.get("status", "-")
        ratio = f"{r['ratio_tokens_per_s']:.3f}" if r["ratio_tokens_per_s"] else "-"
        memory = (f"{om:.1f}" if om else "-") + " / " + (f"{tm:.1f}" if tm else "-")
        params = ("equal " if r["parameters"]["equal"] else "DIFFER ") + f"{r['parameters']['expected']:,}"
        lines.append(f"{r['name']:16s} {ours_tps:>11s} {titan_tps:>11s} {ratio:>6s} {memory:>20s} {params}")
    return "\n".join(lines)


def _ours_figure(ours: dict[str, Any]) -> float | None:
    """This trainer's figure: the timed window's (files before 2026-12-06: the median step's)."""
    figure = ours.get("window_tokens_per_s") or ours.get("tokens_per_s_per_gpu")
    return float(figure) if figure else None


def _figure(tps: float | None, status: str) -> str:
    return f"{tps:,.0f}" if tps else status


def markdown(rows: list[dict[str, Any]]) -> str:
    """docs/benchmarks/titan_h100.md's table from saved rows (`--report`)."""
    head = (
        "| config | this trainer tok/s | torchtitan tok/s | ratio | peak reserved GiB (ours / torchtitan) |"
    )
    lines = [head, "|---|---|---|---|---|"]
    for r in rows:
        o, t = r["ours"] or {}, r["torchtitan"] or {}
        batch = r["batch"]
        both = batch["ours"] == batch["torchtitan"]
        label = f"{r['model'].upper()} {'BF16' if r['precision'] == 'bf16' else 'FP8 tensorwise'}, " + (
            f"batch {batch['ours']}" if both else f"batch {batch['ours']} / {batch['torchtitan']}"
        )
        figures = [
            _figure(_ours_figure(o), o.get("status", "-")),
            _figure(t.get("tokens_per_s_per_gpu"), t.get("status", "-")),
        ]
        ratio = f"{r['ratio_tokens_per_s']:.2f}" if r["ratio_tokens_per_s"] else ""
        memory = " / ".join(
            f"{x['peak_reserved_gib']:.1f}" if x.get("peak_reserved_gib") else "-" for x in (o, t)
        )
        lines.append(f"| {label} | {figures[0]} | {figures[1]} | {ratio} | {memory} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- run


def ensure_assets(assets: Path) -> None:
    """Make the tokenizer and data set where they were not carried (tokenizers is on the GPU image)."""
    if not (assets / "tokenizer" / "tokenizer.json").exists() or not (assets / "data").exists():
        from benchmarks.titan_prepare import make_assets, repository_text

        make_assets(assets, repository_text())


@dataclass(frozen=True)
class Call:
    """One call's settings beside its configurations."""

    card: str
    budget_s: float
    assets: Path
    windows: str = ""  # in-process A/B switch sets (";"-separated) for this trainer's runs in windows_on
    windows_on: frozenset[str] = frozenset()


def check_card(card: str, device: str) -> str | None:
    """Why `--card` does not name the GPU nvidia-smi reports (None when it does): figures name their card."""
    if card.upper() not in device.upper():
        return f"--card {card} but nvidia-smi reports {device!r}: rerun with the card this machine has"
    return None


def _skipped(point: Point, note: str) -> dict[str, Any]:
    cfg = our_config(point)
    skipped = trainer_h200.Record(cfg.name, asdict(cfg), "skipped", detail=note)
    return row(point, skipped, None if point.ours_only else TitanResult(status="skipped", detail=note))


def run(points: list[Point], out: Path, call: Call) -> list[dict[str, Any]]:
    deadline = time.time() + call.budget_s
    meta = environment(sys.argv, call.card)
    meta["ours_windows"] = {"switch_sets": call.windows, "on": sorted(call.windows_on)}
    print(json.dumps(meta), flush=True)
    rows: list[dict[str, Any]] = []
    if wrong := check_card(call.card, meta["device"]):
        meta["card_error"] = wrong
        save(out, meta, rows)
        raise SystemExit(wrong)
    ensure_assets(call.assets)
    paired = [p for p in points if not p.ours_only]
    if paired and (failed := preflight(paired[0], call.assets, out)):
        meta["preflight_error"] = failed
        save(out, meta, rows)
        raise SystemExit(f"torchtitan's dry run failed here; nothing launched:\n{failed}")
    for point in points:
        need = LAUNCH_SECONDS[("ours", point.model)]
        need += 0 if point.ours_only else LAUNCH_SECONDS[("titan", point.model)]
        if deadline - time.time() < need:  # half a row is no comparison
            rows.append(
                _skipped(point, f"budget: {deadline - time.time():.0f} s left, the row needs ~{need} s")
            )
            save(out, meta, rows)
            continue
        windows = call.windows if point.name in call.windows_on else ""
        ours = run_ours(point, out, deadline, windows)
        rows.append(row(point, ours, None))
        save(out, meta, rows)
        _say(point, "ours", ours.status, ours.window_tokens_per_s, ours.detail)
        if point.ours_only:
            continue
        titan = run_titan(point, call.assets, out, deadline)
        rows[-1] = row(point, ours, titan)
        save(out, meta, rows)
        _say(point, "torchtitan", titan.status, titan.tokens_per_s_per_gpu, titan.detail)
    return rows


def _say(point: Point, who: str, status: str, tps: float | None, detail: str) -> None:
    figure = f"{tps:,.0f} tok/s/GPU" if tps else ""
    print(f"[{time.strftime('%H:%M:%S')}] {point.name} {who}: {status} {figure} {detail[:300]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="same", help="comma-separated subsets or configurations")
    parser.add_argument("--card", choices=CARDS, help="the GPU this runs on (checked against nvidia-smi)")
    parser.add_argument("--windows", default="", help="in-process A/B switch sets, ';'-separated")
    parser.add_argument("--windows-on", default="", help="comma-separated configurations that get --windows")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    parser.add_argument(
        "--budget-s", type=float, default=540.0, help="start no launch that cannot end by then"
    )
    parser.add_argument("--assets", type=Path, default=ASSETS, help="tokenizer/ and data/ for torchtitan")
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU: parse torchtitan's config, count parameters"
    )
    parser.add_argument("--report", nargs="+", type=Path, help="print the doc's table from saved JSON files")
    args = parser.parse_args()
    if args.report:
        print(markdown([r for path in args.report for r in json.loads(path.read_text())["rows"]]))
        return
    try:
        points = expand(args.configs)
        trainer_h200.window_variants(args.windows, "--windows")
    except ValueError as err:
        parser.error(str(err))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        from benchmarks.titan_dry_run import dry_run

        ensure_assets(args.assets)
        dry_run(points, args.assets, args.out)
        return
    if not args.card:
        parser.error("--card: name the GPU (h100 or h200): every figure is kept with its card")
    call = Call(
        args.card,
        args.budget_s,
        args.assets,
        args.windows,
        frozenset(filter(None, args.windows_on.split(","))),
    )
    rows = run(points, args.out, call)
    print(table(rows))


if __name__ == "__main__":
    main()

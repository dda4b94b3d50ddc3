"""benchmarks/titan_side_by_side.py's CPU-testable parts: its reading of torchtitan's log, its
configurations, and the two models being one shape in both trainers' words.

The GPU figures come from the H100 and H200 runs (docs/benchmarks/titan_h100.md, titan_h200.md). The full
check against torchtitan itself (its config parser on the real arguments, its model built on the meta
device, its data loader on the carried files, its default log cadence) is `python
benchmarks/titan_side_by_side.py --configs all --dry-run`, which needs torchtitan's wheel.
"""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path

import pytest
from benchmarks import trainer_h200
from benchmarks.titan_shapes import MODELS, ROPE_SCALING_TITAN
from benchmarks.titan_side_by_side import (
    SUBSETS,
    TIMED,
    TITAN_LOG_FREQ,
    TOML,
    WARMUP,
    Point,
    TitanResult,
    check_card,
    expand,
    launch,
    markdown,
    parse_point,
    parse_titan_log,
    row,
    table,
    titan_args,
)

from blackwell_operator.calibration import load_calibration
from blackwell_trainer.plan.config import Architecture

PREFIX = "[rank0]:[titan] 2026-12-01 22:40:01,123 - root - INFO - "


def step_line(step: int, tps: float, reserved: float, *, colour: bool = False) -> str:
    """One step's line as torchtitan 0.2.2's MetricsProcessor.log writes it (its f-string's formats)."""
    red, reset = ("\x1b[31m", "\x1b[39m") if colour else ("", "")
    return (
        f"{PREFIX}{red}step: {step:2}  loss: {10.5 - step / 10:8.5f}  grad_norm: {1.2345:7.4f}  "
        f"memory: {reserved:5.2f}GiB({100 * reserved / 139.8:.2f}%)  tps: {round(tps):,}  "
        f"tflops: {412.5:,.2f}  mfu: {41.7:.2f}%{reset}"
    )


def log(tps: dict[int, float], reserved: float, *, colour: bool = False) -> str:
    """A run's log with a line at each step of `tps` (torchtitan logs step 1 and every log_freq-th)."""
    head = [
        f"{PREFIX}Model btj_llama3 3B_untied size: 3,606,752,256 total parameters",
        f"{PREFIX}Training starts",
    ]
    steps = [step_line(step, t, reserved + step / 100, colour=colour) for step, t in sorted(tps.items())]
    return "\n".join(head + steps + [f"{PREFIX}Training completed"])


def test_the_window_after_warm_up_and_the_largest_reserved_memory() -> None:
    """At its default cadence torchtitan logs steps 1, 10, 20 and 30: the lines at 20 and 30 each cover
    ten steps after warm-up; the line at 10 covers steps 2-10 (compile tails) and is left out."""
    got = parse_titan_log(log({1: 312.0, 10: 20_100, 20: 24_000, 30: 26_000}, 70.0), warmup=10)
    assert got.status == "ok"
    assert got.tps_steps == [24_000, 26_000] and got.window_steps == [10, 10]
    # 20 steps' tokens over the time of both windows: 20 / (10/24000 + 10/26000) = 24,960
    assert got.tokens_per_s_per_gpu == pytest.approx(24_960.0)
    assert got.peak_reserved_gib == pytest.approx(70.3)  # the largest memory line, not the last
    assert got.parameters == 3_606_752_256
    assert got.logged_steps == [1, 10, 20, 30] and len(got.losses) == 4


def test_a_line_whose_window_reaches_into_warm_up_is_left_out() -> None:
    """Logged every step (the old harness's log_freq 1), the lines after step `warmup` are the windows."""
    got = parse_titan_log(log({s: 1000.0 * s for s in range(1, 7)}, 60.0), warmup=3)
    assert got.tps_steps == [4000, 5000, 6000] and got.window_steps == [1, 1, 1]
    assert got.tokens_per_s_per_gpu == pytest.approx(3 / (1 / 4000 + 1 / 5000 + 1 / 6000))


def test_colours_and_a_large_tps_are_read_too() -> None:
    got = parse_titan_log(log({1: 1e3, 10: 1e3, 20: 1_234_567.0}, 60.0, colour=True), warmup=WARMUP)
    assert got.tokens_per_s_per_gpu == pytest.approx(1_234_567)
    assert got.peak_reserved_gib == pytest.approx(60.2)


def test_the_harness_leaves_torchtitans_log_cadence_at_its_default() -> None:
    """torchtitan 0.2.2's metrics.log_freq defaults to 10; the TOML must not set it, and the warm-up and
    the timed steps are whole windows of it."""
    assert "log_freq" not in tomllib.loads(TOML.read_text()).get("metrics", {})
    assert WARMUP % TITAN_LOG_FREQ == 0 and TIMED % TITAN_LOG_FREQ == 0 and TIMED > 0


def test_an_out_of_memory_is_named_and_gives_no_figure() -> None:
    text = log({1: 300.0}, 79.0) + (
        "\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. "
        "GPU 0 has a total capacity of 79.19 GiB"
    )
    got = parse_titan_log(text)
    assert got.status == "oom"
    assert got.tokens_per_s_per_gpu is None
    assert "Tried to allocate 3.91 GiB" in got.detail


def test_a_run_that_never_got_past_warm_up_is_an_error_with_its_tail() -> None:
    got = parse_titan_log(log({1: 300.0, 10: 2e4}, 70.0) + "\nRuntimeError: NCCL went away", warmup=10)
    assert got.status == "error"
    assert "NCCL went away" in got.detail


def test_the_card_must_be_the_one_nvidia_smi_reports() -> None:
    assert check_card("h100", "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB") is None
    wrong = check_card("h200", "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB")
    assert wrong is not None and "--card h200" in wrong and "H100 80GB" in wrong


def test_configurations_and_subsets() -> None:
    assert parse_point("3b-fp8-b4") == Point("3b-fp8-b4", "3b", "fp8", 4, 4)
    assert parse_point("3b-fp8-t8-o9") == Point("3b-fp8-t8-o9", "3b", "fp8", 8, 9)
    alone = parse_point("ours-3b-bf16-b2+attention=cudnn+manual_gc=true")
    assert alone == Point(alone.name, "3b", "bf16", 2, 2, True, "attention=cudnn,manual_gc=true")
    # Keys with digits (BTJ_TRAINER_TUNING's fp8_* switches) are keys too.
    assert parse_point("ours-1b-fp8-b4+fp8_skip_small=true").tuning == "fp8_skip_small=true"
    chunked = parse_point("ours-3b-fp8-b2+loss_chunk=4096")
    assert (chunked.loss_chunk, chunked.tuning) == (4096, "")
    # Without one, the chunk every plan runs (the shipped profile's).
    assert parse_point("3b-fp8-b2").loss_chunk == load_calibration().trainer.loss_chunk_tokens == 4096
    assert parse_point("ours-3b-fp8-b2+loss_chunk=8192").loss_chunk == 8192
    assert set(SUBSETS["same"]) == {"3b-bf16-b2", "3b-fp8-b2", "1b-bf16-b4", "1b-fp8-b4"}
    assert [p.name for p in expand("same-3b,3b-bf16-b2,1b-fp8-b4")] == [*SUBSETS["same-3b"], "1b-fp8-b4"]
    assert set(SUBSETS["all"]) == set(SUBSETS["same-3b"]) | set(SUBSETS["1b-best"])
    for bad in ("3b-fp16-b4", "8b-bf16-b2", "3b-bf16-b0", "3b-bf16", "sam", "ours-3b-bf16-b2+colour=red"):
        with pytest.raises(ValueError, match="--configs"):
            expand(bad)


def test_fp8_adds_torchtitans_float8_converter_and_bf16_none() -> None:
    fp8 = titan_args(parse_point("3b-fp8-b2"), trainer_h200.REPO / ".titan", trainer_h200.REPO / "x")
    bf16 = titan_args(parse_point("3b-bf16-b2"), trainer_h200.REPO / ".titan", trainer_h200.REPO / "x")
    assert fp8[fp8.index("--model.converters") + 1] == "quantize.linear.float8"
    assert "--model.converters" not in bf16
    assert bf16[bf16.index("--training.local_batch_size") + 1] == "2"


@pytest.mark.parametrize("key", sorted(MODELS))
def test_both_trainers_get_one_shape(key: str) -> None:
    model = MODELS[key]
    ours = Architecture(**trainer_h200.SHAPES[model.ours])
    titan = model.titan_args
    assert ours.parameter_count() == model.parameters
    assert not ours.tie_word_embeddings  # torchtitan's llama3 ties nothing
    shape = (ours.hidden_size, ours.num_layers, ours.num_attention_heads, ours.num_key_value_heads)
    assert (titan["dim"], titan["n_layers"], titan["n_heads"], titan["n_kv_heads"]) == shape
    assert titan["vocab_size"] == ours.vocab_size
    assert (titan["rope_theta"], titan["norm_eps"]) == (ours.rope_theta, ours.norm_eps)
    assert ours.rope_scaling is not None
    assert {
        "scaling_factor": ours.rope_scaling.factor,
        "low_freq_factor": ours.rope_scaling.low_freq_factor,
        "high_freq_factor": ours.rope_scaling.high_freq_factor,
        "original_max_position_embeddings": ours.rope_scaling.original_max_position_embeddings,
    } == ROPE_SCALING_TITAN


def test_a_row_holds_both_figures_their_ratio_and_the_table_shows_them() -> None:
    point = parse_point("1b-bf16-b4")
    ours = trainer_h200.Record(point.name, {}, "ok", tokens_per_s_per_gpu=65_000.0, peak_reserved_gib=60.0,
                               window_tokens_per_s=66_000.0)  # fmt: skip
    titan = TitanResult(status="ok", tokens_per_s_per_gpu=60_000.0, peak_reserved_gib=55.5,
                        parameters=MODELS["1b"].parameters)  # fmt: skip
    got = row(point, ours, titan)
    assert got["ratio_tokens_per_s"] == 1.1
    assert got["parameters"]["equal"]
    assert got["parameters"]["ours_model"] == MODELS["1b"].parameters
    differ = row(point, ours, TitanResult(status="ok", parameters=1))
    assert not differ["parameters"]["equal"]
    assert differ["ratio_tokens_per_s"] is None
    shown = table([got, differ])
    assert "66,000" in shown and "60,000" in shown and "1.100" in shown and "60.0 / 55.5" in shown
    assert "DIFFER" in shown.splitlines()[2]
    best = row(parse_point("3b-fp8-t8-o9"), ours, titan)
    doc = markdown([got, best]).splitlines()
    assert doc[2] == "| 1B BF16, batch 4 | 66,000 | 60,000 | 1.10 | 60.0 / 55.5 |"
    assert doc[3].startswith("| 3B FP8 tensorwise, batch 9 / 8 |")


def _alive(pid: int) -> bool:
    """Running (a zombie, killed and not yet reaped, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_a_hung_launch_is_killed_with_the_process_it_started(tmp_path: Path) -> None:
    """torchrun's worker is torchrun's child: killing torchrun alone would leave it on the GPU."""
    pid_file = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pid_file}; echo started; wait"
    out, rc = launch(["bash", "-c", script], dict(os.environ), timeout=1)
    assert rc is None and out == "started\n"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_window_may_change_only_the_switches_read_every_step() -> None:
    """In-process windows run on one built trainer: a switch it reads only when built would time the same
    trainer twice, so the call is refused before any GPU time is spent."""
    from blackwell_trainer.plan.tuning import Tuning

    assert trainer_h200.window_variants(
        "clip_in_optimizer=false; compiled_update=false;manual_gc=true", "--windows"
    ) == ["clip_in_optimizer=false", "compiled_update=false", "manual_gc=true"]
    with pytest.raises(ValueError, match=r"'bf16_gradients=true': bf16_gradients act only when the trainer"):
        trainer_h200.window_variants("parameter_check=true;bf16_gradients=true", "--windows")
    with pytest.raises(ValueError, match=r"--windows: .*'nope=1' is not key=value"):
        trainer_h200.window_variants("nope=1", "--windows")
    assert Tuning.built_once("recast-blocks=true,parameter_check=true") == ["recast_blocks"]


def test_the_worker_refuses_a_window_that_would_time_the_same_trainer_twice() -> None:
    cfg = trainer_h200.Config("3b", 2, windows="manual_gc=true;recast_blocks=true")
    with pytest.raises(
        ValueError, match="windows: 'recast_blocks=true': recast_blocks act only when the trainer is built"
    ):
        trainer_h200._ab_windows(None, [], cfg)  # refused before the trainer is touched

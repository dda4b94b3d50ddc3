"""Time model components against hand calculations and the measured TE GEMM speedups on H200."""

from __future__ import annotations

import pytest

from blackwell_operator.calibrate.fit import with_constants
from blackwell_operator.calibration import load_calibration
from blackwell_operator.catalogs import get_gpu
from blackwell_operator.planner.throughput import estimate_time, linear_time
from blackwell_trainer.plan.config import PrecisionRecipe
from tests.support.specs import fsdp_on_one_gpu, hardware, layout, setting, shapes

BTJ = load_calibration("btj-trainer")
REF = load_calibration("h200-reference")
H200 = get_gpu("H200")
BW = H200.hbm_bandwidth * BTJ.throughput.memory_bandwidth_efficiency

# docs/reference/h200-measurements.md, 8192 tokens fwd+bwd: BF16 TFLOP/s, TE Delayed/Current/Block speedups.
TE_BENCH = {
    (4096, 14336): (708, 1.77, 1.58, 1.36),
    (14336, 4096): (709, 1.64, 1.46, 1.32),
    (4096, 4096): (737, 0.75, 0.66, 0.73),
}


# The benchmark's te.Linear alone moved less cast/scale traffic than TE inside our trainer (eager blocks,
# FSDP2's BF16 weights, recompute), whose value btj-trainer fits to the trainer runs; the GEMM efficiencies
# are the benchmark's. These were the bytes per element derived from the benchmark with those efficiencies.
ISOLATED_CAST_BYTES = {"delayed": 3.4, "current": 9.2, "block": 7.0}


def _layer_seconds(recipe: str, k: int, n: int, peak_key: str, cast_bytes: float | None = None) -> float:
    rc = BTJ.recipe(9, PrecisionRecipe(recipe))
    if cast_bytes is not None:
        rc = rc.model_copy(update={"quant_bytes_per_element": cast_bytes})
    gpu_time, _ = linear_time(8192, k, n, rc, H200.peak_flops[peak_key], BW)
    # Issued alone, a layer waits for the host when the host is slower (the benchmark's 4096x4096 case).
    return max(gpu_time, rc.cpu_seconds_per_linear)


def test_linear_time_hand_calculation() -> None:
    rc = BTJ.recipe(9, PrecisionRecipe.CURRENT)
    total, fwd = linear_time(1000, 200, 300, rc, 1e15, 1e12)
    one = 2 * 1000 * 200 * 300 / (1e15 * rc.efficiency) + rc.gemm_overhead_seconds
    cast = rc.quant_bytes_per_element * (1000 * 200 + 200 * 300 + 1000 * 300) / 1e12
    assert total == pytest.approx(3 * one + cast)
    assert fwd == pytest.approx(one + cast / 3)


@pytest.mark.parametrize(("shape", "measured"), sorted(TE_BENCH.items()))
def test_te_gemm_speedups_on_h200_are_reproduced(shape: tuple[int, int], measured: tuple[float, ...]) -> None:
    k, n = shape
    bf16 = _layer_seconds("none", k, n, "bf16")
    assert 6 * 8192 * k * n / bf16 / 1e12 == pytest.approx(measured[0], rel=0.06)
    # Speedups over the benchmark's own BF16 layer (BF16 efficiency is fitted to the trainer, checked above).
    bench_bf16 = 6 * 8192 * k * n / (measured[0] * 1e12)
    for recipe, speedup in zip(("delayed", "current", "block"), measured[1:], strict=True):
        isolated = _layer_seconds(recipe, k, n, "fp8", ISOLATED_CAST_BYTES[recipe])
        assert bench_bf16 / isolated == pytest.approx(speedup, rel=0.08), recipe


def test_small_gemms_gain_little_or_lose_from_low_precision() -> None:
    b200 = get_gpu("B200")
    bw = b200.hbm_bandwidth * 0.8
    rb = BTJ.recipe(10, PrecisionRecipe.NONE)
    for recipe, peak in (("mxfp8-block", "fp8"), ("nvfp4-block", "fp4")):
        rc = BTJ.recipe(10, PrecisionRecipe(recipe))
        gains = []
        for width in (512, 1024, 2048, 4096, 8192, 16384):
            bf16, _ = linear_time(8192, width, width, rb, b200.peak_flops["bf16"], bw)
            low, _ = linear_time(8192, width, width, rc, b200.peak_flops[peak], bw)
            gains.append(bf16 / low)
        assert gains == sorted(gains), recipe  # the gain grows with the GEMM
        assert gains[0] < 1.0 < gains[-1], recipe  # tiny GEMMs lose, large ones gain


def test_step_time_adds_up_and_tokens_per_second_follows() -> None:
    sh, hw = shapes(), hardware()
    st = setting(mbs=2)
    t = estimate_time(sh, BTJ, hw, st, layout(st, hw), 4096, gradient_accumulation_steps=3)
    assert sum(t.breakdown.values()) == pytest.approx(t.step_time_seconds, rel=1e-5)
    assert t.tokens_per_second_per_gpu == pytest.approx(3 * 2 * 4096 / t.step_time_seconds)
    flops_per_token = 6 * (8_030_261_248 - 128256 * 4096) + 12 * 32 * 4096 * 4096
    assert t.model_flops_utilization == pytest.approx(t.tokens_per_second_per_gpu * flops_per_token / 2.25e15)


def test_attention_is_causal_flash_7_s2_q_per_layer() -> None:
    sh, hw = shapes(), hardware()
    st = setting(mbs=1)
    t = estimate_time(sh, BTJ, hw, st, layout(st, hw), 8192)
    efficiency = (
        BTJ.throughput.attention_efficiency * 8192 / (8192 + BTJ.throughput.attention_short_sequence_tokens)
    )
    expected = 32 * 7 * 8192**2 * 4096 / (2.25e15 * efficiency)
    assert t.breakdown["attention"] == pytest.approx(expected, rel=1e-5)


def test_optimizer_step_is_memory_bound_over_the_local_shard() -> None:
    sh = shapes()
    for nodes in (1, 2):
        hw = hardware(nodes=nodes)
        st = setting()
        t = estimate_time(sh, BTJ, hw, st, layout(st, hw), 4096)
        expected = 28 * 8_030_261_248 / (8 * nodes) / (8e12 * 0.8)
        assert t.breakdown["optimizer"] == pytest.approx(expected, abs=1e-6)


def test_every_micro_batch_after_the_first_adds_its_gradients_once() -> None:
    """One pass over the local gradients per accumulated micro-batch (12 bytes a parameter by default):
    none with one micro-batch a step, ga - 1 with ga, over the shard on several GPUs."""
    sh = shapes()
    psi = 8_030_261_248
    for nodes in (1, 2):
        hw = hardware(nodes=nodes)
        st = setting(mbs=2)
        steps = {
            ga: estimate_time(sh, BTJ, hw, st, layout(st, hw), 4096, gradient_accumulation_steps=ga)
            for ga in (1, 4)
        }
        assert steps[1].breakdown["gradient_accumulation"] == 0.0
        expected = 3 * 12.0 * psi / (8 * nodes) / (8e12 * 0.8)
        assert steps[4].breakdown["gradient_accumulation"] == pytest.approx(expected, rel=1e-6)
    # A fitted value moves it proportionally and nothing else.
    doubled = with_constants(BTJ, {"throughput.gradient_accumulation_bytes_per_param": 24.0})
    hw = hardware()
    st = setting(mbs=2)
    base, more = (
        estimate_time(sh, cal, hw, st, layout(st, hw), 4096, gradient_accumulation_steps=4)
        for cal in (BTJ, doubled)
    )
    assert more.breakdown["gradient_accumulation"] == pytest.approx(
        2 * base.breakdown["gradient_accumulation"]
    )
    assert more.breakdown["gemm"] == base.breakdown["gemm"]


def test_the_forward_share_of_the_casts_moves_full_ac_and_nothing_else() -> None:
    """forward_cast_share (a third unless fitted): what full AC's recompute pays again of the FP8 casts;
    the step without recompute keeps every cast, whatever the share."""
    rc = BTJ.recipe(9, PrecisionRecipe.TORCHAO_TENSORWISE)
    assert rc.forward_cast_share == pytest.approx(1 / 3)
    fifth = rc.model_copy(update={"forward_cast_share": 0.2})
    (total, fwd), (total_fifth, fwd_fifth) = (
        linear_time(8192, 3072, 8192, r, 1e15, 3e12) for r in (rc, fifth)
    )
    assert total_fifth == total
    cast = rc.quant_bytes_per_element * (8192 * 3072 + 3072 * 8192 + 8192 * 8192) / 3e12
    assert fwd - fwd_fifth == pytest.approx(cast * (1 / 3 - 0.2))
    sh, hw = shapes(), hardware()
    share = f"throughput.recipes.{hw.gpu.major}.torchao-tensorwise.forward_cast_share"
    fitted = with_constants(BTJ, {share: 0.2})
    for ac, faster in (("none", False), ("full", True)):
        st = setting(ac=ac, mbs=2, precision="fp8", recipe="torchao-tensorwise")
        before, after = (estimate_time(sh, c, hw, st, layout(st, hw), 4096) for c in (BTJ, fitted))
        assert (after.step_time_seconds < before.step_time_seconds) is faster, ac
        assert after.step_time_seconds <= before.step_time_seconds


def test_the_full_recompute_share_scales_full_ac_recompute_only() -> None:
    """full_recompute_share (1 unless fitted: the whole forward again) scales what full AC recomputes, and
    nothing else: selective AC and AC none keep their step times."""
    assert BTJ.throughput.full_recompute_share == 1.0
    sh, hw = shapes(), hardware()
    fitted = with_constants(BTJ, {"throughput.full_recompute_share": 0.8})
    for ac in ("none", "selective", "full"):
        st = setting(ac=ac, mbs=2)
        before, after = (estimate_time(sh, c, hw, st, layout(st, hw), 4096) for c in (BTJ, fitted))
        assert after.breakdown["recompute"] == pytest.approx(
            before.breakdown["recompute"] * (0.8 if ac == "full" else 1.0)
        ), ac
        others = set(before.breakdown) - {"recompute", "host_stall"}
        assert {k: after.breakdown[k] for k in others} == {k: before.breakdown[k] for k in others}, ac


def test_recompute_costs_more_with_full_than_selective_checkpointing() -> None:
    sh, hw = shapes(), hardware()
    times = {}
    for ac in ("none", "selective", "full"):
        st = setting(ac=ac, mbs=2)
        times[ac] = estimate_time(sh, BTJ, hw, st, layout(st, hw), 4096)
    assert times["none"].breakdown["recompute"] == 0
    assert 0 < times["selective"].breakdown["recompute"] < times["full"].breakdown["recompute"]
    # Full recompute ~ one more forward: 20-30% of the step for an 8B model.
    ratio = times["none"].tokens_per_second_per_gpu / times["full"].tokens_per_second_per_gpu
    assert 1.15 < ratio < 1.4


def test_no_communication_on_one_gpu_and_exposed_efa_traffic_across_nodes() -> None:
    sh = shapes()
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    st = setting()
    t1 = estimate_time(sh, REF, one, st, layout(st, one), 4096)
    assert t1.breakdown["fsdp_comm_exposed"] == 0
    # Full sharding over 64 nodes crosses EFA (50 GB/s per GPU): with mbs 1 it cannot all hide.
    many = hardware(nodes=64)
    t64 = estimate_time(sh, BTJ, many, st, layout(st, many), 4096)
    node = hardware(nodes=1)
    t_node = estimate_time(sh, BTJ, node, st, layout(st, node), 4096)
    assert t64.breakdown["fsdp_comm_exposed"] > t_node.breakdown["fsdp_comm_exposed"]
    hybrid = setting(sharding="hybrid")
    t_h = estimate_time(sh, BTJ, many, hybrid, layout(hybrid, many), 4096)
    assert t_h.breakdown["fsdp_comm_exposed"] < t64.breakdown["fsdp_comm_exposed"]


def test_context_parallel_splits_attention_per_gpu_at_a_small_overhead() -> None:
    sh, hw = shapes(), hardware()
    a = setting(mbs=1)
    b = setting(mbs=1, cp=2)
    ta = estimate_time(sh, BTJ, hw, a, layout(a, hw), 32768)
    tb = estimate_time(sh, BTJ, hw, b, layout(b, hw), 32768)
    short = BTJ.throughput.attention_short_sequence_tokens
    overhead = (1 + BTJ.throughput.cp_attention_overhead / 2) * (1 + short / 16384) / (1 + short / 32768)
    assert tb.breakdown["attention"] == pytest.approx(ta.breakdown["attention"] / 2 * overhead, rel=1e-5)


def test_compile_reduces_memory_bound_time() -> None:
    sh, hw = shapes(), hardware()
    compiled, eager = setting(), setting(compile_blocks=False)
    tc = estimate_time(sh, BTJ, hw, compiled, layout(compiled, hw), 4096)
    te = estimate_time(sh, BTJ, hw, eager, layout(eager, hw), 4096)
    assert te.breakdown["memory_bound"] > tc.breakdown["memory_bound"]


def test_memory_bound_work_is_elementwise_plus_loss_traffic() -> None:
    sh, hw = shapes(), hardware()
    st = setting(mbs=2)
    t = estimate_time(sh, BTJ, hw, st, layout(st, hw), 4096)
    tp = BTJ.throughput
    tokens = 2 * 4096
    elementwise = 32 * tokens * (tp.elementwise_bytes_hidden * 4096 + tp.elementwise_bytes_ffn * 14336)
    loss = tokens * 128256 * tp.loss_traffic_bytes_per_logit
    assert t.breakdown["memory_bound"] == pytest.approx((elementwise + loss) / (8e12 * 0.8), rel=1e-9)


def test_host_time_stalls_the_gpu_for_small_te_micro_batches() -> None:
    # TE FP8 issues ~1.5 ms of host work per linear: at one short sequence the GPU waits for the host.
    sh, hw = shapes("llama3.2-1b"), hardware()
    small = setting(precision="fp8", recipe="delayed", mbs=1)
    large = setting(precision="fp8", recipe="delayed", mbs=16)
    t_small = estimate_time(sh, BTJ, hw, small, layout(small, hw), 2048)
    t_large = estimate_time(sh, BTJ, hw, large, layout(large, hw), 2048)
    cpu = 16 * (
        7 * BTJ.recipe(10, PrecisionRecipe.DELAYED).cpu_seconds_per_linear
        + BTJ.throughput.cpu_seconds_per_layer
    )
    gpu = sum(t_small.breakdown[k] for k in ("gemm", "attention", "memory_bound", "recompute"))
    assert t_small.breakdown["host_stall"] == pytest.approx(cpu - gpu, rel=1e-6)
    assert t_large.breakdown["host_stall"] == 0


def test_fsdp_collectives_over_efa_hand_calculation() -> None:
    # 8B, full sharding over 2 nodes (16 GPUs), mbs 1: all-gather bf16 twice + reduce-scatter fp32 per
    # micro-batch over the per-GPU EFA share (400 GB/s / 8) at 80% bus efficiency, 90% hidden by compute.
    sh, hw = shapes(), hardware(nodes=2)
    st = setting(mbs=1)
    t = estimate_time(sh, BTJ, hw, st, layout(st, hw), 4096)
    psi = 8_030_261_248
    bw = 400e9 / 8 * 0.8
    gather = 2 * (2 * psi * 15 / 16 / bw)
    scatter = 4 * psi * 15 / 16 / bw
    compute = sum(t.breakdown[k] for k in ("gemm", "attention", "memory_bound", "recompute"))
    comm = gather + scatter
    interference = BTJ.throughput.comm_interference
    exposed = max(0.0, comm - 0.9 * compute, interference * comm) + gather / 2 / 32
    assert t.breakdown["fsdp_comm_exposed"] == pytest.approx(exposed, rel=1e-9)


def test_overlapped_collectives_still_cost_their_interference_share() -> None:
    # One B200 node, a micro-batch large enough that compute hides every collective: without interference only
    # the first layer's gather shows; with it, that share of the whole collective time shows too.
    sh, hw = shapes(), hardware(nodes=1)
    st = setting(mbs=8)
    hidden = with_constants(REF, {"throughput.comm_interference": 0.0})
    shared = with_constants(REF, {"throughput.comm_interference": 0.25})
    t0 = estimate_time(sh, hidden, hw, st, layout(st, hw), 4096)
    t1 = estimate_time(sh, shared, hw, st, layout(st, hw), 4096)
    psi = 8_030_261_248
    bw = hw.gpu.nvlink_bandwidth * REF.throughput.nccl_bus_efficiency
    gather = 2 * (2 * psi * 7 / 8 / bw)
    scatter = 4 * psi * 7 / 8 / bw
    first_layer = gather / 2 / 32
    assert t0.breakdown["fsdp_comm_exposed"] == pytest.approx(first_layer, rel=1e-9)
    shown = 0.25 * (gather + scatter) + first_layer
    assert t1.breakdown["fsdp_comm_exposed"] == pytest.approx(shown, rel=1e-9)
    assert t1.tokens_per_second_per_gpu < t0.tokens_per_second_per_gpu


def test_weights_resharded_after_forward_pay_the_regather_copies() -> None:
    # FSDP2 on one H200 keeps 1B's bf16 weights (no second gather) but reshards 8B's, whose backward
    # casts and splits every weight again: only 8B pays fsdp_regather_bytes_per_param.
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    st = setting(mbs=1)
    bw = H200.hbm_bandwidth * BTJ.throughput.memory_bandwidth_efficiency
    fsdp = fsdp_on_one_gpu(BTJ)
    without = with_constants(fsdp, {"throughput.fsdp_regather_bytes_per_param": 0.0})
    with_ = with_constants(fsdp, {"throughput.fsdp_regather_bytes_per_param": 10.0})
    for preset, pays in (("llama3.2-1b", False), ("llama3.1-8b", True)):
        sh = shapes(preset)
        t0 = estimate_time(sh, without, one, st, layout(st, one), 4096)
        t1 = estimate_time(sh, with_, one, st, layout(st, one), 4096)
        extra = t1.breakdown["fsdp_copies"] - t0.breakdown["fsdp_copies"]
        assert extra == pytest.approx(10.0 * sh.total_params / bw if pays else 0.0, rel=1e-9, abs=1e-12)

"""The ``fp32_weight_gradients`` switch (issue 38): each block matrix's weight gradient comes from its GEMM in
fp32 (model/wide_grad.py) instead of a bf16 GEMM output cast by autograd. The forward and the input
gradients are the same bit for bit, the weight gradient is the unrounded sum, what is kept for backward does
not grow, and where it cannot act the trainer says why."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import tests.support.loss_reference as reference
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.model.transformer import Linear
from blackwell_trainer.model.wide_grad import mixed_mm, wide_linear
from blackwell_trainer.plan.config import ActivationCheckpointing
from blackwell_trainer.plan.tuning import Tuning

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.distributed.*:UserWarning")
ON = Tuning(fp32_weight_gradients=True)
RECORD = json.loads(reference.REFERENCE.read_text())


def _inputs() -> tuple[torch.Tensor, torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(2, 24, 64, generator=generator).bfloat16().requires_grad_()
    return x, torch.nn.Parameter(torch.randn(48, 64, generator=generator) * 0.05)


def _grads(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, ...]:
    x, weight = _inputs()
    out = fn(x, weight)
    (out.float().square().sum() / out.numel()).backward()
    assert x.grad is not None and weight.grad is not None
    return out.detach(), x.grad, weight.grad


def _autograd_cast(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight.to(x.dtype))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("keep", [True, False], ids=["keeps-the-copy", "casts-again"])
def test_the_output_and_input_gradient_are_the_same_and_the_weight_gradient_is_not_rounded(
    keep: bool, compiled: bool
) -> None:
    def wide(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return wide_linear(x, weight, keep=keep)

    out, grad_x, grad_w = _grads(torch.compile(wide, fullgraph=True) if compiled else wide)
    plain_out, plain_grad_x, plain_grad_w = _grads(_autograd_cast)
    assert torch.equal(out, plain_out) and torch.equal(grad_x, plain_grad_x)
    assert grad_w.dtype == plain_grad_w.dtype == torch.float32
    # autograd's is the bf16 GEMM output widened: this one's rounded to bf16 is that, to one bf16 step
    step = plain_grad_w.abs() * 2.0**-7
    assert bool(((grad_w - plain_grad_w).abs() <= step).all())
    # and it is not rounded: most values differ from a bf16 number
    assert (grad_w != grad_w.bfloat16().float()).float().mean() > 0.5


def _saved_bytes(keep: bool | None) -> int:
    """Bytes the forward keeps for backward beyond the input and the parameter (held anyway)."""
    x, weight = _inputs()
    held = {x.untyped_storage().data_ptr(), weight.untyped_storage().data_ptr()}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in held:
            kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _ = _autograd_cast(x, weight) if keep is None else wide_linear(x, weight, keep=keep)
    return sum(kept.values())


def test_what_is_kept_for_backward_is_the_copy_or_nothing_new() -> None:
    copy_bytes = 48 * 64 * 2
    assert _saved_bytes(None) == copy_bytes  # autograd's cast: the matmul saves the bf16 copy
    assert _saved_bytes(True) == copy_bytes
    assert _saved_bytes(False) == 0  # the fp32 parameter, cast again in backward


def _trainer(tuning: Tuning, *, ac: str = "none", compute: torch.dtype = torch.bfloat16) -> Trainer:
    plan = reference.reference_plan()
    plan.chosen.activation_checkpointing = ActivationCheckpointing(ac)
    return Trainer(plan, reference.ONE, tuning=tuning, compute_dtype=compute)


def _block_linears(trainer: Trainer) -> list[Linear]:
    return [m for m in trainer.model.layers.modules() if type(m) is Linear]


@pytest.mark.parametrize(
    "tuning,keep",
    [(ON, True), (Tuning(fp32_weight_gradients=True, recast_blocks=True), False)],
    ids=["copies-kept", "where-recast-would-act"],
)
def test_the_trainer_takes_the_block_weight_gradients_in_fp32_and_trains_the_bf16_reference(
    tuning: Tuning, keep: bool
) -> None:
    with reference.one_rank_group():
        trainer = _trainer(tuning)
        linears = _block_linears(trainer)
        assert linears and all(m.wide_keep is keep for m in linears)
        assert not trainer.model.recast_blocks  # the op saves the fp32 parameter in recast's place
        got = [trainer.step(batch).loss for batch in reference.reference_batches()]
    torch.testing.assert_close(got, RECORD["losses"]["bf16"], rtol=1e-3, atol=0)
    # A control: the weight gradients are not autograd's, so the losses are not bit for bit the default's.
    assert got != RECORD["losses"]["bf16"]


@pytest.mark.parametrize(
    "tuning,ac,compute,why",
    [
        (ON, "selective", torch.bfloat16, "selective AC's policy does not see the matmul"),
        (replace(ON, bf16_gradients=True), "none", torch.bfloat16, "keeps them in bf16"),
        (ON, "none", torch.float32, "compute in their parameters' own dtype"),
        (replace(ON, single_device="fsdp"), "none", torch.bfloat16, "FSDP2 hands"),
    ],
    ids=["selective-ac", "bf16-gradients", "fp32-compute", "fsdp2"],
)
def test_where_it_cannot_act_the_log_says_why_and_autograd_casts(
    caplog: pytest.LogCaptureFixture, tuning: Tuning, ac: str, compute: torch.dtype, why: str
) -> None:
    caplog.set_level(logging.INFO, logger="blackwell_trainer")
    with reference.one_rank_group():
        trainer = _trainer(tuning, ac=ac, compute=compute)
    said = [r.getMessage() for r in caplog.records if "fp32_weight_gradients" in r.getMessage()]
    assert len(said) == 1 and "fp32_weight_gradients off" in said[0] and why in said[0], said
    assert all(m.wide_keep is None for m in trainer.model.modules() if isinstance(m, Linear))


def test_full_ac_recomputes_through_the_op(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="blackwell_trainer")
    with reference.one_rank_group():
        wide, plain = _trainer(ON, ac="full"), _trainer(Tuning(), ac="full")
        assert all(m.wide_keep is True for m in _block_linears(wide))
        batches = reference.reference_batches()[:3]
        got = [wide.step(b).loss for b in batches]
        expected = [plain.step(b).loss for b in batches]
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=0)
    said: list[Any] = [r.getMessage() for r in caplog.records if "fp32_weight_gradients:" in r.getMessage()]
    assert said and "saving its bf16 copy" in said[0]


def test_the_gpu_gemm_call_is_one_this_torch_knows() -> None:
    """The CUDA path's call, on the meta device (shapes and dtypes only: the CPU has no such kernel)."""
    rows = torch.empty(4096, 48, dtype=torch.bfloat16, device="meta")
    inputs = torch.empty(4096, 64, dtype=torch.bfloat16, device="meta")
    out = mixed_mm(rows.t(), inputs)
    assert out.shape == (48, 64) and out.dtype == torch.float32


def test_a_torch_without_the_fp32_output_gemm_is_named_and_autograd_casts(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import blackwell_trainer.parallel.parallelize as parallelize

    monkeypatch.setattr(parallelize, "mixed_mm_available", lambda device: "torch 2.7 has no such mm")
    caplog.set_level(logging.INFO, logger="blackwell_trainer")
    with reference.one_rank_group():
        trainer = _trainer(ON)
    said = [r.getMessage() for r in caplog.records if "fp32_weight_gradients" in r.getMessage()]
    assert said == [
        "fp32_weight_gradients off: torch 2.7 has no such mm; autograd casts the bf16 weight gradients"
    ]
    assert all(m.wide_keep is None for m in _block_linears(trainer))


def test_the_gpu_check_script_runs_its_comparison_on_the_cpu() -> None:
    from benchmarks import wide_grad_check

    monkey = wide_grad_check.TOKENS, wide_grad_check.IN, wide_grad_check.OUT
    try:
        wide_grad_check.TOKENS, wide_grad_check.IN, wide_grad_check.OUT = 64, 32, 48
        record = wide_grad_check.check(torch.device("cpu"))
    finally:
        wide_grad_check.TOKENS, wide_grad_check.IN, wide_grad_check.OUT = monkey
    assert record["available"] is None and len(record["rows"]) == 4
    for row in record["rows"]:
        assert row["out_equal"] and row["grad_x_equal"] and row["grad_w_dtype"] == "torch.float32"
        assert row["wide_err"] < 1e-6 < row["plain_err"]  # the widened sum is exact on the CPU

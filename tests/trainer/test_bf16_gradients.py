"""The ``bf16_gradients`` switch (issue 38): the matrices' gradients stay in the bf16 their matmul produced,
with the same values as autograd's fp32 casts, 2 bytes a parameter less, torch's AdamW state, and where it
cannot keep the numerics (accumulation, AC, a separate clip, FSDP2) it is not used."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tests.support.loss_reference as reference
from blackwell_trainer.checkpoint.store import Checkpointer
from blackwell_trainer.loop.optimizer import AdamW, adamw_one, gradient_norm
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.plan.config import (
    ActivationCheckpointing,
    CheckpointConfig,
    Precision,
    PrecisionRecipe,
)
from blackwell_trainer.plan.tuning import Tuning

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.distributed.*:UserWarning")
ON = Tuning(bf16_gradients=True)
BF16_LOSSES = json.loads(reference.REFERENCE.read_text())["losses"]["bf16"]


def _trainer(tuning: Tuning, *, accumulation: int = 1, ac: str = "none") -> Trainer:
    plan = reference.reference_plan()
    plan.chosen.gradient_accumulation_steps = accumulation
    plan.chosen.activation_checkpointing = ActivationCheckpointing(ac)
    return Trainer(plan, reference.ONE, tuning=tuning, compute_dtype=torch.bfloat16)


def _gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    batch = reference.reference_batches()[0][0]
    trainer.model(batch.inputs, batch.labels).backward()
    return {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_the_matrices_keep_bf16_gradients_with_the_values_autograd_casts_to_fp32() -> None:
    with reference.one_rank_group():
        plain, narrow = _gradients(_trainer(Tuning())), _gradients(_trainer(ON))
    assert plain.keys() == narrow.keys()
    matrices = [n for n, g in narrow.items() if g.dim() >= 2]
    # every block Linear, the embedding and the untied head; the norm scales keep fp32 gradients
    assert len(matrices) == sum(1 for g in plain.values() if g.dim() >= 2) > 0
    for name, grad in narrow.items():
        assert grad.dtype == (torch.bfloat16 if grad.dim() >= 2 else torch.float32), name
        # the same values: a bf16 gradient cast to fp32 is exact, so nothing is lost by not casting
        assert torch.equal(grad.float(), plain[name]), name
    held = sum(g.numel() * g.element_size() for g in narrow.values())
    assert held < sum(g.numel() * g.element_size() for g in plain.values())


def test_the_switch_keeps_the_bf16_reference_losses() -> None:
    got = reference.losses("bf16", ON)
    torch.testing.assert_close(got, BF16_LOSSES, rtol=1e-3, atol=0)


@pytest.mark.parametrize(
    ("tuning", "accumulation", "ac", "said"),
    [
        (ON, 2, "none", "the 2 micro-batches of a step would be summed in bf16"),
        (ON, 1, "selective", "AC recomputes on the fp32 parameters"),
        (Tuning(bf16_gradients=True, clip_in_optimizer=False), 1, "none", "the foreach clip would scale"),
        (Tuning(bf16_gradients=True, single_device="fsdp"), 1, "none", "FSDP2 reduces the gradients in fp32"),
        (Tuning(), 1, "none", None),  # off by default, and nothing said
    ],
    ids=["accumulation", "ac", "separate-clip", "fsdp2", "default"],
)
def test_where_the_numerics_would_change_every_gradient_stays_fp32_and_the_log_says_why(
    tuning: Tuning, accumulation: int, ac: str, said: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    with reference.one_rank_group(), caplog.at_level(logging.WARNING):
        trainer = _trainer(tuning, accumulation=accumulation, ac=ac)
        grads = _gradients(trainer)
    assert {g.dtype for g in grads.values()} == {torch.float32}
    assert not trainer.model.cast_blocks
    warnings = [r.getMessage() for r in caplog.records if "bf16_gradients off" in r.getMessage()]
    if said is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and said in warnings[0], warnings
        assert warnings[0].endswith("the gradients stay fp32")


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_where_it_acts_the_log_says_so_and_never_that_it_is_off(
    precision: str, caplog: pytest.LogCaptureFixture
) -> None:
    with reference.one_rank_group(), caplog.at_level(logging.INFO):
        trainer = _fp8_trainer(ON) if precision == "fp8" else _trainer(ON)
    assert trainer.model.cast_blocks
    said = [r.getMessage() for r in caplog.records if "bf16_gradients" in r.getMessage()]
    assert not [m for m in said if "bf16_gradients off" in m], said
    assert any("keep their gradients in bf16" in m for m in said), said
    kept_copies = [m for m in said if "bf16 copies are kept for backward" in m]
    assert len(kept_copies) == (1 if precision == "fp8" else 0), said


def _paired(count: int = 3) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    params = [torch.randn(48, 16, generator=generator), torch.randn(16, generator=generator)]
    grads = [torch.randn(p.shape, generator=generator) * 1e-2 for p in params]
    return params[:count], grads[:count]


@pytest.mark.parametrize("scale", [None, 1.6], ids=["unscaled", "clip-scale"])
def test_the_narrow_update_is_torch_adamw(scale: float | None) -> None:
    params, grads = _paired()
    torch_params = [p.clone().requires_grad_() for p in params]
    torch_opt = torch.optim.AdamW(torch_params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours = [p.clone() for p in params]
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    step, lr = torch.zeros(()), torch.tensor(1e-2)
    for _ in range(4):
        for p, g in zip(torch_params, grads, strict=True):
            p.grad = g.clone() if scale is None else g / scale
        torch_opt.step()
        step += 1
        for p, g, (m, v) in zip(ours, grads, moments, strict=True):
            adamw_one(p, g.bfloat16(), m, v, lr, step, None if scale is None else torch.tensor(scale),
                      (0.9, 0.95, 1e-8, 0.1))  # fmt: skip
    for a, b in zip(ours, torch_params, strict=True):
        # bf16 gradients in ours: the difference is that rounding, not the update's formula
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=2e-3 * 4 * 1e-2)


def test_a_checkpoint_of_the_optimizer_loads_into_torch_adamw_and_back() -> None:
    with reference.one_rank_group():
        trainer = _trainer(ON)
        for batch in reference.reference_batches()[:2]:
            trainer.step(batch)
    state = copy.deepcopy(trainer.optimizer.state_dict())
    assert isinstance(trainer.optimizer, AdamW)
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in state["state"].values())
    groups = [{"params": g["params"]} for g in trainer.optimizer.param_groups]
    plain = torch.optim.AdamW(groups)
    plain.load_state_dict(state)  # the fp32-gradient trainer resumes from it
    assert plain.state_dict()["param_groups"] == state["param_groups"]
    back = AdamW([{"params": g["params"]} for g in trainer.optimizer.param_groups])
    back.load_state_dict(plain.state_dict())
    for key, saved in state["state"].items():
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(back.state_dict()["state"][key][name], saved[name])


def test_the_norm_of_bf16_gradients_is_taken_in_fp32() -> None:
    generator = torch.Generator().manual_seed(3)
    grads = [torch.randn(4096, generator=generator).bfloat16() for _ in range(3)]
    exact = torch.linalg.vector_norm(torch.cat([g.double() for g in grads])).float()
    assert gradient_norm(grads, foreach=True).dtype == torch.float32
    torch.testing.assert_close(gradient_norm(grads, foreach=True), exact, rtol=2e-6, atol=0)
    # torch's own rounds each tensor's norm to bf16 (111.0 against 110.9627 here)
    rounded = torch.nn.utils.get_total_norm(grads, foreach=True).float()
    assert not torch.allclose(rounded, exact, rtol=1e-4, atol=0)


def test_the_compiled_update_takes_parameters_whose_gradients_are_bf16() -> None:
    """As on CUDA (where it is compiled): parameters with grad_dtype bf16 and their gradients reach the
    compiler detached, and the compiled update equals the eager one."""
    params, grads = _paired()
    runs = []
    for compiled in (False, True):
        leaves = [torch.nn.Parameter(p.clone()) for p in params]
        opt = AdamW(leaves, lr=1e-2, weight_decay=0.1)
        opt.compile_on_cpu = compiled
        for _ in range(2):
            for leaf, grad in zip(leaves, grads, strict=True):
                leaf.grad_dtype = torch.bfloat16
                leaf.grad = grad.bfloat16()
            opt.step()
        runs.append([leaf.detach() for leaf in leaves])
    for eager, compiled_run in zip(*runs, strict=True):
        torch.testing.assert_close(compiled_run, eager, rtol=1e-6, atol=1e-7)


def _losses(trainer: Trainer, steps: range) -> list[float]:
    batches = reference.reference_batches()
    return [trainer.step(batches[i]).loss for i in steps]


@pytest.mark.parametrize("resumed_with", [ON, Tuning()], ids=["bf16-gradients", "fp32-gradients"])
def test_a_checkpoint_saved_with_bf16_gradients_resumes_where_it_stopped(
    tmp_path: Path, resumed_with: Tuning
) -> None:
    """Steps 3-4 after a save at step 2 and a resume in a new trainer: the losses of steps 3-4 run
    through, bit for bit with the switch on again, within the bf16 reference's tolerance with it off."""
    config = CheckpointConfig(path=str(tmp_path / "ckpt"), interval_steps=2)
    with reference.one_rank_group():
        through = _losses(_trainer(ON), range(4))
        first = _trainer(ON)
        _losses(first, range(2))
        assert Checkpointer(config, rank=0).save(2, first.model, first.optimizer, {"step": 2})
        second = _trainer(resumed_with)
        assert Checkpointer(config, rank=0).load(second.model, second.optimizer) == {"step": 2}
        second.step_index = 2
        after = _losses(second, range(2, 4))
    if resumed_with.bf16_gradients:
        assert after == through[2:]
    else:
        torch.testing.assert_close(after, through[2:], rtol=1e-3, atol=0)


def _fp8_trainer(tuning: Tuning) -> Trainer:
    plan = reference.reference_plan()
    plan.chosen.precision, plan.chosen.precision_recipe = Precision.FP8, PrecisionRecipe.TORCHAO_TENSORWISE
    return Trainer(plan, reference.ONE, tuning=tuning, compute_dtype=torch.bfloat16)


def _kept_for_backward(trainer: Trainer, monkeypatch: pytest.MonkeyPatch) -> int:
    """Bytes the forward keeps for backward, the parameters' own storage not counted (it is held anyway):
    what autograd saves, and inside the recast path what its pack hook keeps (not what it recasts)."""
    params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    kept: dict[int, int] = {}

    def record(packed: object) -> object:
        if isinstance(packed, torch.Tensor) and packed.untyped_storage().data_ptr() not in params:
            kept[packed.untyped_storage().data_ptr()] = packed.untyped_storage().nbytes()
        return packed

    real = torch.autograd.graph.saved_tensors_hooks

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(
            self, pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]
        ) -> None:
            super().__init__(lambda t: record(pack(t)), unpack)

    monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks", Recording)
    batch = reference.reference_batches()[0][0]
    with real(record, lambda t: t):
        trainer.model(batch.inputs, batch.labels)
    return sum(kept.values())


def test_with_torchao_float8_the_bf16_copies_are_kept_for_backward_unless_recast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchao's float8 matmul saves the weight it is handed: with bf16_gradients, a bf16 copy of every block
    matrix instead of the fp32 parameter (+5.3 GiB at 3B FP8 on one H100). recast_blocks keeps no more than
    the plain FP8 model; it is not forced, since on that H100 it cost 7.5% of the speed."""
    with reference.one_rank_group():
        plain, narrow = _fp8_trainer(Tuning()), _fp8_trainer(ON)
        assert narrow.model.cast_blocks and not narrow.model.recast_blocks
        assert narrow.precision.backend == "torchao"
        baseline = _kept_for_backward(plain, monkeypatch)
        copies = sum(2 * p.numel() for p in narrow.model.layers.parameters() if p.dim() >= 2)
        assert _kept_for_backward(narrow, monkeypatch) >= baseline + copies // 2
        recast = _fp8_trainer(Tuning(bf16_gradients=True, recast_blocks=True))
        assert recast.model.recast_blocks
        assert _kept_for_backward(recast, monkeypatch) <= baseline
        grads = _gradients(recast)
    assert {g.dtype for n, g in grads.items() if g.dim() >= 2} == {torch.bfloat16}


def test_with_torchao_float8_the_losses_stay_those_of_fp8() -> None:
    """The float8 casts then start from the bf16 copies (as under FSDP2's bf16 all-gather, torchtitan's
    path), not from the fp32 weights: with recast_blocks the losses of recast_blocks alone exactly, and
    both within 1e-3 of the plain FP8 losses."""
    batches = reference.reference_batches()
    with reference.one_rank_group():
        runs = {
            name: [trainer.step(batch).loss for batch in batches]
            for name, trainer in (
                ("plain", _fp8_trainer(Tuning())),
                ("recast", _fp8_trainer(Tuning(recast_blocks=True))),
                ("narrow", _fp8_trainer(ON)),
                ("narrow_recast", _fp8_trainer(Tuning(bf16_gradients=True, recast_blocks=True))),
            )
        }
    assert runs["narrow_recast"] == runs["recast"]
    torch.testing.assert_close(runs["narrow"], runs["plain"], rtol=1e-3, atol=0)
    torch.testing.assert_close(runs["narrow_recast"], runs["plain"], rtol=1e-3, atol=0)

"""The ``compiled_update`` switch (issue 38, on by default): fp32 gradients updated by the trainer's
one-tensor AdamW kernel (``adamw_one``, compiled on CUDA) instead of torch's fused kernel, with torch's
formula, torch's state, the clip's scale inside the kernel, and FSDP2's sharded gradients left to torch."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import tests.support.loss_reference as reference
from blackwell_trainer.loop.optimizer import AdamW, build_optimizer
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.plan.tuning import Tuning

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.distributed.*:UserWarning")
ON, OFF = Tuning(), Tuning(compiled_update=False)  # on by default since one H100 measured it
HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def _paired() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    params = [torch.randn(48, 16, generator=generator), torch.randn(16, generator=generator)]
    grads = [torch.randn(p.shape, generator=generator) * 1e-2 for p in params]
    return params, grads


def _run(
    opt: torch.optim.Optimizer, leaves: list[torch.Tensor], grads: list[torch.Tensor], scale: float | None
) -> list[torch.Tensor]:
    for _ in range(4):
        for leaf, grad in zip(leaves, grads, strict=True):
            leaf.grad = grad.clone()
        opt.grad_scale = None if scale is None else torch.tensor(scale)  # type: ignore[attr-defined]
        opt.step()
    return [leaf.detach() for leaf in leaves]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("scale", [None, 1.6], ids=["unscaled", "clip-scale"])
def test_the_compiled_update_over_fp32_gradients_is_torchs_fused_adamw(
    compiled: bool, scale: float | None
) -> None:
    params, grads = _paired()
    fused_leaves = [torch.nn.Parameter(p.clone()) for p in params]
    fused = torch.optim.AdamW(fused_leaves, fused=True, **HYPER)  # type: ignore[arg-type]
    ours_leaves = [torch.nn.Parameter(p.clone()) for p in params]
    ours = AdamW(ours_leaves, **HYPER)  # type: ignore[arg-type]
    ours.compile_all, ours.compile_on_cpu = True, compiled
    expected, got = _run(fused, fused_leaves, grads, scale), _run(ours, ours_leaves, grads, scale)
    for a, b in zip(got, expected, strict=True):
        # the same formula in another kernel: last-bit differences only
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # A control: without the clip's scale the weights move elsewhere, so the comparison can fail.
    if scale is not None:
        unscaled_leaves = [torch.nn.Parameter(p.clone()) for p in params]
        unscaled = _run(torch.optim.AdamW(unscaled_leaves, fused=True, **HYPER), unscaled_leaves, grads, None)  # type: ignore[arg-type]
        assert not torch.allclose(unscaled[0], got[0], rtol=1e-6, atol=1e-7)
    # torch's state, as the fused kernel keeps it: a checkpoint does not know which kernel ran
    assert {k: set(v) for k, v in ours.state_dict()["state"].items()} == {
        k: set(v) for k, v in fused.state_dict()["state"].items()
    }


def test_only_whole_tensor_gradients_take_the_compiled_update() -> None:
    """FSDP2's gradients are DTensor shards: torch's kernels keep them (the switch is single-device)."""
    with reference.one_rank_group():
        mesh = init_device_mesh("cpu", (1,))
        params, grads = _paired()
        sharded = torch.nn.Parameter(distribute_tensor(params[0].clone(), mesh, [Shard(0)]))
        whole = torch.nn.Parameter(params[1].clone())
        opt = AdamW([sharded, whole], **HYPER)  # type: ignore[arg-type]
        opt.compile_all = True
        sharded.grad = distribute_tensor(grads[0].clone(), mesh, [Shard(0)])
        whole.grad = grads[1].clone()
        assert not opt._compiled(sharded) and opt._compiled(whole)
        opt.compile_all = False
        assert not opt._compiled(whole)


def _trainer(tuning: Tuning, compute: torch.dtype = torch.bfloat16) -> Trainer:
    return Trainer(reference.reference_plan(), reference.ONE, tuning=tuning, compute_dtype=compute)


def _losses(trainer: Trainer) -> list[float]:
    return [trainer.step(batch).loss for batch in reference.reference_batches()]


# fp32 compute: the update's last-bit differences stay in the last bits. bf16 compute: a weight 1e-7 apart
# rounds some activation to the neighbouring bf16 value, and the tiny model's loss follows (2.5e-5 relative
# by step 6 here); the same happens between any two AdamW kernels.
@pytest.mark.parametrize(
    "compute,rtol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-4)], ids=["fp32", "bf16"]
)
def test_the_trainer_with_the_compiled_update_trains_the_same_losses(
    compute: torch.dtype, rtol: float
) -> None:
    with reference.one_rank_group():
        default, compiled = _trainer(OFF, compute), _trainer(ON, compute)
        assert compiled.optimizer.compile_all and not default.optimizer.compile_all
        # torch's fused kernel, as on CUDA (on the CPU torch's AdamW is otherwise the unfused one, clipped
        # by a separate pass)
        default.optimizer = build_optimizer(default.model, default.plan, torch.device("cpu"), fused=True)
        expected, got = _losses(default), _losses(compiled)
        assert compiled.optimizer.grad_scale is not None  # the clip's scale went into the kernel
        # FSDP2 on one rank keeps torch's kernels: its gradients are shards
        assert not _trainer(replace(ON, single_device="fsdp")).optimizer.compile_all
    assert got[-1] < got[0]  # it trains
    torch.testing.assert_close(got, expected, rtol=rtol, atol=0)
    if compute == torch.float32:  # in bf16 the activations' roundings move single weights further
        for (name, a), b in zip(compiled.model.named_parameters(), default.model.parameters(), strict=True):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-7, msg=name)


def test_a_checkpoint_of_the_compiled_update_loads_into_torch_adamw() -> None:
    with reference.one_rank_group():
        trainer = _trainer(ON)
        for batch in reference.reference_batches()[:2]:
            trainer.step(batch)
    state = copy.deepcopy(trainer.optimizer.state_dict())
    plain = torch.optim.AdamW([{"params": g["params"]} for g in trainer.optimizer.param_groups])
    plain.load_state_dict(state)
    for key, saved in state["state"].items():
        assert set(saved) == {"step", "exp_avg", "exp_avg_sq"}
        assert torch.equal(plain.state_dict()["state"][key]["exp_avg"], saved["exp_avg"])


def _switching(first: Tuning, second: Tuning) -> tuple[Trainer, Trainer, list[float], list[float]]:
    """A trainer switched between two tunings step by step and one that kept ``first``'s, with their
    losses (the switched one's first)."""
    with reference.one_rank_group():
        switching, through = _trainer(first, torch.float32), _trainer(first, torch.float32)
        batches = reference.reference_batches()
        expected = [through.step(b).loss for b in batches]
        got = []
        for index, batch in enumerate(batches):
            switching.tuning = first if index % 2 == 0 else second
            got.append(switching.step(batch).loss)
            # Read again at every step, so the in-process A/B windows can switch it on a built trainer.
            assert switching.optimizer.compile_all == switching.tuning.compiled_update
            assert switching.optimizer.batch_all == switching.tuning.batched_update
    return switching, through, got, expected


def test_a_run_may_switch_between_the_kernels_between_steps() -> None:
    """Both keep torch's state, so the in-process A/B windows can turn the switch off and on again."""
    _, _, got, expected = _switching(ON, OFF)
    torch.testing.assert_close(got, expected, rtol=2e-4, atol=0)


# ---------------------------------------------------------------------------------------- batched_update


@pytest.mark.parametrize("scale", [None, 1.6], ids=["unscaled", "clip-scale"])
def test_the_batched_update_is_the_per_tensor_update_bit_for_bit(scale: float | None) -> None:
    """One compiled call over the group (adamw_many) against one compiled call per tensor: the same
    kernel per tensor, so the same weights exactly, compiled as on CUDA."""
    params, grads = _paired()
    results = []
    for batched in (False, True):
        leaves = [torch.nn.Parameter(p.clone()) for p in params]
        opt = AdamW(leaves, **HYPER)  # type: ignore[arg-type]
        opt.compile_all, opt.compile_on_cpu, opt.batch_all = True, True, batched
        results.append(_run(opt, leaves, grads, scale))
        compiled = opt._batched_update if batched else opt._narrow_update
        assert compiled is not None  # the path under test ran, compiled
        assert (opt._narrow_update is None) == batched  # and the other did not
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_the_trainer_trains_the_same_with_the_batched_update_and_may_switch_it() -> None:
    switching, through, got, expected = _switching(replace(ON, batched_update=True), ON)
    assert got == expected  # eager on the CPU: the same function over the same tensors
    for a, b in zip(switching.model.parameters(), through.model.parameters(), strict=True):
        assert torch.equal(a.detach(), b.detach())


def test_the_batched_update_calls_once_per_run_of_one_size_and_gradient_dtype() -> None:
    """Runs of at most BATCH_TENSORS flat tensors of one size: 3B's 255 tensors take 11 calls, not 255."""
    from blackwell_trainer.loop import optimizer as module

    shapes = [(6, 4)] * 30 + [(4, 6)] * 30 + [(8,)] * 3  # (6, 4) and (4, 6): one size flat
    leaves = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    opt = AdamW(leaves, **HYPER)  # type: ignore[arg-type]
    opt.compile_all, opt.batch_all = True, True
    calls: list[tuple[int, ...]] = []

    def record(params: list[torch.Tensor], *rest: object) -> None:
        calls.append(tuple(p.numel() for p in params))
        module.adamw_many(params, *rest)  # type: ignore[arg-type]

    opt._batched = lambda device: record  # type: ignore[method-assign]
    _run(opt, leaves, [torch.ones(s) for s in shapes], 2.0)
    per_step = [(24,) * 28, (24,) * 28, (24,) * 4, (8,) * 3]
    assert calls == per_step * 4
    assert all(not torch.equal(p, torch.zeros_like(p)) for p in leaves)  # every tensor was updated

"""benchmarks/optimizer_step.py on the CPU: the side by side's model shapes, and torch's AdamW update."""

from __future__ import annotations

import torch
from benchmarks import optimizer_step as bench


def test_the_shapes_are_the_side_by_sides_models() -> None:
    # the parameter counts benchmarks/titan_side_by_side.py prints for both trainers (untied heads)
    counts = {m: sum(torch.Size(s).numel() for s in bench.parameter_shapes(m)) for m in bench.SHAPES}
    assert counts == {"1b": 1_498_482_688, "3b": 3_606_752_256}


def test_the_whole_list_update_is_torch_adamw_with_a_unit_grad_scale() -> None:
    """The benchmark's one-graph update runs the trainer's own adamw_one over every tensor."""
    generator = torch.Generator().manual_seed(0)
    params = [torch.randn(64, 32, generator=generator), torch.randn(32, generator=generator)]
    grads = [torch.randn(p.shape, generator=generator) * 1e-3 for p in params]
    decays = [bench.WEIGHT_DECAY, 0.0]
    leaves = [p.clone().requires_grad_() for p in params]
    for leaf, grad in zip(leaves, grads, strict=True):
        leaf.grad = grad.clone()
    groups = [{"params": [leaf], "weight_decay": d} for leaf, d in zip(leaves, decays, strict=True)]
    fused = torch.optim.AdamW(groups, lr=bench.LR, betas=bench.BETAS, eps=bench.EPS, fused=True)
    fused.grad_scale = torch.tensor(1.0)  # type: ignore[attr-defined]
    ours = [p.clone() for p in params]
    avgs, sqs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    step = torch.zeros(())
    for _ in range(5):
        fused.step()
        step += 1
        bench.adamw_update(ours, grads, avgs, sqs, decays, torch.tensor(bench.LR), step, torch.tensor(1.0))
    for mine, theirs in zip(ours, leaves, strict=True):
        torch.testing.assert_close(mine, theirs.detach(), rtol=0, atol=1e-6)

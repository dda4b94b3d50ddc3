"""The optimizer (AdamW, decay on matrices only) and its learning-rate schedule (warm-up, cosine decay)."""

from __future__ import annotations

import math

import torch
from torch import nn

from blackwell_trainer.plan.config import Plan


def lr_at(step: int, plan: Plan) -> float:
    """Linear warm-up to the peak, then cosine decay to min_learning_rate_ratio x peak at the last step."""
    opt = plan.optimizer
    peak = opt.learning_rate
    if opt.warmup_steps > 0 and step < opt.warmup_steps:
        return peak * (step + 1) / opt.warmup_steps
    span = max(plan.steps - opt.warmup_steps, 1)
    progress = min(max(step - opt.warmup_steps, 0) / span, 1.0)
    floor = peak * opt.min_learning_rate_ratio
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, step_index: int, plan: Plan) -> None:
    """Give every parameter group the schedule's rate for the step after `step_index` completed steps."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step_index, plan)


def build_optimizer(
    model: nn.Module, plan: Plan, device: torch.device, *, fused: bool | None = None
) -> torch.optim.AdamW:
    """AdamW; decay on matrices only (norm scales and biases are not decayed); fused kernels on CUDA
    (``fused`` overrides: torch also has them on CPU, where the tests compare the two)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = plan.optimizer
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr_at(0, plan),
        betas=(opt.beta1, opt.beta2),
        eps=opt.eps,
        fused=device.type == "cuda" if fused is None else fused,
    )

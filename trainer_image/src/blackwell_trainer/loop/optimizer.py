"""The optimizer (AdamW, decay on matrices only) and its learning-rate schedule (warm-up, cosine decay)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

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


# One launch configuration for the compiled update, no autotuning. Inductor would otherwise time each
# candidate configuration of the pointwise kernel on its first call, on clones of the tensors it writes
# (the first parameter's weight and moments: 4.7 GiB for Llama-3.2-3B's embedding), made after the
# backward in whatever room the freed activations left. That was a suspect for bf16_gradients' reserved
# pool rising 2-6 GiB above its allocated peak in some calls; on one H100 (2026-12-07, the first call of
# the night in docs/benchmarks/titan_h100.md) the pool was 70.4 GiB for 69.3 allocated with and without
# this setting, so it was not the cause there. Kept: the update is bound by memory bandwidth, where the
# configurations differ little (the same speed with and without), and one configuration is one
# behaviour on every run.
UPDATE_COMPILE_OPTIONS: dict[str, Any] = {"triton.autotune_pointwise": False}


def adamw_one(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    lr: torch.Tensor,
    step: torch.Tensor,
    grad_scale: torch.Tensor | None,
    hyper: tuple[float, float, float, float],
) -> None:
    """torch's AdamW update of one fp32 tensor from a gradient in another dtype, read once and widened in
    the kernel: decoupled decay, bias-corrected moments, fused AdamW's division by ``grad_scale``.

    ``hyper``: (beta1, beta2, eps, weight_decay). The fused kernel's formula; lerp for the first moment.
    """
    beta1, beta2, eps, weight_decay = hyper
    g = grad.float() if grad_scale is None else grad.float() / grad_scale
    param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = exp_avg_sq.sqrt() / (1 - beta2**step).sqrt() + eps
    param.sub_(lr / (1 - beta1**step) * exp_avg / denom)


# Tensors per compiled call of the batched update: the host's saving is most of the way there at a few
# tens (one call's overhead shared by them), while the graph's compile time grows with its length.
BATCH_TENSORS = 28


def adamw_many(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    lr: torch.Tensor,
    steps: list[torch.Tensor],
    grad_scale: torch.Tensor | None,
    hyper: tuple[float, float, float, float],
) -> None:
    """``adamw_one`` over a run of tensors in one call: compiled, one graph and one call from Python for
    them all, where one call per tensor pays the compiled function's host overhead each time."""
    for param, grad, exp_avg, exp_avg_sq, step in zip(
        params, grads, exp_avgs, exp_avg_sqs, steps, strict=True
    ):
        adamw_one(param, grad, exp_avg, exp_avg_sq, lr, step, grad_scale, hyper)


def _flat_views(param: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> list[torch.Tensor]:
    """What ``adamw_one`` reads and writes for ``param``: it, its gradient and its moments, as flat views.

    Detached: the compiler would otherwise copy a parameter's bf16 .grad into a fake tensor that does not
    carry its grad_dtype, and refuse it. Flat: one graph with a dynamic size serves every shape.
    """
    return [t.detach().view(-1) for t in (param, grad, state["exp_avg"], state["exp_avg_sq"])]


def _narrow(param: torch.Tensor) -> bool:
    """A parameter whose gradient is kept in another dtype than its own (``grad_dtype``)."""
    grad_dtype = getattr(param, "grad_dtype", None)
    return grad_dtype is not None and grad_dtype != param.dtype


def _holds_narrow_grad(param: torch.Tensor) -> bool:
    """A parameter whose gradient of this step is in another dtype than its own."""
    return param.grad is not None and param.grad.dtype != param.dtype


def _holds_plain_grad(param: torch.Tensor) -> bool:
    """A parameter whose gradient of this step is a whole tensor (not an FSDP2 shard, a DTensor)."""
    return param.grad is not None and not isinstance(param.grad, DTensor)


def gradient_norm(grads: list[torch.Tensor], *, foreach: bool) -> torch.Tensor:
    """The gradients' total 2-norm. With bf16 gradients (``bf16_gradients``) each tensor's norm is taken in
    fp32 (torch's would round it to bf16, and the clip would follow); torch's own function otherwise."""
    narrow = [g for g in grads if g.dtype != torch.float32]
    if not narrow:
        return torch.nn.utils.get_total_norm(grads, foreach=foreach)
    wide = [g for g in grads if g.dtype == torch.float32]
    norms = list(torch._foreach_norm(narrow, 2.0, dtype=torch.float32))
    if wide:
        norms += torch._foreach_norm(wide, 2.0)
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack(norms))
    return total


class AdamW(torch.optim.AdamW):
    """torch's AdamW, also over fp32 parameters whose gradients are kept in bf16 (``grad_dtype``, the
    ``bf16_gradients`` switch), which torch's kernels refuse: those are updated by ``adamw_one``, compiled
    once on CUDA (flat views, dynamic shapes: one graph for every tensor). With ``compile_all`` (the
    ``compiled_update`` switch) every parameter holding a whole-tensor gradient is updated that way too.
    Their state is torch's own (``step``, ``exp_avg``, ``exp_avg_sq``, as the fused kernel keeps it), so
    checkpoints do not change.

    ``grad_scale`` (the clip's 1/coefficient, trainer.py) is honoured on every path: inside the kernels
    where they take it, a division of the fp32 gradients first where torch's unfused kernels do not.
    """

    _narrow_update: Callable[..., None] | None = None
    compile_on_cpu = False  # a test compiles it on the CPU as on CUDA
    grad_scale: torch.Tensor | None = None
    compile_all = False  # the compiled_update switch (tuning.py); FSDP2's DTensor shards stay torch's
    batch_all = False  # the batched_update switch (tuning.py): one compiled call per run of tensors
    _batched_update: Callable[..., None] | None = None

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        # Each group's learning rate as a device tensor for the compiled update (``_step_narrow``).
        self._lrs: dict[int, torch.Tensor] = {}
        # torch.distributed.checkpoint initialises an empty optimizer before loading into it by one step
        # on zero fp32 gradients, which a parameter whose grad_dtype is bf16 refuses. Its state is made
        # here instead, as the first step would make it (the moments are held from then on anyway).
        if any(_narrow(p) for group in self.param_groups for p in group["params"]):
            for group in self.param_groups:
                for p in group["params"]:
                    self._state(p, group)

    @property
    def fused(self) -> bool:
        """Built with torch's fused kernels (on CUDA, and where a test asks for them), which take the
        clip's ``grad_scale`` themselves."""
        return all(group.get("fused") for group in self.param_groups)

    @property
    def takes_grad_scale(self) -> bool:
        """Whether every update honours ``grad_scale`` in its own kernel (fused, or ``compile_all``)."""
        return self.fused or self.compile_all

    def _compiled(self, param: torch.Tensor) -> bool:
        """Whether this step updates ``param`` with ``adamw_one`` rather than torch's kernels."""
        return _holds_narrow_grad(param) or (self.compile_all and _holds_plain_grad(param))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        # Per group, the parameters adamw_one updates (bf16 gradients, or all with compile_all): torch's
        # step must not see them.
        narrow = [[p for p in group["params"] if self._compiled(p)] for group in self.param_groups]
        grads: list[list[torch.Tensor]] = [
            [p.grad for p in params if p.grad is not None] for params in narrow
        ]
        scale: torch.Tensor | None = getattr(self, "grad_scale", None)
        for params in narrow:
            for p in params:
                p.grad = None  # torch's step skips a parameter without a gradient
        try:
            if scale is not None and not self.fused:
                wide = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
                if wide:
                    torch._foreach_div_(wide, scale)
                self.grad_scale = None
            loss = super().step(closure)
        finally:
            self.grad_scale = scale
            for params, held in zip(narrow, grads, strict=True):
                for p, grad in zip(params, held, strict=True):
                    p.grad = grad
        for index, (params, held) in enumerate(zip(narrow, grads, strict=True)):
            if params:
                self._step_narrow(index, params, held, scale)
        return loss

    def _step_narrow(
        self,
        index: int,
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        scale: torch.Tensor | None,
    ) -> None:
        """``adamw_one`` over one group's parameters that it updates (``grads``, theirs: bf16 or fp32)."""
        group = self.param_groups[index]
        # A device tensor filled in place: a new tensor from a Python float would copy from the host
        # and wait for the GPU, and a float baked into the compiled graph would recompile each step.
        # Kept off param_groups, which the checkpoint saves.
        lr = self._lrs.setdefault(index, torch.zeros((), device=params[0].device))
        lr.fill_(group["lr"])
        hyper = (*group["betas"], group["eps"], group["weight_decay"])
        states = [self._state(p, group) for p in params]
        torch._foreach_add_([s["step"] for s in states], 1)
        if self.batch_all:
            self._step_batched(params, grads, states, lr, scale, hyper)
            return
        update = self._update(params[0].device)
        for p, grad, state in zip(params, grads, states, strict=True):
            update(*_flat_views(p, grad, state), lr, state["step"], scale, hyper)

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """torch's AdamW state for ``p``, made as its own step would (step on the device when fused)."""
        state: dict[str, Any] = self.state[p]
        if not state:
            on_device = group.get("fused") or group.get("capturable")
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else None)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def _update(self, device: torch.device) -> Callable[..., None]:
        return self._compiled_once(adamw_one, "_narrow_update", device)

    def _batched(self, device: torch.device) -> Callable[..., None]:
        return self._compiled_once(adamw_many, "_batched_update", device)

    def _compiled_once(
        self, update: Callable[..., None], slot: str, device: torch.device
    ) -> Callable[..., None]:
        """``update`` compiled once per optimizer (kept in ``slot``) on CUDA, and on the CPU where a test
        asks; the same function eager elsewhere."""
        if device.type != "cuda" and not self.compile_on_cpu:
            return update
        compiled: Callable[..., None] | None = getattr(self, slot)
        if compiled is None:
            compiled = torch.compile(update, fullgraph=True, dynamic=True, options=UPDATE_COMPILE_OPTIONS)
            setattr(self, slot, compiled)
        return compiled

    def _step_batched(
        self,
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        states: list[dict[str, Any]],
        lr: torch.Tensor,
        scale: torch.Tensor | None,
        hyper: tuple[float, float, float, float],
    ) -> None:
        """``adamw_many`` over runs of at most BATCH_TENSORS tensors of one size and gradient dtype.

        Flat views and dynamic sizes, as the per-tensor update: one graph serves every run of a length,
        so a model compiles a few small graphs (3B: runs of 28, 2 and 1), not one the size of the model.
        """
        update = self._batched(params[0].device)
        by_kind: dict[tuple[int, torch.dtype], list[int]] = {}
        for index, (p, grad) in enumerate(zip(params, grads, strict=True)):
            by_kind.setdefault((p.numel(), grad.dtype), []).append(index)
        for indices in by_kind.values():
            for start in range(0, len(indices), BATCH_TENSORS):
                run = indices[start : start + BATCH_TENSORS]
                views = [_flat_views(params[i], grads[i], states[i]) for i in run]
                # One list per argument of adamw_one: parameters, gradients, first and second moments.
                columns = [list(column) for column in zip(*views, strict=True)]
                update(*columns, lr, [states[i]["step"] for i in run], scale, hyper)


def build_optimizer(
    model: nn.Module, plan: Plan, device: torch.device, *, fused: bool | None = None
) -> AdamW:
    """AdamW; decay on matrices only (norm scales and biases are not decayed); fused kernels on CUDA
    (``fused`` overrides: torch also has them on CPU, where the tests compare the two)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = plan.optimizer
    return AdamW(
        [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr_at(0, plan),
        betas=(opt.beta1, opt.beta2),
        eps=opt.eps,
        fused=device.type == "cuda" if fused is None else fused,
    )

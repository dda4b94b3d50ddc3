"""One step's check, on every rank together, that its loss, gradient norm and parameters are finite."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from blackwell_trainer.errors import NonFiniteStep


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 parameters, gradient norms), or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


@dataclass
class ParameterScan:
    """Which steps read the parameters for non-finite values, and the newest step's loss.

    With the per-step scan off (tuning.parameter_check), only the steps `kept_at` names are read: the
    run's loop names the steps whose state it writes, so that none is written unscanned. None: no step
    (the probe writes nothing)."""

    kept_at: Callable[[int], bool] | None = None
    last_loss: float = math.nan  # the newest step's loss, for a later check's message

    def due(self, step: int, *, every_step: bool) -> bool:
        """Whether `step` reads the parameters."""
        return every_step or (self.kept_at is not None and self.kept_at(step))


def _ranks_with(flags: torch.Tensor, world: int) -> list[list[int]]:
    """For each flag, the ranks where it is set (collective: only called when some rank has one set)."""
    gathered = [torch.zeros_like(flags) for _ in range(world)]
    if world > 1:
        dist.all_gather(gathered, flags)
    else:
        gathered = [flags]
    rows = [row.tolist() for row in gathered]
    return [[r for r in range(world) if rows[r][k]] for k in range(flags.numel())]


def _largest(model: nn.Module, *, foreach: bool) -> torch.Tensor:
    """The largest parameter magnitude of this rank's shards: non-finite iff one parameter is."""
    params = [_local(p.detach()) for p in model.parameters()]
    return torch.nn.utils.get_total_norm(params, norm_type=math.inf, foreach=foreach)


def check_parameters(step: int, loss: float, model: nn.Module, *, foreach: bool) -> None:
    """The parameters alone, before a save of a step whose parameters were not scanned (collective):
    NonFiniteStep on every rank, naming the ranks, if any rank holds a non-finite one. `loss` is the
    step's, for the message."""
    flag = (~torch.isfinite(_largest(model, foreach=foreach))).float().reshape(1)
    reduced = flag.clone()
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    if reduced.item():
        raise NonFiniteStep(step, loss, [[], [], _ranks_with(flag, world)[0]])


def reduce_loss_checked(
    step: int,
    loss_sum: torch.Tensor,
    accum: int,
    grad_norm: torch.Tensor,
    model: nn.Module | None,
    *,
    foreach: bool,
) -> float:
    """The step's loss averaged over ranks; NonFiniteStep on every rank if any value is not finite.

    This rank's view of the step goes into one all-reduce: its loss and whether its loss, its share of
    the gradient norm and its parameter shards are finite. The largest parameter magnitude is
    non-finite iff one parameter is: what a checkpoint of this step would hold is checked before any
    save of it (one read of the local shards; `model` None skips that read on a step whose state is
    not kept, tuning.parameter_check).
    Called after the optimizer step; `step` is its number.
    """
    # No scan at this step (tuning.parameter_check): its state is not written, the next step's loss tells.
    largest = torch.zeros((), device=loss_sum.device) if model is None else _largest(model, foreach=foreach)
    local = torch.stack(
        [
            loss_sum / accum,
            (~torch.isfinite(loss_sum)).float(),
            (~torch.isfinite(_local(grad_norm.detach()))).float(),
            (~torch.isfinite(largest)).float(),
        ]
    )
    reduced = local.clone()
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)  # gloo has no AVG: sum, then divide
    loss_value, *bad = reduced.tolist()  # synchronises: the step's time measured after it is real
    loss_value /= world
    if any(bad) or not math.isfinite(loss_value):
        raise NonFiniteStep(step, loss_value, _ranks_with(local[1:], world))
    return float(loss_value)

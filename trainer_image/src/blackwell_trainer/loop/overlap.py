"""The optimizer step queued block by block on a side CUDA stream, so that the next forward overlaps it.

On one GPU the step's AdamW update (about a tenth of a step at Llama-3.2-3B, batch 2) is bound by memory
bandwidth and the forward after it by the tensor cores. Queued on a second stream in the order the forward
uses the weights (embedding, block 0, block 1, ..., final norm, output head), with an event after each
block's update, the next forward waits only for the update of the block it is about to run: the updates
of the later blocks run beside the earlier blocks' forward. Every update is the same kernel on the same
tensors as in the one-stream step, so the weights are the same bit for bit; only when they are computed
changes (tuning.py's ``overlap_optimizer``).

The caching allocator ties a tensor's memory to the stream that made it: the gradients (and the clip's
scale) read on the side stream are recorded on it before the step lets them go, so that the compute
stream cannot reuse their memory while the side stream still reads it. Anything that reads the weights or
the optimizer state outside a forward (a checkpoint, the export, the parameter scan) calls ``join`` first.
On the CPU there is one stream: the same chunks are stepped in line.
"""

from __future__ import annotations

import torch
from torch import nn

from blackwell_trainer.loop.optimizer import AdamW


def chunk_key(name: str) -> str:
    """The unit of the overlap a parameter belongs to: its block (``layers.3``) or top-level module."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" and len(parts) > 1 else parts[0]


def forward_chunks(model: nn.Module) -> list[tuple[str, list[nn.Parameter]]]:
    """The trainable parameters grouped by ``chunk_key``, in the order they are registered, which is the
    order the forward uses them (the model's ``await_weights`` calls name the same keys)."""
    chunks: dict[str, list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            chunks.setdefault(chunk_key(name), []).append(param)
    return list(chunks.items())


class OverlappedStep:
    """``optimizer.step()`` then ``zero_grad``, chunk by chunk on a side stream; ``wait(key)`` before a
    chunk's weights are read on the compute stream (the model calls it), ``join()`` before anything else
    reads them."""

    def __init__(self, optimizer: AdamW, model: nn.Module, device: torch.device) -> None:
        self.optimizer = optimizer
        self.device = device
        chunks = forward_chunks(model)
        self.keys = [key for key, _ in chunks]
        # Each chunk's parameters per optimizer group, fixed once: AdamW.step_only then steps only them.
        self._groups: list[list[list[torch.Tensor]]] = []
        for _, params in chunks:
            members = {id(p) for p in params}
            groups = optimizer.param_groups
            self._groups.append([[p for p in g["params"] if id(p) in members] for g in groups])
        self.side: torch.cuda.Stream | None = (
            torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            if device.type == "cuda"
            else None
        )
        self._pending: dict[str, torch.cuda.Event] = {}

    def step(self) -> None:
        """Queue the update of every chunk (on the side stream on CUDA, in line on the CPU)."""
        side = self.side
        if side is None:
            for groups in self._groups:
                self.optimizer.step_only(groups)
            self.optimizer.zero_grad(set_to_none=True)
            return
        self.join()  # a chunk no forward waited for (none in training) is finished before it is stepped again
        compute = torch.cuda.current_stream(self.device)
        side.wait_stream(compute)  # the gradients, their norm and the clip's scale
        with torch.cuda.stream(side):
            for key, groups in zip(self.keys, self._groups, strict=True):
                self.optimizer.step_only(groups)
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(side)
                self._pending[key] = done
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.record_stream(side)
        scale = self.optimizer.grad_scale
        if scale is not None:
            scale.record_stream(side)
        self.optimizer.zero_grad(set_to_none=True)

    def wait(self, key: str) -> None:
        """The compute stream waits for the update of chunk ``key`` (nothing if none is pending)."""
        done = self._pending.pop(key, None)
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)

    def join(self) -> None:
        """The compute stream waits for every queued update."""
        if self.side is not None and self._pending:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
            self._pending.clear()

"""Context parallelism: each sequence is split over ``cp`` ranks, and attention gathers K and V.

Design (the all-gather-KV scheme of the Llama 3 paper, "The Llama 3 Herd of Models", section 3.3.2):

- The ``cp`` ranks of one group hold different token chunks of the SAME samples. Each sequence is cut
  into ``2 * cp`` chunks and rank ``i`` keeps chunks ``i`` and ``2*cp-1-i``: under a causal mask an early
  chunk attends to few keys and a late one to many, so each rank gets ``2*cp + 1`` chunk-units of
  attention work (load balance) instead of rank ``cp-1`` doing almost twice the average.
- Every block all-gathers the local K and V (after RoPE) over the group, in one collective, then runs
  SDPA of the local queries against the full K/V. The backward pass reduce-scatters their gradients
  (the autograd form of the functional collective). All-gather over ring attention: with GQA, K/V are
  ``heads / kv_heads`` times smaller than Q, so the gather is cheap next to attention, the kernel is
  the stock flash/cuDNN one (no log-sum-exp merging of partial results), and the code is short.
  Its memory: the full-sequence K/V of the layer (2 x mbs x seq x kv_dim elements, twice while the
  gathered rows are put in order) while the layer's attention runs; without activation checkpointing
  it is also saved for the backward pass like any SDPA input. With selective or full checkpointing it
  is not saved: the backward pass gathers again (parallelize.py's policy recomputes the gather).
- Each local query chunk is attended separately against the key prefix that ends with its own chunk:
  that is causal attention aligned to the lower right corner (``causal_lower_right``), which SDPA
  dispatches to the flash kernel on GPUs without materialising a mask (and to a mask on CPU).
- RoPE uses the tokens' global positions (``positions``), so a token is rotated as in the unsplit run.
- The loss: each rank has the mean over its own tokens; ``batch`` returns the factor that turns it
  into (sum of its token losses) x cp / (tokens of the whole sequences), so that FSDP's average over
  all ranks of the step gives exactly the gradient of the unsplit run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from blackwell_trainer.model.loss import IGNORE_INDEX


def chunk_order(cp: int) -> list[int]:
    """The global chunk indices in the order the ranks hold them: rank 0's two, then rank 1's, ..."""
    order: list[int] = []
    for rank in range(cp):
        order += [rank, 2 * cp - 1 - rank]
    return order


def local_positions(sequence_length: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Global positions of the tokens rank ``cp_rank`` keeps (int64 [sequence_length // cp])."""
    chunk = sequence_length // (2 * cp)
    first, second = cp_rank, 2 * cp - 1 - cp_rank
    return torch.cat(
        (torch.arange(first * chunk, (first + 1) * chunk), torch.arange(second * chunk, (second + 1) * chunk))
    )


def split_sequence(x: torch.Tensor, cp: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's two chunks of ``x`` along ``dim`` (length divisible by 2*cp), concatenated."""
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat((chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]), dim=dim)


def merge_sequence(parts: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Inverse of ``split_sequence``: the parts of ranks 0..cp-1 back in global order."""
    cp = len(parts)
    by_chunk: dict[int, torch.Tensor] = {}
    for rank, part in enumerate(parts):
        first, second = part.chunk(2, dim=dim)
        by_chunk[rank], by_chunk[2 * cp - 1 - rank] = first, second
    return torch.cat([by_chunk[i] for i in range(2 * cp)], dim=dim)


def _all_gather_dim0(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Autograd-aware all-gather along dim 0 (backward: reduce-scatter), traceable by torch.compile.

    ``all_gather_single_autograd`` is the torch >= 2.13 name; ``all_gather_tensor_autograd`` the older one.
    """
    gather: Any = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
    out: torch.Tensor = gather(x, 0, group)
    if isinstance(out, funcol.AsyncCollectiveTensor):
        out = out.wait()
    return out


@dataclass(frozen=True)
class CpBatch:
    """One micro-batch as this rank feeds it to the model."""

    inputs: torch.Tensor
    labels: torch.Tensor
    loss_weight: float  # multiply the model's mean local loss by this (see the module docstring)


class ContextParallel:
    """One rank's place in its context-parallel group and the attention function its blocks use."""

    def __init__(self, group: dist.ProcessGroup, *, sequence_length: int, device: torch.device) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if sequence_length % (2 * self.size):
            raise ValueError(f"sequence length {sequence_length} is not divisible by 2 x cp ({self.size})")
        self.chunk = sequence_length // (2 * self.size)
        self.positions = local_positions(sequence_length, self.size, self.rank).to(device)
        # Gathered rows come rank by rank (2 chunks each); global chunk g sits at row block order.index(g).
        order = chunk_order(self.size)
        self._global_order = torch.tensor([order.index(g) for g in range(2 * self.size)], device=device)
        # The two local chunks' global indices: their queries see keys [0, (g + 1) * chunk).
        self._local_chunks = (self.rank, 2 * self.size - 1 - self.rank)
        # Made once here: a CausalBias (a tensor subclass) cannot be created under activation
        # checkpointing's dispatch mode, and its shape never changes.
        self._masks: dict[int, Any] = {
            g: causal_lower_right(self.chunk, (g + 1) * self.chunk) for g in self._local_chunks if g > 0
        }

    @classmethod
    def create(cls, cp: int, *, sequence_length: int, device: torch.device) -> ContextParallel:
        """Make the cp groups (consecutive ranks, so a group stays inside a node) and return this rank's.

        Collective: every rank calls it. Consecutive ranks also put a group's peers at the same
        data-parallel index ``rank // cp``, which is how ``data_parallel_rank`` feeds them one batch.
        """
        group, _ = dist.new_subgroups(group_size=cp)  # type: ignore[no-untyped-call]
        return cls(group, sequence_length=sequence_length, device=device)

    def batch(self, inputs: torch.Tensor, labels: torch.Tensor) -> CpBatch:
        """This rank's slice of a [mbs, seq] micro-batch that every rank of the group holds whole."""
        local_labels = split_sequence(labels, self.size, self.rank)
        # On the CPU copies: plain integers, no device sync. The unsplit run divides the summed loss by
        # the group's valid labels; the model divides by this rank's; FSDP averages over cp ranks.
        group_valid = int((labels != IGNORE_INDEX).sum())
        local_valid = int((local_labels != IGNORE_INDEX).sum())
        weight = max(local_valid, 1) * self.size / group_valid if group_valid else 0.0
        return CpBatch(split_sequence(inputs, self.size, self.rank), local_labels, weight)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of local q [b, hq, 2c, d] over the group's K/V ([b, hkv, 2c, d] each, local)."""
        b, hkv, _, d = k.shape
        # One collective for K and V: [2c, 2, b, hkv, d] with the sequence first (gather dim 0).
        kv = torch.stack((k, v)).permute(3, 0, 1, 2, 4).contiguous()
        gathered = _all_gather_dim0(kv, self.group)
        chunks = gathered.view(2 * self.size, self.chunk, 2, b, hkv, d).index_select(0, self._global_order)
        del gathered  # not saved for backward (index_select keeps only the index): free it now
        full = chunks.reshape(2 * self.size * self.chunk, 2, b, hkv, d).permute(1, 2, 3, 0, 4)
        k_full, v_full = full[0], full[1]
        gqa = q.shape[1] != hkv
        outs = []
        for i, g in enumerate(self._local_chunks):
            q_i = q[:, :, i * self.chunk : (i + 1) * self.chunk]
            keys = (g + 1) * self.chunk
            k_i, v_i = k_full[:, :, :keys], v_full[:, :, :keys]
            if g == 0:
                out = F.scaled_dot_product_attention(q_i, k_i, v_i, is_causal=True, enable_gqa=gqa)
            else:
                # Query row r of chunk g sits at global position g*c + r and sees keys 0..g*c + r: the
                # lower-right-aligned causal mask (flash kernel on GPU, no mask tensor in memory).
                out = F.scaled_dot_product_attention(q_i, k_i, v_i, attn_mask=self._masks[g], enable_gqa=gqa)
            outs.append(out)
        return torch.cat(outs, dim=2)


def data_parallel_rank(rank: int, world_size: int, cp: int) -> tuple[int, int]:
    """(rank, world size) among the ranks that see different data: cp peers share one index."""
    return rank // cp, world_size // cp


def kv_gather_bytes_per_layer(
    *, micro_batch_size: int, sequence_length: int, kv_dim: int, cp: int, bytes_per_element: int = 2
) -> int:
    """Bytes one rank receives per layer in the forward all-gather of K and V (the same again is
    reduce-scattered in the backward pass, in the gradient's dtype): (cp-1)/cp of the full K/V."""
    full_kv = 2 * micro_batch_size * sequence_length * kv_dim * bytes_per_element
    return full_kv * (cp - 1) // cp

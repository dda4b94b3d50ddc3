"""Where this process runs: its rank and device from torchrun's environment, and the job's process group."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Runtime:
    """Where this process sits in the job (from torchrun's environment) and what hardware it has."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device

    @classmethod
    def from_env(cls) -> Runtime:
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        return cls(rank, local_rank, world, local_world, device)


def free_port() -> int:
    """A TCP port nothing listens on now, for a lone process's rendezvous (or a launcher's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(runtime: Runtime) -> None:
    """One process group for the job: NCCL on GPUs, gloo on CPU. A lone process gets a world of one.

    The collectives keep torch's default timeout; the weights' initial values come from the plan's seed
    where the model is sharded (parallelize.py), so nothing here draws random numbers.
    """
    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    if runtime.device.type == "cuda":
        torch.cuda.set_device(runtime.device)
        dist.init_process_group("nccl", device_id=runtime.device)
    else:
        dist.init_process_group("gloo")

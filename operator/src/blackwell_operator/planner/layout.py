"""The hardware a plan runs on, and how a candidate lays the model over it (shard/replicate/CP degrees)."""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_operator.catalogs import GpuSpec, InstanceSpec
from blackwell_trainer.plan.config import ActivationCheckpointing, Precision, PrecisionRecipe, Sharding


@dataclass(frozen=True)
class Hardware:
    """Nodes of one instance type, and how many GPUs of each the job uses."""

    gpu: GpuSpec
    instance: InstanceSpec
    nodes: int
    gpus_per_node: int

    @property
    def world(self) -> int:
        """Trainer processes (GPUs) in the job."""
        return self.nodes * self.gpus_per_node

    @property
    def efa_bandwidth_per_gpu(self) -> float:
        """Inter-node bytes/s per GPU per direction (the node's EFA shared by its GPUs)."""
        return self.instance.inter_node_bandwidth / self.gpus_per_node


@dataclass(frozen=True)
class Setting:
    """One point of the search, before gradient accumulation is derived."""

    precision: Precision
    recipe: PrecisionRecipe
    activation_checkpointing: ActivationCheckpointing
    micro_batch_size: int
    sharding: Sharding
    context_parallel: int = 1
    compile: bool = True

    def with_mbs(self, mbs: int) -> Setting:
        """The same setting at another micro-batch size."""
        return Setting(
            self.precision,
            self.recipe,
            self.activation_checkpointing,
            mbs,
            self.sharding,
            self.context_parallel,
            self.compile,
        )

    @property
    def family(self) -> tuple[str, str, str, str, int]:
        """Everything but the micro-batch: the key the search groups micro-batch sizes by."""
        return (
            self.precision.value,
            self.recipe.value,
            self.activation_checkpointing.value,
            self.sharding.value,
            self.context_parallel,
        )


@dataclass(frozen=True)
class Layout:
    """Degrees of a setting on the hardware: parameters sharded over shard_degree GPUs, etc."""

    shard_degree: int
    replicate_degree: int
    context_parallel: int
    data_parallel: int
    shard_within_node: bool
    replicate_within_node: bool
    process_groups: int

    @property
    def one_device(self) -> bool:
        """One process with nothing to shard or split: where the trainer can skip FSDP2 (tuning.py)."""
        return self.shard_degree * self.replicate_degree == 1 and self.context_parallel == 1

    @classmethod
    def of(cls, setting: Setting, hw: Hardware) -> Layout:
        """Lay a setting out over the hardware (the trainer's FSDP2 mesh)."""
        world, cp = hw.world, setting.context_parallel
        if setting.sharding is Sharding.FULL:
            shard, replicate = world, 1
        elif setting.sharding is Sharding.HYBRID:
            shard, replicate = hw.gpus_per_node, hw.nodes
        else:
            # No parameter sharding; context-parallel ranks still hold whole copies.
            shard, replicate = 1, world
        groups = 0 if world == 1 else (1 if replicate == 1 or shard == 1 else 2) + (1 if cp > 1 else 0)
        return cls(
            shard_degree=shard,
            replicate_degree=replicate,
            context_parallel=cp,
            data_parallel=world // cp,
            shard_within_node=shard <= hw.gpus_per_node,
            replicate_within_node=hw.nodes == 1,
            process_groups=groups,
        )

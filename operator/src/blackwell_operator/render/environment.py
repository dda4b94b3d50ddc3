"""The trainer container's environment: NCCL/EFA/PyTorch defaults that spec.env overrides, sorted by name."""

from __future__ import annotations

from collections.abc import Iterable

from blackwell_operator.models.spec import OPERATOR_VOLUMES, EnvVar
from blackwell_trainer.plan.config import CACHE_MAX_BYTES_ENV, Plan
from blackwell_trainer.plan.env_vars import CACHE_DIR_ENV, PLAN_PATH_ENV

PLAN_DIR = OPERATOR_VOLUMES["plan"]
PLAN_FILE = "plan.json"
PLAN_PATH = f"{PLAN_DIR}/{PLAN_FILE}"
LOCAL_DIR = OPERATOR_VOLUMES["local"]
# torchrun forwards SIGTERM to its ranks and SIGKILLs them this many seconds later (its default is 30 s,
# too short for a sharded checkpoint of a large model). The pod's terminationGracePeriodSeconds (300,
# render/pod.py) minus 30 s for torchrun's own exit. torchrun reads TORCH_ELASTIC_SHUTDOWN_TIMEOUT from
# torch 2.12 on (older versions keep 30 s and ignore it).
TORCHRUN_SHUTDOWN_SECONDS = 270

# Sources: docs/reference/hyperpod-pytorchjob.md §2.4, from awsome-distributed-training's HyperPod EKS FSDP
# examples
# (llama3_1_8b-fsdp-hpto.yaml, fsdp.yaml-template). The cheatsheet there notes several of these are
# no-ops on current libfabric/aws-ofi-nccl; they are kept as harmless defaults for older images and
# spec.env may override them. What the plan depends on (blackwell_trainer.plan.env_vars.OPERATOR_OWNED: the
# allocator setting, torchrun's shutdown time, the plan's and the cache's places) spec.env may not set.
DEFAULT_ENV: dict[str, str] = {
    # EFA through libfabric.
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    # NCCL: every interface but loopback; WARN keeps production logs readable (INFO is the HPCLI default).
    "NCCL_SOCKET_IFNAME": "^lo",
    "NCCL_DEBUG": "WARN",
    "GLOO_SOCKET_IFNAME": "eth0",
    # PyTorch NCCL watchdog: fail fast on a hung collective and dump the flight recorder to NVMe.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{LOCAL_DIR}/nccl_trace_rank_",
    # Time for the SIGTERM checkpoint before torchrun kills its ranks (above).
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(TORCHRUN_SHUTDOWN_SECONDS),
    # Fewer allocator-fragmentation OOMs; the planner's fragmentation term assumes it.
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    # PYTHONUNBUFFERED is left to the training operator, which always injects it
    # (docs/reference/hyperpod-pytorchjob.md §1.2).
    # The trainer also finds its plan through this variable (see blackwell_trainer's entry point).
    PLAN_PATH_ENV: PLAN_PATH,
    # S3 token shards are cached in the pod's node-local scratch, shared by its ranks and kept across
    # container restarts (the trainer's default, /tmp, is the container's root disk, lost on every restart).
    CACHE_DIR_ENV: f"{LOCAL_DIR}/btj-cache",
}


def plan_env(plan: Plan) -> dict[str, str]:
    """What the plan sets: the S3 cache's cap, its share of the pod's declared node-local disk (issue 24)."""
    if plan.local_storage is None:
        return {}
    return {CACHE_MAX_BYTES_ENV: str(plan.local_storage.cache_max_bytes)}


def container_env(overrides: Iterable[EnvVar], planned: dict[str, str] | None = None) -> list[dict[str, str]]:
    """Defaults, then the plan's values, overlaid by the user's variables (the user wins; the last duplicate
    wins), sorted by name. Admission refuses a user's variable the operator owns (models/spec.py)."""
    merged = {**DEFAULT_ENV, **(planned or {})}
    for variable in overrides:
        merged[variable.name] = variable.value
    return [{"name": name, "value": merged[name]} for name in sorted(merged)]

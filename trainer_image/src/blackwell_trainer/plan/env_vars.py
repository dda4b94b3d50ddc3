"""The trainer's environment: which variables the operator owns, and the one check of each a user may set.

One module for three readers, so that they agree: the trainer checks a variable at start, and `btj plan`,
`btj render` and the operator check the same value in `spec.env` before any pod exists (models/spec.py).
Plain Python, no torch: the operator image imports it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import fields

from blackwell_trainer.plan.config import CACHE_MAX_BYTES_ENV, NODE_DISK_KEEP_FREE_FRACTION
from blackwell_trainer.plan.tuning import TUNING_ENV, Tuning, TuningError

PLAN_PATH_ENV = "BTJ_PLAN_PATH"
CACHE_DIR_ENV = "BTJ_CACHE_DIR"
METRICS_ADDRESS_ENV = "BTJ_METRICS_ADDRESS"
DEFAULT_METRICS_ADDRESS = "0.0.0.0"
CACHE_KEEP_FREE_ENV = "BTJ_CACHE_KEEP_FREE_FRACTION"
LEDGER_ENV = "BTJ_SAMPLE_LEDGER"
TERMINATION_LOG_ENV = "BTJ_TERMINATION_LOG"
# The prefix of the trainer's own variables: one that is neither the operator's nor a user's setting below
# is no variable the trainer reads (a misspelling), and refused as such.
OWN_PREFIX = "BTJ_"

# What the operator sets on every trainer container and a plan depends on: the memory model assumes the
# allocator's expandable segments, the pod's grace period torchrun's shutdown time, and the plan, the cache
# and its cap are where the operator put them. `spec.env` may not set these (the rest of the operator's
# defaults, NCCL's and libfabric's tunables, it may).
OPERATOR_OWNED: frozenset[str] = frozenset(
    {
        "PYTORCH_CUDA_ALLOC_CONF",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        PLAN_PATH_ENV,
        CACHE_DIR_ENV,
        CACHE_MAX_BYTES_ENV,
        TERMINATION_LOG_ENV,
    }
)


def _address(value: str) -> str | None:
    address = value.strip() or DEFAULT_METRICS_ADDRESS
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return (
            "is not an IP address. Fix: set it in spec.env to an address of the pod, e.g. 127.0.0.1 (the pod "
            f"only) or {DEFAULT_METRICS_ADDRESS} (every address, the default)"
        )
    return None


def keep_free(value: str) -> float | None:
    """The share of the disk the S3 cache keeps free (empty: the default); None when it is not one."""
    try:
        share = float(value) if value.strip() else NODE_DISK_KEEP_FREE_FRACTION
    except ValueError:
        return None
    return share if 0.0 <= share < 1.0 else None


def _keep_free(value: str) -> str | None:
    if keep_free(value) is None:
        return (
            "is not a share of the disk from 0 to 1 (below 1). Fix: e.g. "
            f"{NODE_DISK_KEEP_FREE_FRACTION}, or leave it out for the default"
        )
    return None


def _tuning(value: str) -> str | None:
    try:
        Tuning.parse(value)
    except TuningError:
        keys = ", ".join(f.name for f in fields(Tuning))
        return f"is not key=value switches of the trainer, comma-separated. Fix: keys among {keys}"
    return None


def _any(_: str) -> str | None:
    return None


# The variables a user may set, each with the check the trainer makes at start (None: any value works).
USER_SETTINGS: dict[str, Callable[[str], str | None]] = {
    METRICS_ADDRESS_ENV: _address,
    CACHE_KEEP_FREE_ENV: _keep_free,
    TUNING_ENV: _tuning,
    LEDGER_ENV: _any,
}


def metrics_address(value: str) -> str:
    """The bind address of /metrics from the variable's value (empty: every IPv4 address of the pod)."""
    problem = _address(value)
    if problem is not None:
        raise ValueError(f"{METRICS_ADDRESS_ENV}={value!r} {problem}")
    return value.strip() or DEFAULT_METRICS_ADDRESS


def refusal(name: str, value: str) -> tuple[str, str] | None:
    """Why `spec.env` may not carry this variable: ("name" or "value", the reason with its fix); None: fine.

    The reason never repeats the value (it may be a secret, and the operator writes it into status).
    """
    if name in OPERATOR_OWNED:
        return "name", (
            f"{name} is set by the operator (the plan and the pod depend on its value), not by spec.env. "
            "Fix: remove it"
        )
    check = USER_SETTINGS.get(name)
    if check is not None:
        problem = check(value)
        return ("value", f"{name} {problem}") if problem is not None else None
    if name.startswith(OWN_PREFIX):
        return "name", (
            f"{name} is no variable the trainer reads. Fix: one of {', '.join(sorted(USER_SETTINGS))}, "
            "or remove it"
        )
    return None

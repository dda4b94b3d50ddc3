"""What a trainer pod gets (its rendered container's environment and the plan), translated to this machine.

`btj train` runs the trainer where it is typed. Its environment is read off the trainer container of the
objects `btj render` prints (the same render_children the operator calls), so a variable the pod gets
cannot be left out here; only what names the pod's own mounts or network is changed, and each change is
one line of `LocalRun.changes`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blackwell_operator.render.environment import LOCAL_DIR, PLAN_DIR, PLAN_FILE
from blackwell_trainer.plan.config import Plan
from blackwell_trainer.plan.env_vars import TERMINATION_LOG_ENV  # blackwell_trainer.loop.termination reads it

TRAINER_MODULE = "blackwell_trainer"

# The pod's interfaces: every one but loopback for NCCL, eth0 for gloo. One machine talks over loopback.
LOOPBACK_INTERFACES = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


@dataclass
class LocalRun:
    """The trainer's command, its environment and plan on this machine, and what differs from the pod."""

    command: list[str]
    env: dict[str, str]
    plan_json: str
    plan_path: Path
    termination_log: Path
    changes: list[str] = field(default_factory=list)


def trainer_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The container that runs the trainer, wherever the job kind keeps its pod template."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for item in node.get("containers", []) if isinstance(node.get("containers"), list) else []:
                if isinstance(item, dict) and TRAINER_MODULE in item.get("command", []):
                    found.append(item)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(objects)
    if not found:
        raise LookupError("the rendered objects hold no container running blackwell_trainer")
    return found[0]


def local_run(
    objects: list[dict[str, Any]], plan: Plan, workdir: Path, *, metrics_port: int | None = None
) -> LocalRun:
    """The trainer of `plan`, as its pods run it, started from `workdir` on this machine.

    Every process of the job runs here: one without a launcher, more under torch.distributed.run (the
    pods' torchrun) with the plan's world size, since the trainer checks that it started that many.
    """
    workdir = workdir.resolve()
    local_dir = workdir / "local"
    changes: list[str] = []
    env: dict[str, str] = {}
    for variable in trainer_container(objects).get("env", []):
        if "value" not in variable:  # a valueFrom (the pod's own name, say) has no meaning here
            changes.append(f"{variable['name']}: not set here (the pod reads it from the cluster)")
            continue
        value = str(variable["value"])
        local = _rerooted(value, workdir, local_dir)
        if variable["name"] in LOOPBACK_INTERFACES:
            local = LOOPBACK_INTERFACES[variable["name"]]
        if local != value:
            changes.append(f"{variable['name']}={local} (the pod's {value})")
        env[variable["name"]] = local
    plan = plan.model_copy(deep=True)
    if plan.checkpoint.path is not None:
        path = _rerooted(plan.checkpoint.path, workdir, local_dir)
        if path != plan.checkpoint.path:
            changes.append(f"plan checkpoint.path {path} (the pod's {plan.checkpoint.path})")
            plan.checkpoint.path = path
    if metrics_port is not None and metrics_port != plan.metrics_port:
        changes.append(f"plan metricsPort {metrics_port} (the pod's {plan.metrics_port})")
        plan.metrics_port = metrics_port
    plan_path = workdir / PLAN_FILE
    termination_log = workdir / "termination-log"
    env[TERMINATION_LOG_ENV] = str(termination_log)  # the pod's /dev/termination-log
    trainer = ["-m", TRAINER_MODULE, "--plan", str(plan_path)]
    if plan.world_size > 1:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={plan.world_size}"]
        command = [sys.executable, *launcher, *trainer]
    else:
        command = [sys.executable, *trainer]
    return LocalRun(command, env, plan.to_json() + "\n", plan_path, termination_log, changes)


def _rerooted(value: str, workdir: Path, local_dir: Path) -> str:
    """A value naming the pod's plan mount or its node-local scratch, moved under `workdir`."""
    for pod_root, here in ((PLAN_DIR, workdir), (LOCAL_DIR, local_dir)):
        if value == pod_root or value.startswith(pod_root + "/"):
            return str(here) + value[len(pod_root) :]
    return value

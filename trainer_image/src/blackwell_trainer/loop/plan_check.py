"""Read the plan file and refuse, with one line, a plan this job or its hardware cannot run."""

from __future__ import annotations

import torch
from pydantic import ValidationError

from blackwell_trainer.errors import PlanError
from blackwell_trainer.parallel.precision import (
    check_precision,
    parse_capability,
    resolve_backend,
    te_available,
    torchao_available,
)
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import JOB_FILE, DatasetKind, JobIdentity, Plan, PrecisionRecipe
from blackwell_trainer.plan.env_vars import PLAN_PATH_ENV
from blackwell_trainer.plan.tuning import Tuning


def _validation_line(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "plan"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{loc}: {first['msg']}{more}"


def load_plan(path: str | None) -> Plan:
    """Read and validate the plan file; PlanError with one line on any problem."""
    if not path:
        raise PlanError(f"no plan given: pass --plan PATH or set {PLAN_PATH_ENV}")
    try:
        return Plan.from_file(path)
    except FileNotFoundError:
        raise PlanError(f"plan file not found: {path}; mount the plan ConfigMap or pass --plan") from None
    except ValidationError as err:
        raise PlanError(f"invalid plan {path}: {_validation_line(err)}") from None


def job_identity(plan_path: str, plan: Plan) -> JobIdentity:
    """The job.json beside the plan (the operator renders both into the plan ConfigMap), else the plan's
    jobName alone; PlanError with one line when the file is there but unreadable."""
    try:
        return JobIdentity.beside(plan_path, plan)
    except (OSError, ValidationError) as err:
        problem = _validation_line(err) if isinstance(err, ValidationError) else str(err)
        raise PlanError(f"invalid {JOB_FILE} beside the plan {plan_path}: {problem}") from None


def check_plan(plan: Plan, runtime: Runtime, capability: tuple[int, int] | None) -> None:
    """Refuse a plan the job or the hardware cannot run, before any GPU memory is touched."""
    if plan.world_size != runtime.world_size:
        raise PlanError(
            f"plan is for {plan.world_size} processes (nodes {plan.nodes} x gpusPerNode {plan.gpus_per_node})"
            " "
            f"but this job started {runtime.world_size}; re-plan or fix --nproc-per-node / nnodes"
        )
    if plan.parameter_count != plan.architecture.parameter_count():
        raise PlanError(
            f"parameterCount {plan.parameter_count} does not match the architecture's "
            f"{plan.architecture.parameter_count()}; re-plan"
        )
    if plan.dataset.kind == DatasetKind.CHAT and plan.chosen.context_parallel > 1:
        raise PlanError(
            f"contextParallel {plan.chosen.context_parallel} would split packed chat rows, whose document "
            "mask is built per row; re-plan with spec.tuning.contextParallel 1 or auto"
        )
    # First against the GPU the plan was made for (pure), then against the GPU actually present.
    check_precision(
        plan.chosen, parse_capability(plan.gpu.compute_capability), where=f"plan GPU {plan.gpu.name}"
    )
    where = torch.cuda.get_device_name(runtime.device) if runtime.device.type == "cuda" else "this machine"
    if runtime.device.type == "cuda" or plan.chosen.precision.value != "bf16":
        check_precision(plan.chosen, capability, where=where)
    if capability is not None and capability < parse_capability(plan.gpu.compute_capability):
        raise PlanError(
            f"plan is for {plan.gpu.name} (compute capability {plan.gpu.compute_capability}) but this pod"
            " has "
            f"{where} ({capability[0]}.{capability[1]}); re-plan for this instance type"
        )


def check_tuning(plan: Plan, tuning: Tuning) -> None:
    """Refuse a switch this plan cannot take (TuningError, one line), before anything is built."""
    if tuning.fp8_all_gather != "on":
        return
    _, recipe = resolve_backend(plan.chosen, te=te_available(), torchao=torchao_available())
    tuning.gathers_fp8(
        shard_ranks=plan.chosen.shard_degree, tensorwise=recipe == PrecisionRecipe.TORCHAO_TENSORWISE
    )

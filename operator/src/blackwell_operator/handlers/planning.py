"""Planning in a reconcile, under a deadline: a spec that plans too slowly is Invalid, never a held worker."""

from __future__ import annotations

import queue
import threading

from blackwell_operator.calibration.cluster import Corrector
from blackwell_operator.errors import SpecError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import MemoryCorrection
from blackwell_operator.planner import plan_job
from blackwell_operator.settings import env_name, operator_environment
from blackwell_trainer.plan.config import NodeChoice, Plan

PLAN_DEADLINE_ENV = env_name("plan_deadline_s")


class PlanningTimeout(SpecError):
    """Planning did not finish within the deadline."""

    @property
    def reason(self) -> str:
        return "PlanningTimeout"


def plan_deadline() -> float:
    """Seconds one reconcile may plan (`BTJ_PLAN_DEADLINE_S`, default 10)."""
    return operator_environment().plan_deadline_s


def plan_within(
    spec: BlackwellTrainingJobSpec,
    job_name: str,
    deadline_s: float | None = None,
    correction: MemoryCorrection | None = None,
    *,
    cluster: Corrector | None = None,
    schedulable: int | None = None,
    current: NodeChoice | None = None,
    global_batch: int | None = None,
) -> Plan:
    """plan_job in its own daemon thread, waited for at most `deadline_s`.

    A thread of its own, not a pool: a plan that overruns keeps only its own thread busy (it ends when the
    search does) and never delays another job's planning. SpecError from the planner passes through.
    """
    limit = plan_deadline() if deadline_s is None else deadline_s
    answer: queue.Queue[Plan | BaseException] = queue.Queue(maxsize=1)

    def work() -> None:
        try:
            plan = plan_job(
                spec,
                job_name=job_name,
                correction=correction,
                cluster=cluster,
                schedulable=schedulable,
                current=current,
                global_batch=global_batch,
            )
            answer.put(plan)
        except BaseException as exc:  # handed to the waiting reconcile, which raises it there
            answer.put(exc)

    threading.Thread(target=work, name=f"plan-{job_name}", daemon=True).start()
    try:
        result = answer.get(timeout=limit)
    except queue.Empty:
        raise PlanningTimeout(
            "spec",
            f"planning did not finish within {limit:g} s ({PLAN_DEADLINE_ENV})",
            "reduce spec.training.globalBatchTokens or pin spec.tuning (microBatchSize, precision, "
            "activationCheckpointing); `btj plan job.yaml` shows how long planning takes",
        ) from None
    if isinstance(result, BaseException):
        raise result
    return result

"""One offline admission for `btj plan`, `btj render` and `btj train`: the same checks, never disagreeing.

All of them refuse what the operator refuses (its planning is the same plan_job, which reads no
checkpoint), check the object names the children take, and check the weights and the data set this
machine can read as the trainer will; a refusal ends each command with the same line. Where the children
are printed or run (`for_children`), the plan is the operator's own: made without what was read here.
"""

from __future__ import annotations

from blackwell_operator.calibration import Calibration
from blackwell_operator.calibration.cluster import ClusterCalibration
from blackwell_operator.cli.manifest import fail
from blackwell_operator.errors import SpecError
from blackwell_operator.models import BlackwellTrainingJob
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.render.names import name_problem
from blackwell_operator.settings import operator_environment
from blackwell_trainer.plan.config import Plan


def admit(
    job: BlackwellTrainingJob,
    spec: BlackwellTrainingJobSpec,
    *,
    shown_as: str,
    calibration: Calibration | None = None,
    cluster: ClusterCalibration | None = None,
    for_children: bool = False,
) -> Plan:
    """The plan of an admitted job, or the command ends with the one line that refuses it.

    `spec` is the job's spec with the backend resolved offline; `shown_as` names the manifest in errors.
    `for_children`: return the plan the operator would write (no checkpoint size or dtype read here, no
    line about the data read here), not `btj plan`'s, which uses them.
    """
    problem = name_problem(job.metadata.name)
    if problem:
        fail(f"{shown_as}: {problem}")
    from blackwell_operator.cli.checkpoint import read_checkpoint
    from blackwell_operator.cli.dataset import check_local_dataset, describe_chat_data
    from blackwell_operator.planner import plan_job  # imported only when needed: `btj crd` stays light
    from blackwell_trainer.plan.shard_manifest import ManifestMismatch

    corrector = (
        # As the operator plans it: the manifest's namespace's own runs (or the pool, when set).
        cluster.corrector(
            spec.cluster.instance_type,
            job.metadata.namespace or "default",
            pooled=operator_environment().cluster_calibration_pool,
        )
        if cluster
        else None
    )
    try:
        local = read_checkpoint(spec)
        plan = plan_job(
            spec, job_name=job.metadata.name, calibration=calibration, checkpoint=local, cluster=corrector
        )
        if for_children and local is not None:
            # The checks above used the files read here; the operator's plan is made without them.
            plan = plan_job(spec, job_name=job.metadata.name, calibration=calibration, cluster=corrector)
        # Prepared data readable here is checked as the trainer will check it, in the trainer's words.
        manifest = check_local_dataset(plan)
        if manifest is not None and manifest.kind == "chat" and not for_children:
            plan.explanation.append(describe_chat_data(manifest, str(plan.dataset.uri)))
    except SpecError as exc:
        fail(exc.message)
    except ManifestMismatch as exc:
        fail(str(exc))
    return plan

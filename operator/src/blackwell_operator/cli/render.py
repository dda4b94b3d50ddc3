"""`btj render` (a preview of the objects the operator would create, offline) and `btj crd` (the CRD YAML)."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from blackwell_operator.cli import app
from blackwell_operator.cli.backend_option import BackendOption, resolve_offline
from blackwell_operator.cli.manifest import load_manifest_or_fail
from blackwell_operator.cli.options import (
    DEFAULT_CALIBRATION,
    CalibrationOption,
    ClusterCalibrationOption,
    read_calibration,
    read_cluster_calibration,
)
from blackwell_operator.models.spec import DEFAULT_IMAGE
from blackwell_operator.planner.figures import limit_gib, memory_budget, parameters_text
from blackwell_operator.render import dump_documents, render_children
from blackwell_operator.render.crd import crd_yaml
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import Plan

DEFAULT_NAMESPACE = "default"
# A preview: children applied by hand have no owner, no status, no re-plan and no finalizer.
APPLY_THE_BTJ = (
    "a preview: apply the BlackwellTrainingJob itself (kubectl apply -f job.yaml) and the operator creates "
    "these; applied by hand they would be nobody's (no status, no re-plan, no clean-up)"
)


class OutputFormat(StrEnum):
    """How `btj render` prints the objects."""

    YAML = "yaml"
    JSON = "json"


def plan_summary(plan: Plan, headroom: float) -> str:
    """A few human lines about the plan (stderr, so stdout stays valid YAML/JSON)."""
    chosen, predicted = plan.chosen, plan.predicted
    peak = predicted.memory.peak_reserved / GIB
    budget = limit_gib(memory_budget(plan.gpu.memory_bytes, headroom))
    return "\n".join(
        [
            f"plan {plan.job_name}: {plan.model_name} ({parameters_text(plan.parameter_count)} parameters) "
            f"on {plan.nodes} x {plan.instance_type} ({plan.world_size} x {plan.gpu.name})",
            f"  chosen: precision {chosen.precision.value} ({chosen.precision_recipe.value}), "
            f"activation checkpointing {chosen.activation_checkpointing.value}, micro-batch "
            f"{chosen.micro_batch_size} x {chosen.gradient_accumulation_steps} accumulation, sharding "
            f"{chosen.sharding.value}, context parallel {chosen.context_parallel}",
            f"  predicted: {predicted.tokens_per_second_per_gpu:,.0f} tokens/s per GPU, MFU "
            f"{predicted.model_flops_utilization:.1%} of the BF16 dense peak, peak memory {peak:.1f} of "
            f"{budget:.1f} GiB budget per GPU ({headroom * 100:g}% of the GPU's memory kept free)",
            *_rests_on(plan),
        ]
    )


def _rests_on(plan: Plan) -> list[str]:
    """The PlanVerified condition's line: which choices are measured here and which modelled."""
    from blackwell_operator.planner.provenance import verdict  # with the planner: `btj crd` stays light

    if not plan.provenance:
        return []
    return [f"  rests on: {verdict(plan.provenance)[2]} (btj plan shows what each rests on)"]


@app.command()
def render(
    file: Annotated[
        Path | None, typer.Argument(help="BlackwellTrainingJob manifest; the embedded example if omitted.")
    ] = None,
    output: Annotated[
        OutputFormat | None,
        typer.Option(
            "--output",
            "-o",
            help="yaml or json. Default: yaml; on a terminal, the plan and the objects' names first "
            "(pass -o yaml for the objects themselves).",
            show_default=False,
        ),
    ] = None,
    backend: BackendOption = None,
    calibration: CalibrationOption = DEFAULT_CALIBRATION,
    cluster_calibration: ClusterCalibrationOption = None,
) -> None:
    """Preview every object the operator would create for a BTJ (plan ConfigMap and job), offline.

    Apply the BTJ itself; the operator creates these objects and owns them.
    """
    cal = read_calibration(calibration)
    cluster = None if cluster_calibration is None else read_cluster_calibration(cluster_calibration)
    job = load_manifest_or_fail(file)
    spec, backend_note = resolve_offline(job.spec, backend)
    name = job.metadata.name
    namespace = job.metadata.namespace or DEFAULT_NAMESPACE
    raw_labels: Any = (job.metadata.model_extra or {}).get("labels") or {}
    labels = (
        {str(key): str(value) for key, value in raw_labels.items()} if isinstance(raw_labels, dict) else {}
    )
    from blackwell_operator.cli.admit import admit

    # The same admission as `btj plan`: what render prints, plan accepts, and the other way round; the
    # plan in the objects is the operator's own (made without the files read here).
    plan = admit(
        job, spec, shown_as=str(file or "the manifest"), calibration=cal, cluster=cluster, for_children=True
    )
    objects = render_children(name, namespace, spec, plan, labels=labels)
    typer.echo(plan_summary(plan, spec.tuning.memory_headroom), err=True)
    typer.echo(backend_note, err=True)
    if job.spec.image is None:
        typer.echo(
            f"  image: {DEFAULT_IMAGE} (no spec.image: the operator runs its own default, the chart's "
            "trainerImage)",
            err=True,
        )
    if job.spec.dry_run:
        typer.echo(
            "  spec.dryRun is true: the operator writes the plan to status and creates nothing", err=True
        )
    if output is None and _stdout_is_terminal():
        # A person at a terminal reads the plan, not hundreds of lines of YAML scrolling it away;
        # a pipe or a file (`btj render > children.yaml`, a diff) still gets the YAML.
        lines = dump_documents(objects).count("\n")
        typer.echo("objects the operator would create:")
        for obj in objects:
            typer.echo(f"  {obj['kind']} {namespace}/{obj['metadata']['name']}")
        typer.echo(
            f"`btj render -o yaml` prints them ({lines} lines of YAML), as btj render does into a pipe"
        )
        typer.echo(APPLY_THE_BTJ)
        return
    typer.echo(f"  {APPLY_THE_BTJ}", err=True)
    if output == OutputFormat.JSON:
        document = {"apiVersion": "v1", "kind": "List", "items": objects}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        sys.stdout.write(dump_documents(objects))


def _stdout_is_terminal() -> bool:
    """Whether standard output is a terminal (a person reading), not a pipe or a file."""
    return sys.stdout.isatty()


@app.command()
def crd() -> None:
    """Print the BlackwellTrainingJob CustomResourceDefinition (the file committed under crds/)."""
    sys.stdout.write(crd_yaml())

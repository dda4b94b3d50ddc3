"""`btj train`: run a BTJ's trainer on this machine (the CPU or local GPUs), as its pods would run it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from blackwell_operator.cli import app
from blackwell_operator.cli.backend_option import BackendOption, resolve_offline
from blackwell_operator.cli.local_run import local_run
from blackwell_operator.cli.manifest import fail, load_manifest_or_fail
from blackwell_operator.cli.options import (
    DEFAULT_CALIBRATION,
    CalibrationOption,
    ClusterCalibrationOption,
    read_calibration,
    read_cluster_calibration,
)
from blackwell_operator.cli.render import DEFAULT_NAMESPACE

TRAINER_EXTRA = (
    "btj train runs the trainer, which needs torch and the trainer extra: "
    "pip install 'blackwell-training-operator[trainer]' (or bash scripts/bootstrap.sh --all)"
)


@app.command()
def train(
    # Required: the embedded example is 8B on sixteen B200s, sixteen processes no workstation holds.
    file: Annotated[Path, typer.Argument(help="BlackwellTrainingJob manifest (`-`: standard input).")],
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            help="Folder for the plan, the pod's /local and the termination log. Default: ./btj-train-NAME.",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="Port of the trainer's /metrics here (several runs on one machine). Default: the plan's.",
            show_default=False,
        ),
    ] = None,
    backend: BackendOption = None,
    calibration: CalibrationOption = DEFAULT_CALIBRATION,
    cluster_calibration: ClusterCalibrationOption = None,
) -> None:
    """Run the trainer here as the pods would: the operator's plan, the pods' environment, every process.

    For smoke runs and for reproducing a pod's failure on the CPU or a local GPU. Needs the trainer extra.
    """
    if importlib.util.find_spec("torch") is None:
        fail(TRAINER_EXTRA)
    cal = read_calibration(calibration)
    cluster = None if cluster_calibration is None else read_cluster_calibration(cluster_calibration)
    job = load_manifest_or_fail(file)
    spec, _ = resolve_offline(job.spec, backend)
    from blackwell_operator.cli.admit import admit
    from blackwell_operator.render import render_children

    # Planned and rendered as `btj render` does, so the pods' plan and environment are the ones run here.
    plan = admit(job, spec, shown_as=str(file), calibration=cal, cluster=cluster, for_children=True)
    name = job.metadata.name
    objects = render_children(name, job.metadata.namespace or DEFAULT_NAMESPACE, spec, plan)
    _check_gpus(plan.world_size)
    folder = workdir if workdir is not None else Path(f"btj-train-{name}")
    run = local_run(objects, plan, folder, metrics_port=metrics_port)
    try:
        (folder / "local").mkdir(parents=True, exist_ok=True)
        run.plan_path.write_text(run.plan_json)
        run.termination_log.unlink(missing_ok=True)
    except OSError as err:
        fail(f"--workdir: cannot write {folder} ({err.strerror or err})")
    typer.echo(
        f"btj train {name}: {plan.world_size} process{'es' if plan.world_size != 1 else ''} "
        f"(nodes {plan.nodes} x gpusPerNode {plan.gpus_per_node}), plan {run.plan_path}",
        err=True,
    )
    for change in run.changes:
        typer.echo(f"  here: {change}", err=True)
    typer.echo(f"  {' '.join(run.command)}", err=True)
    code = subprocess.call(run.command, env={**os.environ, **run.env}, cwd=folder)
    if code != 0:
        message = run.termination_log.read_text().strip() if run.termination_log.exists() else ""
        where = f"; its termination message: {message}" if message else ""
        typer.echo(f"error: the trainer exited with code {code}{where}", err=True)
        raise typer.Exit(code if code > 0 else 1)
    typer.echo(f"btj train {name}: the trainer finished (exit 0)", err=True)


def _check_gpus(processes: int) -> None:
    """On a machine with GPUs every process takes one (the pods' rule): refuse a plan for more than it has."""
    import torch  # the trainer extra is there; the run imports it anyway

    gpus = torch.cuda.device_count()
    if 0 < gpus < processes:
        fail(
            f"the plan runs {processes} processes, one a GPU, and this machine has {gpus}: plan at most "
            f"{gpus} (spec.cluster.nodes x spec.cluster.gpusPerNode), or run on the CPU with "
            "CUDA_VISIBLE_DEVICES= (empty)"
        )

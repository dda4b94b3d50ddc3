"""`btj calibrate cluster show|export|reset`: the operator's cluster calibration, read from the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from blackwell_operator.calibration.cluster import MIN_RUNS, ClusterCalibration, describe_correction
from blackwell_operator.calibration.learned_memory import MIN_READINGS
from blackwell_operator.cli.calibrate import calibrate_app
from blackwell_operator.cli.console import table_console
from blackwell_operator.cli.manifest import fail

cluster_app = typer.Typer(
    help="The corrections the operator learned from jobs measured on this cluster: show, export, reset.",
    no_args_is_help=True,
)
calibrate_app.add_typer(cluster_app, name="cluster")

Namespace = Annotated[
    str,
    typer.Option(
        "--namespace", "-n", help="The operator's namespace (where its ConfigMap btj-cluster-calibration is)."
    ),
]
DEFAULT_NAMESPACE = "btj-system"


def _api() -> Any:
    """The cluster from the kubeconfig ($KUBECONFIG, ~/.kube/config) or the pod's service account."""
    from blackwell_operator.handlers.api import KubeApi, load_api_client

    try:
        return KubeApi(load_api_client())
    except Exception as exc:  # the kubernetes client raises ConfigException, OSError, TypeError, ...
        fail(f"no cluster credentials ({' '.join(str(exc).split())[:160]}); set KUBECONFIG")


def _load(namespace: str) -> ClusterCalibration:
    from blackwell_operator.handlers import cluster_calibration as store
    from blackwell_operator.handlers.api import ApiError

    try:
        return store.load(_api(), namespace)
    except ApiError as exc:
        fail(f"cannot read ConfigMap {namespace}/{store.NAME}: {exc}")
    except store.UnreadableCalibration as exc:
        fail(f"{namespace}/{exc}")


def summary_table(calibration: ClusterCalibration) -> Table:
    """One row per instance type and recipe family: runs, the medians' correction or what it still needs."""
    table = Table(title="Cluster calibration (measured over modelled, per family)")
    for col in ("instance type", "recipe", "AC", "runs", "jobs", "applied to later plans"):
        table.add_column(col)
    for key in sorted({s.key for s in calibration.samples}):
        runs = calibration.runs(key)
        correction = calibration.correction(*key)
        applied = (
            describe_correction(correction).split(": ", 1)[1]
            if correction
            else f"nothing yet ({MIN_RUNS - len(runs)} more run(s) needed)"
        )
        jobs = ", ".join(f"{s.job} x{s.tokens_ratio:.2f}" for s in runs[-3:])
        table.add_row(key[0], key[1].value, key[2].value, str(len(runs)), jobs, applied)
    return table


def memory_table(calibration: ClusterCalibration) -> Table:
    """One row per namespace and GPU type: its memory readings, out-of-memory floors and the factor."""
    table = Table(title="Memory (measured over modelled peak, per namespace and GPU type, every family)")
    for col in ("namespace", "instance type", "peaks", "out of memory", "applied to later plans"):
        table.add_column(col)
    keys = {(s.namespace, s.instance_type) for s in calibration.samples if s.memory_ratio is not None}
    keys |= {(r.namespace, r.instance_type) for r in calibration.memory}
    for namespace, instance in sorted(keys):
        peaks, floors = calibration.memory_evidence(instance, namespace)
        learned = calibration.learned_memory(instance, namespace)
        applied = (
            f"peak memory x{learned.factor:.2f}"
            if learned is not None
            else f"nothing yet ({MIN_READINGS - len(peaks)} more reading(s) needed)"
        )
        table.add_row(namespace, instance, str(len(peaks)), str(len(floors)), applied)
    return table


@cluster_app.command("show")
def show(namespace: Namespace = DEFAULT_NAMESPACE) -> None:
    """Print each family's runs and the correction later plans on its instance type get."""
    calibration = _load(namespace)
    if not calibration.samples:
        typer.echo(f"{namespace}: no measured runs yet; plans use the model as calibrated")
        return
    table_console().print(summary_table(calibration))
    table_console().print(memory_table(calibration))


@cluster_app.command("export")
def export(
    file: Annotated[Path, typer.Argument(help="Where to write it (JSON); `btj plan --cluster-calibration`.")],
    namespace: Namespace = DEFAULT_NAMESPACE,
) -> None:
    """Write the cluster calibration to a file, for `btj plan --cluster-calibration FILE` offline."""
    calibration = _load(namespace)
    try:
        file.write_text(calibration.model_dump_json(by_alias=True, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        fail(f"FILE: cannot write {file} ({exc})")
    typer.echo(f"wrote {len(calibration.samples)} run(s) to {file}")


@cluster_app.command("reset")
def reset(
    namespace: Namespace = DEFAULT_NAMESPACE,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Forget every measured run (delete the ConfigMap): later plans use the model until runs come in."""
    from blackwell_operator.handlers import cluster_calibration as store
    from blackwell_operator.handlers.api import ApiError

    if not yes and not typer.confirm(f"Delete ConfigMap {namespace}/{store.NAME} and every run in it?"):
        fail("nothing deleted")
    try:
        deleted = _api().delete(store.path(namespace))
    except ApiError as exc:
        fail(f"cannot delete ConfigMap {namespace}/{store.NAME}: {exc}")
    typer.echo(f"{namespace}/{store.NAME}: " + ("deleted" if deleted else "there was none"))

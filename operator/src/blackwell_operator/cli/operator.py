"""`btj run` (start the operator) and `btj demo` (the real operator against an embedded API server)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from blackwell_operator.admission.accounts import TRAINING_ACCOUNT_LABEL, TRAINING_ACCOUNT_VALUE
from blackwell_operator.cli import app
from blackwell_operator.cli.manifest import fail, load_manifest_or_fail

_console = Console()


@app.command("run")
def run(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Serve only these namespaces (glob patterns); default all."),
    ] = None,
    metrics_bind: Annotated[
        str, typer.Option(help="host:port for /metrics and /healthz, or 'off'.")
    ] = "0.0.0.0:8080",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each handler run.")] = False,
) -> None:
    """Start the operator: Kopf with the BlackwellTrainingJob handlers, /metrics and /healthz on :8080."""
    import kopf

    import blackwell_operator.handlers  # noqa: F401  (registers the handlers on Kopf's default registry)
    from blackwell_operator.handlers.runtime import settle_heap

    _need_cluster_credentials()
    os.environ["BTJ_METRICS_BIND"] = metrics_bind
    kopf.configure(verbose=verbose)
    settle_heap()
    # One replica (Deployment strategy Recreate): peering is not needed, and its CRDs are not installed.
    kopf.run(standalone=True, clusterwide=not namespace, namespaces=namespace or ())


def _need_cluster_credentials() -> None:
    """One line and exit 2 when there is no cluster to talk to (Kopf would retry its login forever)."""
    from blackwell_operator.handlers.api import load_api_client

    try:
        load_api_client().close()
    except Exception as exc:  # the kubernetes client raises ConfigException, OSError, TypeError, ...
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        detail = " ".join(str(exc).split())[:160]
        fail(
            f"no cluster credentials: not in a pod with a service account, and no usable kubeconfig at "
            f"{where} ({detail}); set KUBECONFIG, or run `btj demo` for an emulated cluster"
        )


@app.command("demo")
def demo(
    manifest: Annotated[
        Path | None, typer.Argument(help="A BTJ manifest; default: the embedded example.", show_default=False)
    ] = None,
    nodes: Annotated[
        int, typer.Option(min=0, max=1024, help="Schedulable nodes of the job's instance type to emulate.")
    ] = 4,
    pause: Annotated[float, typer.Option(min=0, help="Seconds between the simulated job phases.")] = 0.5,
) -> None:
    """Run the real operator against an embedded KMock API server and watch it handle a BTJ.

    The emulated nodes publish the allocatable resources of their instance type; stand-ins for Kueue
    (when the spec names a queue), the training operator, the scheduler and the kubelet move the job.
    Exit 0 when the job succeeds (or a dry run is planned); 1 when it is invalid or cannot run on the
    emulated nodes (it waits, as it would on the cluster).
    """
    job = load_manifest_or_fail(manifest)
    try:
        import kmock  # noqa: F401
    except ImportError:
        fail("`btj demo` needs the demo extra: pip install 'blackwell-training-operator[demo]'")
    # Kopf's own log lines (e.g. about streams left at shutdown) would drown the story the demo tells; for
    # the demo only: a process that goes on (a test run, an embedding program) keeps its Kopf warnings.
    kopf_logger = logging.getLogger("kopf")
    level = kopf_logger.level
    kopf_logger.setLevel(logging.ERROR)
    manifest_dict = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    manifest_dict["metadata"].setdefault("namespace", "default")
    try:
        ok = asyncio.run(_demo(manifest_dict, nodes=nodes, pause=pause))
    finally:
        kopf_logger.setLevel(level)
    raise typer.Exit(code=0 if ok else 1)


# ----- the demo ----------------------------------------------------------------------------------------


class _OperatorThread:
    """The real operator (all handlers, a fresh registry) in its own thread and event loop."""

    def __init__(self, server: str, namespace: str) -> None:
        import kopf

        from blackwell_operator.handlers import register

        self.registry = kopf.OperatorRegistry()
        register(self.registry)

        @kopf.on.login(registry=self.registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(
                server=server, scheme="Bearer", token="demo", default_namespace=namespace
            )

        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._main, name="btj-operator", daemon=True)
        self.error: BaseException | None = None

    def _main(self) -> None:
        import kopf

        try:
            asyncio.run(
                kopf.operator(
                    registry=self.registry, standalone=True, clusterwide=True, stop_flag=self.stop_flag
                )
            )
        except BaseException as exc:  # reported by the demo, not a traceback
            self.error = exc

    async def __aenter__(self) -> _OperatorThread:
        self.thread.start()
        return self

    async def __aexit__(self, *_: Any) -> None:
        self.stop_flag.set()
        # Joined off the event loop: the embedded API server runs on this loop, and the operator's last
        # calls (a loop's request still in flight as it stops) wait for it. A join on the loop itself left
        # them unanswered until the join's timeout: a dry-run demo often took 30 s longer.
        await asyncio.to_thread(self.thread.join, 30)


async def _wait(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise TimeoutError


async def _demo(manifest: dict[str, Any], *, nodes: int, pause: float) -> bool:
    from blackwell_operator.cli.plan import DEFAULT_HEADROOM, render_plan_tables
    from blackwell_operator.models.spec import PLURAL
    from blackwell_operator.render.kinds import job_kind
    from blackwell_operator.testing.cluster import allocatable, emulated_cluster, hyperpod_node
    from blackwell_operator.testing.emulator import BTJ_RESOURCE
    from blackwell_operator.testing.kubeconfig import write_kubeconfig
    from blackwell_trainer.plan.config import Plan

    console = _console
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    instance_type = manifest["spec"].get("cluster", {}).get("instanceType", "ml.p6-b200.48xlarge")
    bodies = [
        hyperpod_node(f"hyperpod-i-{i:03d}", instance_type, resources=allocatable(instance_type))
        for i in range(nodes)
    ]

    async with emulated_cluster(namespace, bodies) as k:
        server = str(k.url).rstrip("/")
        console.print(
            f"[bold]Embedded API server[/] (KMock, hardened) at {server}: namespace {namespace}, "
            f"{nodes} Schedulable {instance_type} node(s) with the device plugins' allocatable"
        )
        account = manifest["spec"].get("serviceAccountName")
        if account:
            # Labelled for training as an admin labels it: the operator runs pods only as such accounts.
            labels = {TRAINING_ACCOUNT_LABEL: TRAINING_ACCOUNT_VALUE}
            await k.post(
                f"/api/v1/namespaces/{namespace}/serviceaccounts",
                json={"metadata": {"name": account, "labels": labels}},
            )
            console.print(
                f"ServiceAccount {account} created for the demo (on a cluster you create it, bound to an "
                "IAM role, and an admin labels it for training: docs/install.md)"
            )

        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", server, name="demo")
            os.environ["KUBECONFIG"] = str(kubeconfig)
            os.environ.setdefault("BTJ_METRICS_BIND", "off")

            def btj() -> dict[str, Any]:
                return k.get_object(BTJ_RESOURCE, namespace, name) or {}

            def phase() -> str:
                return str((btj().get("status") or {}).get("phase") or "")

            async with _OperatorThread(server, namespace) as operator:
                try:
                    await _wait(
                        lambda: any(
                            r.params.get("watch") == "true"
                            and r.resource is not None
                            and r.resource.plural == PLURAL
                            for r in k.requests
                        )
                    )
                except TimeoutError:
                    console.print(f"[red]The operator did not start: {operator.error}[/]")
                    return False
                console.print(
                    "[bold]Operator[/] started (Kopf, all handlers); applying the BTJ "
                    f"[cyan]{namespace}/{name}[/] ..."
                )
                started = time.monotonic()
                await k.post(
                    f"/apis/training.blackwell.dev/v1alpha1/namespaces/{namespace}/blackwelltrainingjobs",
                    json=manifest,
                )
                try:
                    # Reconciled: the operator records the generation it planned for (with the plan).
                    await _wait(lambda: (btj().get("status") or {}).get("observedGeneration") == 1)
                except TimeoutError:
                    console.print("[red]No status after 30 s.[/]")
                    return False
                status = btj()["status"]
                console.print(
                    f"\n[bold]status.phase[/] = {status['phase']} after {time.monotonic() - started:.2f} s"
                )
                if status["phase"] == "Invalid":
                    console.print(f"[red]{status.get('message')}[/]")
                    return False
                plan = Plan.model_validate(status["plan"])
                tuning = manifest["spec"].get("tuning") or {}
                headroom = float(tuning.get("memoryHeadroom", DEFAULT_HEADROOM))
                render_plan_tables(plan, console, headroom=headroom)
                for cond in status.get("conditions", []):
                    console.print(
                        f"  condition {cond['type']:<18} {cond['status']:<7} {cond['reason']}: "
                        f"{cond['message']}"
                    )
                child = status.get("child")
                if not child:
                    console.print("Dry run: the plan is in status, nothing was created.")
                    return True
                row = job_kind(child["kind"])
                job = None if row is None else k.get_object(row.resource, namespace, child["name"])
                if job is None:
                    console.print(f"[red]The {child['kind']} {child['name']} is gone.[/]")
                    return False
                owners = ", ".join(
                    f"{r['kind']}/{r['name']}" for r in job.get("metadata", {}).get("ownerReferences", [])
                )
                console.print(
                    f"\n[bold]Created[/] {child['kind']} {child['name']} (owner {owners}) and ConfigMap "
                    f"{child['configMap']} with plan.json"
                )
                waits = await _simulate(k, console, job, plan.steps, phase, pause)

                def events() -> list[dict[str, Any]]:
                    return [
                        e
                        for e in k.live_objects("v1/events", namespace)
                        if (e.get("involvedObject") or {}).get("name") == name
                    ]

                # Kopf posts Events asynchronously; a job that waits (Pending) gets no Event for that.
                with contextlib.suppress(TimeoutError):
                    if not waits:
                        await _wait(lambda: any(e.get("reason") == phase() for e in events()), timeout=5)
                console.print("\n[bold]Events[/] on the BTJ:")
                for event in events():
                    kind, reason = event.get("type", ""), event.get("reason", "")
                    console.print(f"  {kind:<8} {reason:<12} {event.get('message', '')}")
                if waits:
                    console.print(
                        f"\n[yellow]Not run[/]: BTJ phase {phase()}; {waits} (`btj demo --nodes N` "
                        "emulates N nodes)"
                    )
            return phase() == "Succeeded"


async def _simulate(
    k: Any, console: Console, job: dict[str, Any], steps: int, phase: Callable[[], str], pause: float
) -> str:
    """Play the controllers on the emulated nodes and show the BTJ following; returns why the job waits
    ("" when it ran to the end)."""
    from blackwell_operator.render import trainjob
    from blackwell_operator.render.kinds import TRAINING_RUNTIME
    from blackwell_operator.testing.controllers import ControllerStandIn

    stand_in = ControllerStandIn(k, job, steps=steps)
    ref, namespace = job["spec"].get("runtimeRef") or {}, job["metadata"]["namespace"]
    runtime = (
        k.get_object(TRAINING_RUNTIME.resource, namespace, ref["name"])
        if job["kind"] == trainjob.KIND and ref
        else None
    )
    try:
        found = k.live_objects("v1/serviceaccounts", namespace)
        accounts = {"default", *(account["metadata"]["name"] for account in found)}
        moves, waits = stand_in.moves(k.live_objects("v1/nodes"), runtime, accounts)
    except ValueError as exc:
        return str(exc)
    console.print(
        "\n[bold]Simulating the cluster's controllers[/] (stand-ins writing the job's and pods' status):"
    )
    for move in moves:
        await asyncio.sleep(pause)
        await move.apply()
        try:
            await _wait(functools.partial(_is_phase, phase, move.expect), timeout=10)
        except TimeoutError:
            console.print(f"  {move.says}\n    BTJ phase stayed {phase()} [red](not {move.expect})[/]")
            return f"the BTJ did not follow the job to {move.expect}"
        console.print(f"  {move.says}\n    -> BTJ phase [green]{phase()}[/]")
    return waits


def _is_phase(phase: Callable[[], str], expected: str) -> bool:
    return phase() == expected

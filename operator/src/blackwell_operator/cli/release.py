"""`btj release-children`: before (or after) uninstalling the operator, let no child job be stuck deleting."""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

import typer

from blackwell_operator.cli import app
from blackwell_operator.cli.manifest import fail

# A namespace name is a DNS label (RFC 1123).
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _context() -> Any:
    """The operator's context (its API client and metrics) from the kubeconfig or the pod's account."""
    from blackwell_operator.handlers.api import load_api_client
    from blackwell_operator.handlers.runtime import build_context

    try:
        return build_context(load_api_client())
    except ValueError as exc:  # a bad BTJ_* setting: its own one-line message
        fail(str(exc))
    except Exception as exc:  # the kubernetes client raises ConfigException, OSError, TypeError, ...
        fail(f"no cluster credentials ({' '.join(str(exc).split())[:160]}); set KUBECONFIG")


@app.command("release-children")
def release_children(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Only children in this namespace (repeat for several)."),
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", "-A", help="Children in every namespace.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be done; change nothing.")
    ] = False,
) -> None:
    """Record each child job's state on its BlackwellTrainingJob, then remove its final-status finalizer.

    For a cluster without the operator (`helm uninstall` runs it first, as a pre-delete hook): a child
    deleted later would otherwise stay Terminating, since nothing is left to remove the finalizer. Exit
    0 when every child was released (or none held it), 1 when some could not be (each named, with why).
    """
    from blackwell_operator.handlers.api import ApiError
    from blackwell_operator.handlers.release import release_all

    if bool(namespace) == all_namespaces:
        fail("say where: --namespace NS (repeatable) or --all-namespaces, not both and not neither")
    for name in namespace or []:
        if not _NAMESPACE.match(name):
            fail(f"--namespace {name!r} is not a namespace name (lowercase letters, digits and '-')")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logger = logging.getLogger("btj.release-children")
    ctx = _context()
    where = "every namespace" if all_namespaces else ", ".join(namespace or [])
    released = failed = 0
    try:
        for outcome in release_all(ctx, None if all_namespaces else namespace, logger, dry_run=dry_run):
            typer.echo(outcome.line())
            released += outcome.ok
            failed += not outcome.ok
    except ApiError as exc:
        fail(f"cannot list the child jobs in {where}: {exc}")
    finally:
        ctx.api.close()
    verb = "would be released" if dry_run else "released"
    if not released and not failed:
        typer.echo(f"No child job in {where} carries the final-status finalizer: nothing to release.")
    else:
        typer.echo(f"{released} child job(s) {verb}, {failed} not.")
    if failed:
        raise typer.Exit(code=1)

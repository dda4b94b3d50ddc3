"""The chart's tests' helpers: the real helm binary, found, and cached renders of the chart (the `helm`
fixture is in tests/conftest.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "btj-operator"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
RELEASE = "btj"
NAMESPACE = "btj-system"
# The Kubernetes version the rendered objects are validated against (kubernetes-validate schemas).
KUBE_VERSION = "1.33.0"


def find_helm() -> str | None:
    """helm on PATH, else the copy scripts/bootstrap.sh fetches into .tools/."""
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    local = ROOT / ".tools" / "helm" / "helm"
    return str(local) if local.is_file() and os.access(local, os.X_OK) else None


# helm's cache, config and data homes: this process's own (parallel test workers, other people's runs).
HELM_HOME = Path(tempfile.mkdtemp(prefix="btj-helm-"))
atexit.register(shutil.rmtree, HELM_HOME, ignore_errors=True)


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with a clean, cluster-free environment (no kubeconfig needed for lint/template)."""
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(HELM_HOME / "cache"),
        "HELM_CONFIG_HOME": str(HELM_HOME / "config"),
        "HELM_DATA_HOME": str(HELM_HOME / "data"),
    }
    return subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# The one value the chart requires (the namespaces served; the README's install serves the examples'):
# a render that sets no scope of its own gets it, so that "the defaults" are the defaults an install uses.
TEAM = "hyperpod-ns-team-a"
SERVED = f"operator.watchNamespaces={{{TEAM}}}"
_SCOPE_KEYS = ("operator.watchNamespaces", "operator.clusterWide")


def _sets_scope(values: tuple[str, ...], sets: tuple[str, ...]) -> bool:
    """Whether a values file or a --set of the render says which namespaces the operator serves."""
    if any(item.startswith(_SCOPE_KEYS) for item in sets):
        return True
    for path in values:
        operator = (yaml.safe_load(Path(path).read_text()) or {}).get("operator") or {}
        if operator.get("watchNamespaces") or operator.get("clusterWide"):
            return True
    return False


@cache
def _render_text(helm: str, values: tuple[str, ...], sets: tuple[str, ...], release: str) -> str:
    args = ["template", release, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for path in values:
        args += ["-f", path]
    if not _sets_scope(values, sets):
        args += ["--set", SERVED]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    if result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def render(
    helm: str, values: Path | None = None, *, sets: tuple[str, ...] = (), release: str = RELEASE
) -> list[dict[str, Any]]:
    """The objects `helm template --include-crds` renders for a values file (None: the defaults), with
    `SERVED` unless the values or `sets` say which namespaces the operator serves."""
    text = _render_text(helm, (str(values),) if values else (), sets, release)
    # libyaml's loader: the render holds the CRD (160 KB), parsed afresh for each call (the objects are
    # the caller's to change); PyYAML's pure-Python loader took most of this area's time on it.
    return [doc for doc in yaml.load_all(text, Loader=SAFE_LOADER) if doc]


def values_id(path: Path | None) -> str:
    return "defaults" if path is None else path.name


VALUES_CASES: list[Path | None] = [None, *CI_VALUES]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]

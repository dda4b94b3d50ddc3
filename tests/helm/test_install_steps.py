"""The README's install steps work in the order written (issue 39): the chart, rendered with step 2's
`helm install` values, serves the namespace of every example step 4 applies."""

from __future__ import annotations

import re
import shlex

import yaml

from tests.support.helm import ROOT, by_kind, render

README = (ROOT / "README.md").read_text()
STEPS = README.split("## Install on a cluster", 1)[1].split("\n## ", 1)[0]


def _install_sets() -> tuple[str, ...]:
    """The `--set` values of the README's `helm install` (a placeholder registry filled in)."""
    command = next(
        block for block in re.findall(r"```bash\n(.*?)```", STEPS, re.S) if "helm install" in block
    )
    words = shlex.split(command.replace("\\\n", " ").replace("<registry>", "registry.example.com"))
    return tuple(words[i + 1] for i, word in enumerate(words) if word == "--set")


def _applied_namespaces() -> set[str]:
    """The namespaces of the manifests the README's steps `kubectl apply -f`."""
    paths = re.findall(r"kubectl apply -f (examples/\S+\.yaml)", STEPS)
    assert paths, "the install steps apply no example"
    return {
        str(doc["metadata"].get("namespace") or "default")
        for path in paths
        for doc in yaml.safe_load_all((ROOT / path).read_text())
        if doc
    }


def test_the_readme_install_serves_the_namespace_of_the_example_it_applies(helm: str) -> None:
    sets = _install_sets()
    objects = render(helm, sets=sets)
    served = {
        binding["metadata"]["namespace"]
        for binding in by_kind(objects, "RoleBinding")
        if binding["roleRef"]["kind"] == "Role" and not binding["metadata"]["name"].endswith("-calibration")
    }
    args = next(c for c in by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"])[
        "args"
    ]
    watched = {arg.removeprefix("--namespace=") for arg in args if arg.startswith("--namespace=")}
    for namespace in _applied_namespaces():
        assert namespace in served, f"the README's install grants no rights in {namespace}: {sorted(served)}"
        assert namespace in watched, f"the README's install does not watch {namespace}: {sorted(watched)}"

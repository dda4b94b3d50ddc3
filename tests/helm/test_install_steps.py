"""The README's install steps work in the order written (issue 39): the chart, rendered with step 2's
`helm install` values, serves the namespace of every example step 4 applies, and a BTJ applied to a
namespace no release serves draws a warning (the chart's ValidatingAdmissionPolicy) naming the fix."""

from __future__ import annotations

import copy
import re
import shlex
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.admission_policy import PolicyEvaluator
from tests.support.helm import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    ROOT,
    SERVED,
    by_kind,
    render,
    run_helm,
)
from tests.support.rbac import Request, allowed, operator_account

README = (ROOT / "README.md").read_text()
# The app.kubernetes.io/component of the served-namespace marker (its Role and RoleBinding in each namespace).
MARKER = "served-namespace"
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
        if binding["roleRef"]["kind"] == "Role"
        and not binding["metadata"]["name"].endswith("-calibration")
        and binding["metadata"]["labels"]["app.kubernetes.io/component"] != MARKER
    }
    args = next(c for c in by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"])[
        "args"
    ]
    watched = {arg.removeprefix("--namespace=") for arg in args if arg.startswith("--namespace=")}
    for namespace in _applied_namespaces():
        assert namespace in served, f"the README's install grants no rights in {namespace}: {sorted(served)}"
        assert namespace in watched, f"the README's install does not watch {namespace}: {sorted(watched)}"


def test_every_example_is_in_a_namespace_the_readme_install_serves(helm: str) -> None:
    # The README says step 2 serves "the namespace of the examples": every example, not only step 4's.
    objects = render(helm, sets=_install_sets())
    policy = _policy(objects)
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "BlackwellTrainingJob":
                namespace = doc["metadata"].get("namespace")
                assert not policy.failures(doc), f"{path.name}: {namespace} is unserved by the README"


# The namespace check: a BTJ in a namespace no release serves draws a warning at `kubectl apply`.


def _example_job(namespace: str) -> dict[str, Any]:
    """The README's example BlackwellTrainingJob, applied to `namespace`."""
    path = re.findall(r"kubectl apply -f (examples/\S+\.yaml)", STEPS)[0]
    job = copy.deepcopy(next(doc for doc in yaml.safe_load_all((ROOT / path).read_text()) if doc))
    job["metadata"]["namespace"] = namespace
    return dict(job)


def _policy(objects: list[dict[str, Any]], release: str = RELEASE) -> PolicyEvaluator:
    """The release's namespace check, its RBAC questions answered by every object in `objects`."""
    (policy,) = [
        p
        for p in by_kind(objects, "ValidatingAdmissionPolicy")
        if p["metadata"]["labels"]["app.kubernetes.io/instance"] == release
    ]
    return PolicyEvaluator(policy, objects)


def test_the_readme_install_warns_at_apply_about_a_namespace_it_does_not_serve(helm: str) -> None:
    sets = _install_sets()
    objects = render(helm, sets=sets)
    (policy,) = by_kind(objects, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    for obj in (policy, binding):
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    # A warning and an audit annotation, never a refusal (no Deny), and a check that cannot run lets it be.
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    assert policy["spec"]["failurePolicy"] == "Ignore"
    assert "matchResources" not in binding["spec"]  # every namespace: the expression decides
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["training.blackwell.dev"] and rule["resources"] == ["blackwelltrainingjobs"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}

    check = _policy(objects)
    for namespace in _applied_namespaces():
        assert check.failures(_example_job(namespace)) == []
        assert check.failures(_example_job(namespace), "UPDATE") == []
    (message,) = check.failures(_example_job("hyperpod-ns-team-b"))
    assert message.startswith("no BlackwellTrainingJob operator serves namespace hyperpod-ns-team-b: ")
    assert "\n" not in message  # the API server refuses a message with a line break

    # The command the warning gives serves the namespace (helm upgrade --reuse-values: the install's values,
    # then the new list), and keeps serving the README's.
    upgrade = re.search(r"helm upgrade (\S+) helm/btj-operator -n (\S+) --reuse-values --set (\S+)", message)
    assert upgrade, message
    assert (upgrade[1], upgrade[2]) == (RELEASE, NAMESPACE)
    after = render(helm, sets=(*sets, shlex.split(upgrade[3])[0]))
    for namespace in (*_applied_namespaces(), "hyperpod-ns-team-b"):
        assert _policy(after).failures(_example_job(namespace)) == []


def test_several_releases_warn_only_where_none_serves(helm: str) -> None:
    """One release per team: each release's check counts every release's namespaces as served (their
    markers), so neither warns about the other's; the markers leave with a release."""
    team_a = render(helm, sets=("operator.watchNamespaces={hyperpod-ns-team-a}",), release="team-a")
    team_b = render(helm, sets=("operator.watchNamespaces={hyperpod-ns-team-b}",), release="team-b")
    cluster = team_a + team_b
    for release in ("team-a", "team-b"):
        for namespace in ("hyperpod-ns-team-a", "hyperpod-ns-team-b"):
            assert _policy(cluster, release).failures(_example_job(namespace)) == [], (release, namespace)
        (message,) = _policy(cluster, release).failures(_example_job("hyperpod-ns-team-c"))
        assert f"helm upgrade {release} " in message
    # team-b uninstalled (its markers gone): team-a's check warns about team-b's namespace again.
    assert _policy(team_a, "team-a").failures(_example_job("hyperpod-ns-team-b"))


def test_the_marker_grants_nothing_and_names_no_real_account(helm: str) -> None:
    objects = render(helm, sets=("operator.watchNamespaces={hyperpod-ns-team-a,hyperpod-ns-team-b}",))
    markers = [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == MARKER]
    assert sorted((o["kind"], o["metadata"]["namespace"]) for o in markers) == [
        ("Role", "hyperpod-ns-team-a"),
        ("Role", "hyperpod-ns-team-b"),
        ("RoleBinding", "hyperpod-ns-team-a"),
        ("RoleBinding", "hyperpod-ns-team-b"),
    ]
    for marker in markers:
        if marker["kind"] == "Role":
            # `serve` is no verb any Kubernetes component authorizes: only the namespace check asks for it.
            assert marker["rules"] == [
                {
                    "apiGroups": ["training.blackwell.dev"],
                    "resources": ["blackwelltrainingjobs"],
                    "verbs": ["serve"],
                }
            ]
        else:
            assert marker["subjects"] == [
                {
                    "kind": "ServiceAccount",
                    "name": "btj-served-marker",
                    "namespace": marker["metadata"]["namespace"],
                }
            ]
    # The operator's own account gains nothing from it, and no ServiceAccount of that name is created.
    account = operator_account(objects)
    assert not allowed(
        objects,
        account,
        Request("training.blackwell.dev", "blackwelltrainingjobs", "serve", "hyperpod-ns-team-a"),
    )
    assert not [o for o in by_kind(objects, "ServiceAccount") if o["metadata"]["name"] == "btj-served-marker"]


@pytest.mark.parametrize(
    ("args", "policy", "markers"),
    [
        (("--set", "operator.clusterWide=true"), False, False),  # every namespace but the excluded is served
        (("--kube-version", "1.29.9"), False, True),  # no ValidatingAdmissionPolicy before 1.30
        (("--set", "unservedNamespaceWarning.enabled=false"), False, True),  # others' checks still see it
        (("--set", "rbac.create=false"), True, False),
        ((), True, True),
    ],
    ids=["cluster-wide", "kubernetes-1.29", "disabled", "no-rbac", "defaults"],
)
def test_what_the_check_renders(helm: str, args: tuple[str, ...], policy: bool, markers: bool) -> None:
    scope = () if "operator.clusterWide=true" in args else ("--set", SERVED)
    result = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, *scope, *args)
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    assert bool(by_kind(objects, "ValidatingAdmissionPolicy")) == policy
    assert bool(by_kind(objects, "ValidatingAdmissionPolicyBinding")) == policy
    found = [
        o for o in objects if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == MARKER
    ]
    assert bool(found) == markers
    if policy:
        # Without the markers (rbac.create=false) the listed namespace still counts as served; the
        # operator's own namespace serves no jobs (issue 36), so a job there is warned about.
        check = _policy(objects)
        assert check.failures(_example_job("hyperpod-ns-team-a")) == []
        assert check.failures(_example_job(NAMESPACE))

"""Every rendered trainer pod, of every backend, is admitted at Pod Security `restricted` (docs/security.md).

The rules are the upstream admission's (tests/pod_security.py, docs/reference/pod-security-standards.md);
each one is also shown to catch what it forbids, on a rendered pod, so that none of them cannot fail.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from blackwell_operator.errors import PlanningError
from blackwell_operator.models import BlackwellTrainingJobSpec
from blackwell_operator.models.spec import Backend
from blackwell_operator.render import render_children
from blackwell_operator.render.hyperpod import KIND as HYPERPOD_KIND
from blackwell_operator.render.pytorchjob import KIND as PYTORCHJOB_KIND
from blackwell_operator.render.trainjob import RUNTIME_KIND
from tests.pod_security import RESTRICTED, violations
from tests.support.crd_manifests import good_manifests
from tests.support.golden_plans import CASES as GOLDEN_CASES
from tests.support.golden_plans import case_id
from tests.support.plans import plan_for
from tests.support.specs import make_spec

NAMESPACE = "hyperpod-ns-team-a"
BACKENDS = (Backend.PYTORCH_JOB, Backend.HYPERPOD_PYTORCH_JOB, Backend.TRAIN_JOB)


def pod_templates(child: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pod templates one child carries, wherever its kind keeps them."""
    spec = child.get("spec", {})
    if child["kind"] == PYTORCHJOB_KIND:
        yield from (replica["template"] for replica in spec["pytorchReplicaSpecs"].values())
    elif child["kind"] == HYPERPOD_KIND:
        yield from (replica["template"] for replica in spec["replicaSpecs"])
    elif child["kind"] == RUNTIME_KIND:
        for job in spec["template"]["spec"]["replicatedJobs"]:
            yield job["template"]["spec"]["template"]


def rendered_pods(name: str, spec: BlackwellTrainingJobSpec, backend: Backend) -> list[dict[str, Any]]:
    spec = spec.model_copy(update={"backend": backend})
    children = render_children(name, NAMESPACE, spec, plan_for(spec, name))
    pods = [template for child in children for template in pod_templates(child)]
    assert pods, f"no pod template found in {[c['kind'] for c in children]}"
    return pods


def example_specs() -> dict[str, tuple[str, BlackwellTrainingJobSpec]]:
    from blackwell_operator.models import BlackwellTrainingJob

    parsed = {}
    for case, manifest in good_manifests().items():
        job = BlackwellTrainingJob.model_validate(manifest)
        parsed[case] = (job.metadata.name, job.spec)
    return parsed


EXAMPLES = example_specs()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
@pytest.mark.parametrize("case", sorted(EXAMPLES))
def test_every_example_is_admitted_at_restricted(case: str, backend: Backend) -> None:
    name, spec = EXAMPLES[case]
    for pod in rendered_pods(name, spec, backend):
        assert violations(pod) == []


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
@pytest.mark.parametrize("case", sorted(EXAMPLES))
def test_no_trainer_pod_mounts_an_api_token(case: str, backend: Backend) -> None:
    """The trainer never calls the Kubernetes API (issue 36): whatever its ServiceAccount may do, its pods
    hold no token for it. IRSA's and Pod Identity's own projected tokens are not this one."""
    name, spec = EXAMPLES[case]
    for pod in rendered_pods(name, spec, backend):
        assert pod["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_every_golden_case_is_admitted_at_restricted(backend: Backend) -> None:
    admitted = 0
    for case in GOLDEN_CASES:
        spec = make_spec(*case)
        try:
            pods = rendered_pods("golden", spec, backend)
        except PlanningError:
            continue  # the golden record of this case is a planning error: nothing is rendered
        for pod in pods:
            assert violations(pod) == [], case_id(*case)
        admitted += 1
    assert admitted >= len(GOLDEN_CASES) // 2


def test_a_job_with_volumes_secrets_and_tolerations_is_admitted() -> None:
    """What users add (claims, pull secrets, a ServiceAccount, tolerations, pod labels) keeps the level."""
    spec = BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": "llama3.1-8b"},
            "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 2},
            "volumes": [
                {"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"},
                {"name": "data", "claimName": "data", "mountPath": "/data", "readOnly": True},
            ],
            "serviceAccountName": "trainer",
            "imagePullSecrets": [{"name": "regcred"}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "podLabels": {"team": "a"},
        }
    )
    for backend in BACKENDS:
        for pod in rendered_pods("job", spec, backend):
            assert violations(pod) == []


def test_no_node_path_is_mounted_and_scratch_is_the_pods_own() -> None:
    (pod, *_) = rendered_pods("job", make_spec(), Backend.PYTORCH_JOB)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["shm"] == {"name": "shm", "emptyDir": {"medium": "Memory"}}
    # Bounded (issue 24: tests/render/test_local_storage.py), but still an emptyDir on the node's disk.
    assert volumes["local"]["emptyDir"].keys() == {"sizeLimit"}
    assert not [v for v in volumes.values() if "hostPath" in v]
    context = pod["spec"]["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] > 0 and context["runAsGroup"] > 0


# Each rule catches what it forbids: a rendered pod, changed in one place, fails exactly that check.
Mutation = Callable[[dict[str, Any]], None]


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def _set(path: str, value: Any) -> Mutation:
    """A mutation that sets spec.<path> (or container.<path>), creating the maps on the way."""

    def apply(pod: dict[str, Any]) -> None:
        where, _, rest = path.partition(":")
        node = _container(pod) if where == "container" else pod["spec"]
        *parents, leaf = rest.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return apply


def _drop(path: str) -> Mutation:
    def apply(pod: dict[str, Any]) -> None:
        where, _, rest = path.partition(":")
        node = _container(pod) if where == "container" else pod["spec"]
        *parents, leaf = rest.split(".")
        for key in parents:
            node = node[key]
        node.pop(leaf)

    return apply


def _volume(source: dict[str, Any]) -> Mutation:
    def apply(pod: dict[str, Any]) -> None:
        pod["spec"]["volumes"].append({"name": "extra", **source})

    return apply


def _both(*mutations: Mutation) -> Mutation:
    def apply(pod: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(pod)

    return apply


def _annotate(key: str, value: str) -> Mutation:
    def apply(pod: dict[str, Any]) -> None:
        pod["metadata"]["annotations"][key] = value

    return apply


ATTACKS: dict[str, tuple[Mutation, set[str]]] = {
    # The render before issue 24: the node's NVMe and /dev/shm as hostPath.
    "node NVMe as hostPath": (
        _volume({"hostPath": {"path": "/mnt/k8s-disks/0", "type": "DirectoryOrCreate"}}),
        {"hostPathVolumes", "restrictedVolumes"},
    ),
    "nfs volume": (_volume({"nfs": {"server": "fs", "path": "/"}}), {"restrictedVolumes"}),
    "host network": (_set("pod:hostNetwork", True), {"hostNamespaces"}),
    "host PID": (_set("pod:hostPID", True), {"hostNamespaces"}),
    "privileged container": (_set("container:securityContext.privileged", True), {"privileged"}),
    "SYS_ADMIN added": (
        _set("container:securityContext.capabilities.add", ["SYS_ADMIN"]),
        {"capabilities_baseline", "capabilities_restricted"},
    ),
    "IPC_LOCK added (EFA's old habit)": (
        _set("container:securityContext.capabilities.add", ["IPC_LOCK"]),
        {"capabilities_baseline", "capabilities_restricted"},
    ),
    "CHOWN added": (
        _set("container:securityContext.capabilities.add", ["CHOWN"]),
        {"capabilities_restricted"},
    ),
    "capabilities kept": (_drop("container:securityContext.capabilities"), {"capabilities_restricted"}),
    "host port": (_set("container:ports", [{"containerPort": 9400, "hostPort": 9400}]), {"hostPorts"}),
    "probe to another host": (
        _set("container:livenessProbe", {"httpGet": {"host": "10.0.0.1", "port": 80}}),
        {"hostProbesAndHostLifecycle"},
    ),
    "AppArmor unconfined": (
        _set("pod:securityContext.appArmorProfile", {"type": "Unconfined"}),
        {"appArmorProfile"},
    ),
    "AppArmor annotation unconfined": (
        _annotate("container.apparmor.security.beta.kubernetes.io/pytorch", "unconfined"),
        {"appArmorProfile"},
    ),
    "SELinux spc_t": (_set("pod:securityContext.seLinuxOptions", {"type": "spc_t"}), {"seLinuxOptions"}),
    "unmasked /proc": (
        _set("container:securityContext.procMount", "Unmasked"),
        {"procMount_baseline", "procMount_restricted"},
    ),
    "seccomp unconfined": (
        _set("pod:securityContext.seccompProfile", {"type": "Unconfined"}),
        {"seccompProfile_baseline", "seccompProfile_restricted"},
    ),
    "no seccomp anywhere": (
        _both(_drop("pod:securityContext.seccompProfile"), _drop("container:securityContext.seccompProfile")),
        {"seccompProfile_restricted"},
    ),
    "unsafe sysctl": (
        _set("pod:securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
        {"sysctls"},
    ),
    "privilege escalation": (
        _set("container:securityContext.allowPrivilegeEscalation", True),
        {"allowPrivilegeEscalation"},
    ),
    "escalation left unset": (
        _drop("container:securityContext.allowPrivilegeEscalation"),
        {"allowPrivilegeEscalation"},
    ),
    "root allowed": (
        _both(_drop("pod:securityContext.runAsNonRoot"), _drop("container:securityContext.runAsNonRoot")),
        {"runAsNonRoot"},
    ),
    "runs as root": (_set("pod:securityContext.runAsUser", 0), {"runAsUser"}),
    "Windows host process": (
        _set("pod:securityContext.windowsOptions", {"hostProcess": True}),
        {"windowsHostProcess"},
    ),
}


def test_every_restricted_check_is_exercised() -> None:
    exercised = set().union(*(checks for _, checks in ATTACKS.values()))
    assert exercised | {"procMount_baseline", "seccompProfile_baseline"} >= set(RESTRICTED)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_rule_refuses_what_it_forbids(attack: str) -> None:
    mutate, expected = ATTACKS[attack]
    (pod, *_) = rendered_pods("job", make_spec(), Backend.PYTORCH_JOB)
    pod = copy.deepcopy(pod)
    mutate(pod)
    restricted = {line.split(":", 1)[0] for line in violations(pod)}
    baseline = {line.split(":", 1)[0] for line in violations(pod, "baseline")}
    assert restricted | baseline == expected, violations(pod)

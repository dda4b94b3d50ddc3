"""Was a pod made from its job: created no earlier than the objects above it, from the job's current pod
template (pure).

A controller reference with the right uid proves little in the namespace it lives in: anyone who may create
pods there can copy it (docs/security.md "Pods someone else creates"). What a controller cannot help doing
is narrower, and it is what this checks (docs/reference/pod-ownership.md "What the pod must also show"):

- it creates a pod after the object it creates it for, so the pod's creationTimestamp is not earlier than
  any object on its owner chain (the API server writes it at create, with one-second resolution: equal
  counts). A pod made earlier and re-parented later by a metadata patch fails this.
- it copies the trainer container's name, image, command and args from the job's pod template unchanged,
  and keeps the template's labels (it only adds its own). Sources: kubeflow/training-operator,
  pkg/controller.v1/common/pod.go `createNewPod` (`spec.Template.DeepCopy()`, then only labels added,
  env and restartPolicy set, an optional schedulerName); the Kubernetes Job controller's
  `GetPodFromTemplate` (pkg/controller/controller_utils.go: the template's spec deep-copied); kubeflow/
  trainer, pkg/runtime/framework/plugins/jobset/builder.go `Trainer` (the `node` container's image,
  command and args replaced only by those the TrainJob's spec.trainer sets). The HyperPod training
  operator's source is not public: it is taken to copy them as the Kubeflow operator it derives from does.
  Env, resources, ports and volumes are not compared: the controllers add to env, and admission webhooks
  (device plugins, sidecar injectors) add to the rest.

A pod that copies all of it and is created after the job is indistinguishable from the controller's, and
is accepted: only RBAC closes that (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from blackwell_operator.render import hyperpod, pytorchjob, trainjob
from blackwell_operator.render.labels import own_labels
from blackwell_operator.render.pod import TRAINJOB_CONTAINER_NAME
from blackwell_operator.timefmt import rfc3339_seconds

# The trainer container's fields every controller copies unchanged (see the module docstring).
COPIED_FIELDS = ("image", "command", "args")
# The label keys the operator puts on every pod template (render/labels.own_labels); the controllers add
# their own keys beside them and never rewrite these.
OWN_LABEL_KEYS = tuple(own_labels(""))


def created_after(pod: Mapping[str, Any], above: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the pod was created at or after every object of `above` (its owner chain). A pod or an
    object without a readable creationTimestamp proves nothing and fails (the API server always writes
    one)."""
    made = rfc3339_seconds((pod.get("metadata") or {}).get("creationTimestamp"))
    if made is None:
        return False
    for obj in above:
        then = rfc3339_seconds((obj.get("metadata") or {}).get("creationTimestamp"))
        if then is None or made < then:
            return False
    return True


def job_templates(
    job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
) -> list[Mapping[str, Any]]:
    """The pod templates a job kind of ours makes its pods from: a PyTorchJob's replica templates, a
    HyperPodPyTorchJob's, a TrainJob's TrainingRuntime's replicated Jobs' (`runtime`, with the
    TrainJob's own spec.trainer image, command and args over its `node` container, as Trainer v2 does)."""
    spec = job.get("spec") or {}
    kind = job.get("kind")
    if kind == pytorchjob.KIND:
        replicas = (spec.get("pytorchReplicaSpecs") or {}).values()
        return [_template(r) for r in replicas if isinstance(r, Mapping) and _template(r)]
    if kind == hyperpod.KIND:
        return [
            _template(r) for r in spec.get("replicaSpecs") or [] if isinstance(r, Mapping) and _template(r)
        ]
    if kind == trainjob.KIND and runtime is not None:
        jobset = (((runtime.get("spec") or {}).get("template") or {}).get("spec")) or {}
        found = []
        for replicated in jobset.get("replicatedJobs") or []:
            template = ((replicated.get("template") or {}).get("spec") or {}).get("template")
            if isinstance(template, Mapping):
                found.append(_trainer_overrides(template, spec.get("trainer") or {}))
        return found
    return []


def _template(replica: Mapping[str, Any]) -> Mapping[str, Any]:
    template = replica.get("template")
    return template if isinstance(template, Mapping) else {}


def _trainer_overrides(template: Mapping[str, Any], trainer: Mapping[str, Any]) -> Mapping[str, Any]:
    """The template as Trainer v2 applies a TrainJob's spec.trainer to it (only the fields compared)."""
    overrides = {key: trainer[key] for key in COPIED_FIELDS if trainer.get(key) is not None}
    if not overrides:
        return template
    spec = template.get("spec") or {}
    containers = [
        {**c, **overrides} if c.get("name") == TRAINJOB_CONTAINER_NAME else c
        for c in spec.get("containers") or []
    ]
    return {**template, "spec": {**spec, "containers": containers}}


def made_from(pod: Mapping[str, Any], templates: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the pod carries what its controller copies from one of the job's templates: each of the
    template's containers by name with the same image, command and args, and the operator's labels."""
    return any(_copies(pod, template) for template in templates)


def _copies(pod: Mapping[str, Any], template: Mapping[str, Any]) -> bool:
    wanted = (template.get("spec") or {}).get("containers") or []
    if not wanted:
        return False
    have = {
        c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, Mapping)
    }
    for container in wanted:
        mine = have.get(container.get("name"))
        # An absent list and an empty one are the same to the API server (it drops the empty one).
        if mine is None or not _same_image(mine.get("image"), container.get("image")):
            return False
        if any((mine.get(f) or None) != (container.get(f) or None) for f in COPIED_FIELDS if f != "image"):
            return False
    labels = (template.get("metadata") or {}).get("labels") or {}
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(pod_labels.get(key) == labels[key] for key in OWN_LABEL_KEYS if key in labels)


# Docker Hub's default registry and namespace, which a runtime (and some webhooks) spell out in full.
_HUB_PREFIXES = ("docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/")


def _same_image(pod_image: object, template_image: object) -> bool:
    """Whether the pod runs the template's image, as admission may have rewritten it without changing it.

    Image-signature policies (Kyverno's verifyImages with mutateDigest, the default; sigstore's
    policy-controller) pin a tag to the digest it resolved to, `repo:tag` becoming `repo:tag@sha256:...`
    or `repo@sha256:...`: the same image, so a digest the template did not name is not compared. Docker Hub
    names are compared in full (`busybox` is `docker.io/library/busybox`). A webhook that moves the image to
    another registry (a pull-through mirror) changes the name, and those pods' results are ignored
    (docs/security.md)."""
    if not isinstance(pod_image, str) or not isinstance(template_image, str):
        return pod_image == template_image
    pod_name, pod_tag, pod_digest = _image_parts(pod_image)
    name, tag, digest = _image_parts(template_image)
    if pod_name != name:
        return False
    if digest is not None:
        return pod_digest == digest
    # A pinned pod image may keep its tag (`repo:tag@sha256:...`) or drop it (`repo@sha256:...`).
    return pod_tag == tag or (pod_tag is None and pod_digest is not None)


def _image_parts(image: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of an image reference; the repository with Docker Hub's prefix added
    where the reference leaves it out, and `latest` where it names neither tag nor digest."""
    rest, _, digest = image.partition("@")
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    name, tag = (rest[:colon], rest[colon + 1 :]) if colon > slash else (rest, None)
    if tag is None and not digest:
        tag = "latest"
    first = name.split("/", 1)[0]
    if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
        name = "docker.io/" + (name if "/" in name else "library/" + name)
    name = name.replace("index.docker.io/", "docker.io/", 1)
    return name, tag, digest or None

"""The BlackwellTrainingJob CustomResourceDefinition, generated from the pydantic models (`btj crd`)."""

from __future__ import annotations

from typing import Any

from blackwell_operator.applabels import NAME_LABEL, OPERATOR_APP_NAME
from blackwell_operator.models.pod import (
    LABEL_VALUE,
    MAX_KEY,
    QUALIFIED_KEY,
    QUALIFIED_PREFIX_LENGTH,
    RESERVED_ANNOTATIONS,
    RESERVED_LABELS,
    RESERVED_PREFIX,
)
from blackwell_operator.models.spec import (
    API_GROUP,
    API_VERSION,
    AUTO_RESUME_TRAINJOB,
    DEFAULT_SEQUENCE_LENGTH,
    ELASTIC_NEEDS_CHECKPOINT,
    ELASTIC_NEEDS_GLOBAL_BATCH,
    ELASTIC_RANGE,
    ELASTIC_WHOLE_SEQUENCES,
    KIND,
    OPERATOR_VOLUMES,
    PLURAL,
    TOPOLOGY_NEEDS_QUEUE,
    BlackwellTrainingJobSpec,
)
from blackwell_operator.models.status import BlackwellTrainingJobStatus
from blackwell_operator.render.names import DNS1035_PATTERN, MAX_NAME_LENGTH
from blackwell_operator.render.schema import PRESERVE_UNKNOWN, VALIDATIONS, Schema, ordered, to_structural
from blackwell_operator.render.yamlio import dump_yaml

SINGULAR = KIND.lower()
SHORT_NAMES = ["btj"]
CATEGORIES = ["ml"]

ROOT_RULES = [
    {
        "rule": f"self.metadata.name.matches('{DNS1035_PATTERN}')",
        "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
        "with a letter): the child PyTorchJob takes the same name",
    },
    {
        "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters: the training operator "
        "names Services <name>-worker-<index>, which must fit 63",
    },
]


def _immutable(field: str, why: str) -> dict[str, str]:
    return {"rule": "self == oldSelf", "message": f"{field} is immutable: {why}"}


_NEW_JOB = "create a new BlackwellTrainingJob instead"

# Rules guard optional fields with has(): the API server may evaluate them on a default value before
# the nested defaults are filled in.
# Cross-field rules the models check in Python, restated in CEL so the API server rejects the same
# specs at admission; and fields that must not change after creation (rules with oldSelf run on update).
SPEC_RULES: dict[str, list[dict[str, str]]] = {
    "model": [
        {
            # Weights alone pass admission: the operator, which reads no checkpoint, then reports the
            # spec Invalid with the fix (`btj plan` prints the model a readable config.json describes).
            "rule": "!(has(self.preset) && has(self.architecture)) "
            "&& (has(self.preset) || has(self.architecture) || has(self.weights))",
            "message": "set exactly one of spec.model.preset or spec.model.architecture",
        },
        _immutable("spec.model", _NEW_JOB),
    ],
    "model.architecture": [
        {
            "rule": "self.numAttentionHeads % self.numKeyValueHeads == 0",
            "message": "spec.model.architecture.numAttentionHeads must be a multiple of numKeyValueHeads",
        },
        {
            "rule": "has(self.headDim) || self.hiddenSize % self.numAttentionHeads == 0",
            "message": "spec.model.architecture.hiddenSize must be divisible by numAttentionHeads, "
            "or set headDim",
        },
    ],
    "cluster": [
        {
            "rule": "!has(self.gpusPerNode) || self.gpusPerNode <= 8",
            "message": "spec.cluster.gpusPerNode must be at most 8: every supported instance has 8 GPUs",
        },
        {
            "rule": "!has(self.elastic) || (self.elastic.minNodes <= (has(self.nodes) ? self.nodes : 1) "
            "&& (has(self.nodes) ? self.nodes : 1) <= self.elastic.maxNodes)",
            "message": ELASTIC_RANGE,
        },
    ],
    "cluster.elastic": [
        {
            "rule": "self.minNodes <= self.maxNodes",
            "message": "spec.cluster.elastic.minNodes must be at most maxNodes",
        }
    ],
    "cluster.instanceType": [_immutable("spec.cluster.instanceType", _NEW_JOB)],
    "backend": [_immutable("spec.backend", _NEW_JOB)],
    "training.dataset": [
        {
            "rule": "!has(self.kind) || self.kind != 'shards' || (has(self.uri) && size(self.uri) > 0)",
            "message": "spec.training.dataset.uri is required when spec.training.dataset.kind is shards",
        }
    ],
    "tolerations[]": [
        {
            "rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) "
            "|| size(self.value) == 0",
            "message": "a toleration with operator Exists must not set a value",
        },
        {
            "rule": "(has(self.key) && size(self.key) > 0) "
            "|| (has(self.operator) && self.operator == 'Exists')",
            "message": "a toleration without a key must use operator Exists",
        },
        {
            # Pod validation: only NoExecute evicts, so only it has a delay (docs/reference/pod-validation.md)
            "rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "message": "a toleration with tolerationSeconds must have effect NoExecute",
        },
    ],
}

_OWN_NAMES = ", ".join(f"'{name}'" for name in OPERATOR_VOLUMES)
_OWN_PATHS = ", ".join(f"'{path}'" for path in OPERATOR_VOLUMES.values())
_OWN_PATHS_TEXT = ", ".join(OPERATOR_VOLUMES.values())
SPEC_RULES["volumes"] = [
    {
        "rule": "self.all(a, self.all(b, a.name == b.name "
        "|| (a.mountPath != b.mountPath && !a.mountPath.startsWith(b.mountPath + '/'))))",
        "message": "spec.volumes[*].mountPath must be unique and none may lie inside another: mount "
        "volumes side by side, e.g. /fsx and /datasets",
    }
]
SPEC_RULES["volumes[]"] = [
    {
        "rule": f"!(self.name in [{_OWN_NAMES}])",
        "message": f"spec.volumes[*].name must not be {', '.join(OPERATOR_VOLUMES)}: the operator's own "
        "volumes have those names",
    },
    {
        "rule": f"![{_OWN_PATHS}].exists(p, self.mountPath == p || self.mountPath.startsWith(p + '/') "
        "|| p.startsWith(self.mountPath + '/'))",
        "message": f"spec.volumes[*].mountPath must not be {_OWN_PATHS_TEXT}, nor inside or above them: "
        "the operator mounts the plan, shared memory and the node's NVMe there",
    },
]


def _on_a_volume(path: str, writable: bool) -> str:
    """CEL: `path` lies at or under a spec.volumes mountPath (and it is not readOnly), without `..`."""
    read_write = "!(has(v.readOnly) && v.readOnly) && " if writable else ""
    return (
        f"(!{path}.matches('(^|/)[.][.](/|$)') && has(self.volumes) && self.volumes.exists(v, "
        f"{read_write}({path} == v.mountPath || {path}.startsWith(v.mountPath + '/'))))"
    )


def _weights_folder(uri: str, writable: bool) -> str:
    """CEL: a weights URI is an s3:// prefix or on a volume (writable for the export). Not /local: the pod's
    own scratch starts empty and goes with the pod (docs/security.md)."""
    return f"{uri}.startsWith('s3://') || {_on_a_volume(uri, writable=writable)}"


# The most nodes the job may span: an elastic job's maxNodes, else spec.cluster.nodes.
_NODES = (
    "(has(self.cluster) && has(self.cluster.elastic) ? self.cluster.elastic.maxNodes "
    ": (has(self.cluster) && has(self.cluster.nodes) ? self.cluster.nodes : 1))"
)
_ELASTIC = "has(self.cluster) && has(self.cluster.elastic)"
_SEQUENCE = f"(has(self.training.sequenceLength) ? self.training.sequenceLength : {DEFAULT_SEQUENCE_LENGTH})"
_CHECKPOINT = "self.training.checkpoint.path"
_START_FROM = "self.training.checkpoint.startFrom"
_HAS_START_FROM = f"has(self.training) && has(self.training.checkpoint) && has({_START_FROM})"
_DATASET = "self.training.dataset"
_LOCAL = OPERATOR_VOLUMES["local"]
_FSX = "{name: fsx, claimName: fsx-claim, mountPath: /fsx}"
_WEIGHTS = "self.model.weights.uri"
_OUTPUT = "self.training.output.uri"

# Storage rules across spec sections (planner/storage.py states them in Python for `btj plan` and the
# operator): a checkpoint and a multi-node job's local shards must be where every pod can reach them.
SPEC_ROOT_RULES = [
    {
        "rule": f"!({_ELASTIC}) || (has(self.training) && has(self.training.globalBatchTokens))",
        "message": ELASTIC_NEEDS_GLOBAL_BATCH,
    },
    {
        "rule": f"!({_ELASTIC}) || !has(self.training) || !has(self.training.globalBatchTokens) "
        f"|| self.training.globalBatchTokens % {_SEQUENCE} == 0",
        "message": ELASTIC_WHOLE_SEQUENCES,
    },
    {
        "rule": f"!({_ELASTIC}) || (has(self.training) && has(self.training.checkpoint) "
        "&& has(self.training.checkpoint.path))",
        "message": ELASTIC_NEEDS_CHECKPOINT,
    },
    {
        "rule": "!has(self.cluster) || !has(self.cluster.topology) "
        "|| (has(self.queueName) && size(self.queueName) > 0)",
        "message": TOPOLOGY_NEEDS_QUEUE,
    },
    {
        "rule": "!has(self.autoResume) || !self.autoResume || !has(self.backend) "
        "|| self.backend != 'TrainJob'",
        "message": AUTO_RESUME_TRAINJOB,
    },
    {
        "rule": f"!has(self.training) || !has(self.training.checkpoint) || !has({_CHECKPOINT}) "
        f"|| size({_CHECKPOINT}) == 0 || {_on_a_volume(_CHECKPOINT, writable=True)} "
        f"|| ({_NODES} <= 1 && !{_CHECKPOINT}.matches('(^|/)[.][.](/|$)') "
        f"&& ({_CHECKPOINT} == '{_LOCAL}' || {_CHECKPOINT}.startsWith('{_LOCAL}/')))",
        "message": "spec.training.checkpoint.path must lie under the mountPath of a spec.volumes entry "
        f"that is not readOnly (shared storage, e.g. {_FSX}), or under {_LOCAL} (the pod's node-local "
        "scratch, kept across container restarts) for a single node: elsewhere the checkpoint is in the "
        "container, lost on restart, and ranks on other nodes cannot write it",
    },
    {
        "rule": f"!({_HAS_START_FROM}) || {_on_a_volume(_START_FROM, writable=False)}",
        "message": "spec.training.checkpoint.startFrom must lie under the mountPath of a spec.volumes entry "
        f"(the shared storage the other job saved to, e.g. {_FSX}; readOnly: true is fine)",
    },
    {
        "rule": f"!({_HAS_START_FROM}) || !has({_CHECKPOINT}) || ({_START_FROM} != {_CHECKPOINT} "
        f"&& {_START_FROM} + '/' != {_CHECKPOINT} && {_START_FROM} != {_CHECKPOINT} + '/')",
        "message": "spec.training.checkpoint.startFrom must not be spec.training.checkpoint.path: the job "
        "would save over the checkpoints it starts from; give it a checkpoint.path of its own",
    },
    {
        "rule": f"!has(self.training) || !has({_DATASET}) || !has({_DATASET}.kind) "
        f"|| {_DATASET}.kind != 'shards' || !has({_DATASET}.uri) || size({_DATASET}.uri) == 0 "
        f"|| {_DATASET}.uri.startsWith('s3://') || {_NODES} <= 1 "
        f"|| {_on_a_volume(_DATASET + '.uri', writable=False)}",
        "message": "spec.training.dataset.uri must be an s3:// prefix or lie under the mountPath of a "
        f"spec.volumes entry (e.g. {_FSX}) when the job has more than one node: every node reads the "
        "shards",
    },
    {
        "rule": f"!has(self.model.weights) || {_weights_folder(_WEIGHTS, writable=False)}",
        "message": "spec.model.weights.uri must be an s3:// prefix or lie under the mountPath of a "
        f"spec.volumes entry (e.g. {_FSX}): elsewhere it is the container's own file system or the pod's "
        f"scratch {_LOCAL}, which start empty and hold no checkpoint",
    },
    {
        "rule": f"!has(self.training) || !has(self.training.output) "
        f"|| {_weights_folder(_OUTPUT, writable=True)}",
        "message": "spec.training.output.uri must be an s3:// prefix or lie under the mountPath of a "
        f"spec.volumes entry that is not readOnly (e.g. {_FSX}): elsewhere (the container, or the pod's "
        f"scratch {_LOCAL}) the trained weights vanish with the pod",
    },
    {
        "rule": f"!has(self.model.weights) || !has(self.training) || !has(self.training.output) "
        f"|| {_OUTPUT} != {_WEIGHTS}",
        "message": "spec.training.output.uri must not be spec.model.weights.uri: the export would overwrite "
        "the initial weights",
    },
]


def _pod_metadata_rules(field: str, reserved: tuple[str, ...]) -> list[dict[str, str]]:
    """CEL for the keys of spec.podLabels / podAnnotations, as models/pod.py checks them."""
    names = ", ".join(f"'{key}'" for key in reserved)
    return [
        {
            "rule": f"self.all(k, size(k) <= {MAX_KEY} && k.matches('{QUALIFIED_KEY}') "
            f"&& (!k.contains('/') || k.matches('{QUALIFIED_PREFIX_LENGTH}')))",
            "message": f"spec.{field} keys must be qualified names: an optional DNS prefix and '/', then up "
            "to 63 letters, digits, '-', '_' or '.' starting and ending with a letter or digit",
        },
        {
            "rule": f"!self.exists(k, k.startsWith('{RESERVED_PREFIX}') || k in [{names}])",
            "message": f"spec.{field} must not set {', '.join(reserved)} nor {RESERVED_PREFIX}* keys: the "
            "operator sets them on every trainer pod itself",
        },
    ]


SPEC_RULES["podLabels"] = _pod_metadata_rules("podLabels", RESERVED_LABELS)
SPEC_RULES["podAnnotations"] = _pod_metadata_rules("podAnnotations", RESERVED_ANNOTATIONS)


# Admission-only bounds: strings and lists need a size bound so the API server can cost the CEL rules,
# and names that become label values must be valid label values.
SPEC_EXTRAS: dict[str, Schema] = {
    "model.preset": {"maxLength": 64},
    "image": {"maxLength": 1024},
    "queueName": {"maxLength": 63, "pattern": LABEL_VALUE},
    "priorityClass": {"maxLength": 63, "pattern": LABEL_VALUE},
    "training.dataset.uri": {"maxLength": 4096},
    "training.checkpoint.path": {"maxLength": 4096},
    "training.checkpoint.startFrom": {"maxLength": 4096},
    "env": {"maxItems": 128, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    "env[].name": {"maxLength": 256},
    "env[].value": {"maxLength": 32768},
    "tolerations": {"maxItems": 64, "x-kubernetes-list-type": "atomic"},
    "tolerations[].key": {"maxLength": 316, "pattern": QUALIFIED_KEY},
    "tolerations[].value": {"maxLength": 63, "pattern": LABEL_VALUE},
    "volumes": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    "imagePullSecrets": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
}

STATUS_EXTRAS: dict[str, Schema] = {
    # A newer operator may write plan fields this CRD does not list yet: keep them, never prune them
    # (the listed ones still validate and document themselves for `kubectl explain`).
    "plan": {PRESERVE_UNKNOWN: True},
    "conditions": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    "conditions[].message": {"maxLength": 32768},
    "conditions[].lastTransitionTime": {"format": "date-time"},
    "observedGeneration": {"format": "int64"},
    "lastFailure.finishedAt": {"format": "date-time"},
}


def printer_columns() -> list[dict[str, Any]]:
    """`kubectl get btj` columns; priority 1 ones appear with -o wide."""

    def column(name: str, kind: str, path: str, description: str, priority: int = 0) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path, "description": description}
        if priority:
            entry["priority"] = priority
        return entry

    return [
        column("Phase", "string", ".status.phase", "Lifecycle phase."),
        column("Model", "string", ".spec.model.preset", "Model preset (empty for a custom architecture)."),
        column("Instance", "string", ".spec.cluster.instanceType", "HyperPod instance type."),
        column(
            "Nodes",
            "integer",
            ".status.nodes",
            "Nodes of the current plan (an elastic job's count may differ from spec.cluster.nodes).",
        ),
        column("Precision", "string", ".status.precision", "Chosen precision."),
        column("MBS", "integer", ".status.microBatchSize", "Chosen micro-batch size."),
        column("AC", "string", ".status.activationCheckpointing", "Chosen activation checkpointing."),
        column("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
        column(
            "Tok/s/GPU",
            "number",
            ".status.predictedTokensPerSecondPerGpu",
            "Predicted training tokens/s per GPU of what the job trains (a probe's winner's once known).",
            1,
        ),
        column("MFU", "number", ".status.predictedModelFlopsUtilization", "Predicted MFU.", 1),
        column(
            "Measured", "number", ".status.measured.tokensPerSecondPerGpu", "Measured tokens/s per GPU.", 1
        ),
        column("Step", "integer", ".status.progress.step", "Last completed optimizer step.", 1),
        column("Progress", "number", ".status.progress.percent", "Steps done, in percent.", 1),
        column("Left", "string", ".status.progress.remaining", "Time left at the measured step time.", 1),
        column("Child", "string", ".status.child.name", "The child job.", 1),
        column("Message", "string", ".status.message", "Current state in one line.", 1),
    ]


def node_at(schema: Schema, path: str) -> Schema:
    """The sub-schema at a dotted path of property names; `name[]` steps into array items."""
    node = schema
    for part in path.split("."):
        is_items = part.endswith("[]")
        node = node["properties"][part.removesuffix("[]")]
        if is_items:
            node = node["items"]
    return node


def _decorate(schema: Schema, rules: dict[str, list[dict[str, str]]], extras: dict[str, Schema]) -> Schema:
    for path, extra in extras.items():
        node_at(schema, path).update(extra)
    for path, new_rules in rules.items():
        node = node_at(schema, path)
        node[VALIDATIONS] = [*node.get(VALIDATIONS, []), *new_rules]
    return schema


def spec_schema() -> Schema:
    """The spec's structural schema, with defaults, bounds and CEL rules."""
    schema = to_structural(BlackwellTrainingJobSpec, object_defaults=True)
    schema[VALIDATIONS] = [*schema.get(VALIDATIONS, []), *SPEC_ROOT_RULES]
    result: Schema = ordered(_decorate(schema, SPEC_RULES, SPEC_EXTRAS))
    return result


def status_schema() -> Schema:
    """The status's structural schema (declared, so the status patches of the operator are not pruned)."""
    schema = to_structural(BlackwellTrainingJobStatus, object_defaults=False)
    result: Schema = ordered(_decorate(schema, {}, STATUS_EXTRAS))
    return result


def open_api_schema() -> Schema:
    """The version's openAPIV3Schema."""
    return {
        "type": "object",
        "description": "A BlackwellTrainingJob names a model, the HyperPod instances and the data; the "
        "operator plans the rest (precision, micro-batch, activation checkpointing, sharding), writes the "
        "plan to status and runs it as a PyTorchJob or HyperPodPyTorchJob.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "Versioned schema of this object: training.blackwell.dev/v1alpha1.",
            },
            "kind": {"type": "string", "description": "BlackwellTrainingJob."},
            "metadata": {"type": "object", "description": "Standard object metadata."},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        VALIDATIONS: ROOT_RULES,
    }


CRD_HEADER = (
    "# Generated from the pydantic models by `btj crd`; do not edit (tests/render checks for drift).\n"
)


def crd_yaml() -> str:
    """The CRD exactly as committed under crds/ and printed by `btj crd`."""
    return CRD_HEADER + dump_yaml(generate_crd())


def generate_crd() -> dict[str, Any]:
    """The CustomResourceDefinition for training.blackwell.dev/v1alpha1 BlackwellTrainingJob."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{API_GROUP}",
            "labels": {NAME_LABEL: OPERATOR_APP_NAME},
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(),
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }

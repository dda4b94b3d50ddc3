"""A refusal a person can act on: every wrong field named in one pass, what is wrong, and the fix."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app

_register_commands()
runner = CliRunner()

# 35 wrong fields, each with the start of the line that must name it.
MANY = """\
apiVersion: training.blackwell.dev/v1alpha1
kind: BlackwellTrainingJob
metadata: {name: job, labelz: {a: b}}
spec:
  model: {preset: llama3.1-8b, presett: x}
  cluster: {instanceType: ml.p9.48xlarge, nodes: 0, gpusPerNode: "8", topolgy: {}}
  training:
    sequenceLength: 64
    steps: -1
    globalBatchTokens: "lots"
    dataset: {kind: magic, uri: 5}
    checkpoint: {intervalSteps: 0, keepLatest: -2}
    optimizer: {learningRate: -1, beta1: 2}
  tuning: {precison: fp8, activationCheckpointing: half, microBatchSize: 0, sharding: none2,
           contextParallel: 0, memoryHeadroom: 5, compile: "yes", maxReplans: -1}
  backend: Foo
  maxRetries: 1000
  ttlSecondsAfterFinished: -5
  tolerations: [{operator: Maybe}]
  env: [{name: "", value: 1}]
  dryRun: "no"
  volumes: [{name: X, claimName: Y, mountPath: rel}]
  autoResume: 3
  imagee: foo
"""
EXPECTED = [
    "metadata.labelz: unknown field; did you mean `labels`?",
    "spec.model.presett: unknown field; did you mean `preset`?",
    "spec.cluster.instanceType: must be one of ",
    "spec.cluster.nodes: must be >= 1 (got 0)",
    'spec.cluster.gpusPerNode: must be a whole number (got "8", a string); write the number without quotes',
    "spec.cluster.topolgy: unknown field; did you mean `topology`?",
    "spec.training.sequenceLength: must be >= 128 (got 64)",
    "spec.training.steps: must be >= 1 (got -1)",
    'spec.training.globalBatchTokens: must be a whole number (got "lots", a string)',
    'spec.training.dataset.kind: must be one of synthetic, shards, chat (got "magic")',
    "spec.training.dataset.uri: must be a string (got 5, a whole number); quote it",
    "spec.training.checkpoint.intervalSteps: must be >= 1 (got 0)",
    "spec.training.checkpoint.keepLatest: must be >= 1 (got -2)",
    "spec.training.optimizer.learningRate: must be > 0 (got -1)",
    "spec.training.optimizer.beta1: must be < 1 (got 2)",
    "spec.tuning.precison: unknown field; did you mean `precision`?",
    "spec.tuning.activationCheckpointing: must be one of 'auto', 'none', 'selective', 'full' (got 'half')",
    "spec.tuning.microBatchSize: must be 'auto' or a number >= 1 (got 0)",
    "spec.tuning.sharding: must be one of 'auto', 'full', 'hybrid', 'none' (got 'none2')",
    "spec.tuning.contextParallel: must be 'auto' or a number >= 1 (got 0)",
    "spec.tuning.memoryHeadroom: must be <= 0.5 (got 5)",
    'spec.tuning.compile: must be a boolean (got "yes", a string); write true or false',
    "spec.tuning.maxReplans: must be >= 0 (got -1)",
    'spec.backend: must be one of PyTorchJob, HyperPodPyTorchJob, TrainJob, auto (got "Foo")',
    "spec.maxRetries: must be <= 100 (got 1000)",
    "spec.ttlSecondsAfterFinished: must be >= 0 (got -5)",
    'spec.tolerations[0].operator: must be one of Exists, Equal (got "Maybe")',
    "spec.env[0].name: at least 1 characters (got 0)",
    'spec.env[0].value: must be a string (got 1, a whole number); quote it: "1"',
    'spec.dryRun: must be a boolean (got "no", a string); write true or false',
    "spec.volumes[0].name: 'X' is not a DNS-1123 label. Fix: ",
    # `Y` is a boolean to kubectl (YAML 1.1): the message says so and how to keep the letter.
    "spec.volumes[0].claimName: must be a string (got true, a boolean); YAML reads y, n, yes, no",
    "spec.volumes[0].mountPath: 'rel' is not a normalised absolute path. Fix: ",
    "spec.autoResume: must be a boolean (got 3, a whole number)",
    "spec.imagee: unknown field; did you mean `image`?",
]


def test_every_wrong_field_is_named_once_with_its_fix(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANY)
    for command in ("plan", "render"):
        result = runner.invoke(app, [command, str(path)])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert lines[0] == f"error: {path}: invalid BlackwellTrainingJob"
        body = lines[1:]
        missing = [want for want in EXPECTED if not any(line.startswith(want) for line in body)]
        assert not missing, "\n".join(body)
        # Each field once: no second line from the models for a field the CRD already named.
        fields = [line.split(": ", 1)[0] for line in body]
        assert len(fields) == len(set(fields)) == len(EXPECTED), body


def test_an_unknown_field_far_from_any_lists_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANY.split("spec:")[0].replace(", labelz: {a: b}", "") + "spec:\n  model: {zzz: 1}\n")
    result = runner.invoke(app, ["plan", str(path)])
    assert (
        "spec.model.zzz: unknown field; remove it (known here: architecture, preset, weights)"
        in result.stderr
    )


def test_stdin_over_the_limit_says_more_than_3_mib() -> None:
    result = runner.invoke(app, ["plan", "-"], input=b"#" * ((3 << 20) + 10))
    assert result.exit_code == 2
    assert "(standard input): more than 3 MiB is over the API server's request limit" in result.stderr


def test_a_rule_both_the_crd_and_the_models_check_is_said_once(tmp_path: Path) -> None:
    # An elastic spec without a global batch: the CRD's CEL rule names spec.cluster.elastic, the models'
    # validator the whole spec, in the same words; the refusal says them once.
    path = tmp_path / "elastic.yaml"
    path.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\n"
        "metadata: {name: el, namespace: hyperpod-ns-team-a}\n"
        "spec:\n  model: {preset: llama3.1-8b}\n"
        "  cluster: {instanceType: ml.p6-b200.48xlarge, nodes: 2, elastic: {minNodes: 1, maxNodes: 2}}\n"
        "  training: {sequenceLength: 8192, steps: 10}\n"
    )
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if "globalBatchTokens" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "spec.cluster.elastic: needs spec.training.globalBatchTokens"
    )

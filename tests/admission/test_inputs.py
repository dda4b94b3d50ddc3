"""No input makes `btj plan` or `btj render` print a traceback, take more than a few seconds, or disagree."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app

_register_commands()
runner = CliRunner()

HEAD = "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\n"
META = "metadata: {name: job, namespace: team-a}\n"
SPEC = "spec:\n  model: {preset: llama3.1-8b}\n  cluster: {instanceType: ml.p6-b200.48xlarge, nodes: 1}\n"


def _alias_bomb() -> bytes:
    # Nine levels of nine references: 9**9 (387 million) strings once expanded, a few hundred bytes written.
    lines = [HEAD, "metadata:\n  name: job\n  labels:\n", f"    a0: &a0 [{', '.join(['lol'] * 9)}]\n"]
    for i in range(1, 10):
        lines.append(f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n")
    return ("".join(lines) + SPEC).encode()


# case -> (file bytes, text the one error line must contain)
BAD: dict[str, tuple[bytes, str]] = {
    "binary": (bytes(range(256)) * 8, "a binary file"),
    # kubectl reads the Latin-1 byte as U+FFFD (tests/admission/test_kubectl_parity.py): so does btj.
    "latin-1": (
        (HEAD + "metadata: {name: caf\xe9}\n" + SPEC).encode("latin-1"),
        "metadata.name: 'caf\ufffd'",
    ),
    "deep-nesting": (("a: " + "[" * 5000 + "]" * 5000 + "\n").encode(), "nested deeper than 64 levels"),
    "5000-digit-integer": (
        (HEAD + META + SPEC + f"  maxRetries: {'9' * 5000}\n").encode(),
        "a number of 5000 digits",
    ),
    "beyond-int64": ((HEAD + META + SPEC + f"  maxRetries: {2**63}\n").encode(), "spec.maxRetries"),
    "alias-bomb": (_alias_bomb(), "aliases expand to over 3 MiB"),
    # 1.5 million values in 3 MiB: refused after 20,000 instead of minutes of parsing.
    "3-MiB-of-values": (
        (HEAD + META + SPEC + "x: [" + "1," * 1_500_000 + "1]\n").encode(),
        "more than 20,000 YAML values",
    ),
    "over-3-MiB": (
        (HEAD + META + SPEC + "# " + "x" * (3 << 20) + "\n").encode(),
        f"3.0 MiB ({len(HEAD + META + SPEC) + 3 + (3 << 20):,} bytes) is over the API server's request "
        "limit of 3.0 MiB (3,145,728 bytes)",
    ),
    # Only the first 3 MiB are read, yet the size named is the file's.
    "10-MiB": (b"#" * (10 << 20), "10.0 MiB (10,485,760 bytes) is over"),
    "50-MB-env-value": (
        (HEAD + META + SPEC + "  env: [{name: A, value: '" + "x" * 50_000_000 + "'}]\n").encode(),
        "request limit",
    ),
    "long-env-value": (
        (HEAD + META + SPEC + "  env: [{name: A, value: '" + "x" * 40_000 + "'}]\n").encode(),
        "spec.env[0].value: at most 32768 characters",
    ),
    "no-metadata": ((HEAD + SPEC).encode(), "metadata"),
    "metadata-a-string": ((HEAD + "metadata: job\n" + SPEC).encode(), "metadata"),
    "no-spec": ((HEAD + META).encode(), "spec"),
    "spec-a-string": ((HEAD + META + "spec: train llama\n").encode(), "spec"),
    "duplicate-env-name": (
        (HEAD + META + SPEC + "  env: [{name: A, value: '1'}, {name: A, value: '2'}]\n").encode(),
        "spec.env[1]: duplicate entry (name='A')",
    ),
    # A list-map key of the wrong type is the schema's error, never a crash of the duplicate-key check.
    "env-name-a-list": (
        (HEAD + META + SPEC + "  env: [{name: [A], value: '1'}, {name: [A], value: '2'}]\n").encode(),
        "spec.env[0].name: must be a string (got ['A'], a list)",
    ),
    "volume-name-a-mapping": (
        (HEAD + META + SPEC + "  volumes: [{name: {a: 1}, claimName: c, mountPath: /x}]\n").encode(),
        "spec.volumes[0].name: must be a string (got {'a': 1}, a mapping)",
    ),
    # dataset.uri is checked like weights.uri and output.uri (the CRD's pattern, the models' words).
    "dataset-uri-relative": (
        (HEAD + META + SPEC + "  training: {dataset: {kind: shards, uri: fsx/tokens}}\n").encode(),
        "spec.training.dataset.uri: 'fsx/tokens' is neither an s3://bucket/prefix nor a normalised absolute "
        "folder. Fix: write it like s3://my-bucket/datasets/my-corpus or /fsx/datasets/my-corpus",
    ),
    "label-not-a-string": (
        (HEAD + "metadata: {name: job, labels: {team: 7}}\n" + SPEC).encode(),
        "metadata.labels.team: must be a string",
    ),
    "label-value-invalid": (
        (HEAD + "metadata: {name: job, labels: {team: 'a b'}}\n" + SPEC).encode(),
        "metadata.labels.team",
    ),
    "nodes-true": (
        (HEAD + META + "spec: {model: {preset: llama3.1-8b}, cluster: {nodes: true}}\n").encode(),
        "spec.cluster.nodes: must be a whole number (got true, a boolean)",
    ),
    "nodes-string": (
        (HEAD + META + "spec: {model: {preset: llama3.1-8b}, cluster: {nodes: '2'}}\n").encode(),
        'spec.cluster.nodes: must be a whole number (got "2", a string)',
    ),
    "dry-run-string": ((HEAD + META + SPEC + "  dryRun: 'false'\n").encode(), "spec.dryRun"),
    "queue-outside-pattern": (
        (HEAD + META + SPEC + "  queueName: team a/queue\n").encode(),
        'spec.queueName: "team a/queue" is not a label value',
    ),
    "toleration-breaks-cel": (
        (HEAD + META + SPEC + "  tolerations: [{operator: Exists, value: ml}]\n").encode(),
        "spec.tolerations[0]: a toleration with operator Exists must not set a value",
    ),
    "name-with-dot": (
        (HEAD + "metadata: {name: a.b}\n" + SPEC).encode(),
        "metadata.name: must be a DNS-1035",
    ),
    "name-uppercase": ((HEAD + "metadata: {name: Job}\n" + SPEC).encode(), "metadata.name"),
    "namespace-invalid": ((HEAD + "metadata: {name: job, namespace: Team_A}\n" + SPEC).encode(), "namespace"),
    "unknown-field": ((HEAD + META + SPEC + "  nodes: 2\n").encode(), "spec.nodes"),
    "control-character": ((HEAD + META + SPEC + "  image: a\x01b\n").encode(), "U+0001 at position"),
    "tabs": (b"apiVersion:\ttraining\n\tkind: x\n", "not valid YAML"),
    "empty": (b"", "no BlackwellTrainingJob document"),
    "a-list": (b"- 1\n- 2\n", "document 1 is a list, not a Kubernetes object"),
}


def _invoke(command: str, path: Path) -> tuple[int, str, float, BaseException | None]:
    # CPU seconds of this process (the command runs in it): the bound holds however loaded the machine is.
    started = time.process_time()
    result = runner.invoke(app, [command, str(path)])
    return result.exit_code, result.stderr, time.process_time() - started, result.exception


@pytest.mark.parametrize("case", sorted(BAD))
def test_plan_and_render_refuse_it_in_one_line_each_quickly_and_alike(tmp_path: Path, case: str) -> None:
    data, expected = BAD[case]
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    verdicts = {}
    for command in ("plan", "render"):
        code, stderr, seconds, exception = _invoke(command, path)
        assert code == 2, (command, stderr[:500])
        assert isinstance(exception, SystemExit), exception  # typer.Exit, never a crash
        assert "Traceback" not in stderr and len(stderr) < 2000, stderr[:500]
        assert expected in stderr, stderr[:500]
        assert seconds < 5, f"{command} took {seconds:.1f} s"
        lines = [line for line in stderr.strip().splitlines() if not line.startswith("warning: ")]
        assert lines[0].startswith("error: ") and all(len(line) < 400 for line in lines), lines
        verdicts[command] = stderr
    assert verdicts["plan"] == verdicts["render"]


def test_standard_input_is_read_for_dash() -> None:
    text = (HEAD + META + SPEC).encode()
    result = runner.invoke(app, ["plan", "-", "-o", "json"], input=text)
    assert result.exit_code == 0, result.output
    assert '"jobName": "job"' in result.stdout
    bad = runner.invoke(app, ["render", "-"], input=(HEAD + "metadata: {name: a.b}\n" + SPEC).encode())
    assert bad.exit_code == 2 and bad.stderr.startswith("error: (standard input): invalid")


def test_a_directory_or_a_missing_file_is_one_line(tmp_path: Path) -> None:
    for what, path in {"directory": tmp_path, "missing": tmp_path / "nope"}.items():
        result = runner.invoke(app, ["plan", str(path)])
        assert result.exit_code == 2, what
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, what

"""Property: on any input, `btj plan` and `btj render` agree on accept/reject, quickly, never a traceback."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from blackwell_trainer.prepare import Options, prepare
from tests.admission.test_verdict_property import manifests

_register_commands()
runner = CliRunner()
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _verdicts(path: Path) -> dict[str, int]:
    codes = {}
    for command in ("plan", "render"):
        started = time.process_time()
        result = runner.invoke(app, [command, str(path), "-o", "json"])
        assert time.process_time() - started < 10, f"{command} took too long"
        assert result.exit_code in (0, 2), (command, result.exception, result.output[-2000:])
        assert "Traceback" not in result.output
        if result.exit_code:
            # Warnings (a byte that is not UTF-8, a key given twice) may come first; then the refusal.
            lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
            assert lines and lines[0].startswith("error: "), result.stderr[:500]
        codes[command] = result.exit_code
    return codes


@SETTINGS
@given(manifests())
def test_plan_and_render_agree_on_generated_manifests(tmp_path: Path, manifest: dict[str, Any]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    codes = _verdicts(path)
    assert codes["plan"] == codes["render"], codes


@SETTINGS
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_plan_and_render_agree_on_any_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\n" + data)
    codes = _verdicts(path)
    assert codes["plan"] == codes["render"], codes


# The corpus of files a machine can read (issue 26): render skipped the data-manifest checks plan makes
# and said readable weights "cannot be read here". Issue 39: weights alone, readable here, were planned
# offline while the operator marked the same BTJ Invalid; now both commands refuse them as it does.
# Each case: (name, weights, data, tuning, job name).
CORPUS = {
    "data-and-weights-that-match": ("llama", "shards", "uint16", {"microBatchSize": 8}, "ft"),
    "data-of-another-dtype": ("llama", "shards", "uint32", {"microBatchSize": 8}, "ft"),
    "data-of-a-larger-vocabulary": ("small", "shards", "uint16", {"microBatchSize": 8}, "ft"),
    "data-of-another-tokenizer": ("other", "shards", "uint16", {"microBatchSize": 8}, "ft"),
    "data-too-small-for-one-step": ("llama", "shards", "uint16", {}, "ft"),
    "weights-only-readable-here": ("llama", None, "uint16", {"microBatchSize": 8}, "ft"),
    "a-name-too-long-for-the-children": ("llama", None, "uint16", {}, "x" * 60),
}


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.hf_models import save_hf_model
    from tests.support.text_data import VOCAB, make_documents, save_tokenizer

    root = tmp_path_factory.mktemp("fsx")
    save_hf_model("llama3.1", root / "llama", vocab_size=VOCAB)
    save_tokenizer(root / "llama")
    save_hf_model("llama3.1", root / "small", vocab_size=256)
    shutil.copytree(root / "llama", root / "other")
    save_tokenizer(root / "other", vocab_size=280)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in make_documents(200)))
    prepare(Options(inputs=[str(corpus)], output=root / "shards", tokenizer=root / "llama", chunk_bytes=4096))
    return root


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_plan_and_render_agree_on_the_corpus(corpus_root: Path, tmp_path: Path, case: str) -> None:
    weights, data, dtype, tuning, name = CORPUS[case]
    # 2 GPUs x micro-batch 8 a step: the fixture's data holds it (the rule's batch would not); the case
    # that must be too small asks for 512 sequences a step.
    sequences = 512 if case == "data-too-small-for-one-step" else 16
    training: dict[str, Any] = {"sequenceLength": 128, "steps": 10, "globalBatchTokens": sequences * 128}
    if data is not None:
        training["dataset"] = {"kind": "shards", "uri": str(corpus_root / data), "tokenDtype": dtype}
    model: dict[str, Any] = {"weights": {"uri": str(corpus_root / weights)}}
    if case != "weights-only-readable-here":  # that one names no model: refused, as the operator refuses it
        model["architecture"] = named_architecture(corpus_root / weights)
    manifest = {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "model": model,
            "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 2},
            "training": training,
            "tuning": tuning,
            "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": str(corpus_root)}],
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    outcomes = {}
    for command in ("plan", "render"):
        result = runner.invoke(app, [command, str(path), "-o", "json"])
        assert "Traceback" not in result.output and result.exit_code in (0, 2), result.output[-2000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        outcomes[command] = (result.exit_code, errors)
    assert outcomes["plan"] == outcomes["render"], outcomes
    assert "cannot be read here" not in str(outcomes)
    accepted = case == "data-and-weights-that-match"
    assert (outcomes["plan"][0] == 0) == accepted, outcomes
    if case == "weights-only-readable-here":  # the fix is the model its config.json describes
        ((line,),) = {tuple(errors) for _, errors in outcomes.values()}
        assert line.startswith("error: spec.model: neither preset nor architecture is set"), line
        assert "Fix: set spec.model.architecture: {" in line, line


def named_architecture(folder: Path) -> dict[str, Any]:
    """The architecture a saved model's config.json describes, as spec.model.architecture writes it."""
    from tests.support.hf_models import architecture_of

    named: dict[str, Any] = architecture_of(folder).model_dump(mode="json", by_alias=True, exclude_none=True)
    return named


# Issue 26: what the API server refuses on the pods (not on the job that templates them) is refused
# offline by both commands, naming the field (docs/reference/pod-validation.md).
POD_LEVEL = {
    "toleration-seconds-without-no-execute": (
        {"tolerations": [{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30}]},
        "spec.tolerations",
    ),
    "toleration-seconds-without-an-effect": (
        {"tolerations": [{"key": "gpu", "operator": "Exists", "tolerationSeconds": 30}]},
        "spec.tolerations",
    ),
    "toleration-key-not-a-qualified-name": ({"tolerations": [{"key": "a b"}]}, "spec.tolerations"),
    "toleration-value-not-a-label-value": (
        {"tolerations": [{"key": "gpu", "value": "a b"}]},
        "spec.tolerations",
    ),
    "env-name-with-equals": ({"env": [{"name": "A=B", "value": "1"}]}, "spec.env"),
    "env-name-not-printable": ({"env": [{"name": "A\tB"}]}, "spec.env"),
    "image-with-surrounding-spaces": ({"image": " trainer:1 "}, "spec.image"),
    "image-with-a-trailing-newline": ({"image": "trainer:1\n"}, "spec.image"),
}
POD_LEVEL_ACCEPTED = {
    "toleration-seconds-with-no-execute": {
        "tolerations": [{"key": "gpu", "effect": "NoExecute", "tolerationSeconds": 30}]
    },
    "env-name-relaxed": {"env": [{"name": "my.env-name 1", "value": "a=b"}]},
    "image-plain": {"image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/btj-trainer:0.1.0"},
}


def _example_with(tmp_path: Path, fields: dict[str, Any]) -> Path:
    from blackwell_operator.cli.manifest import read_manifest_text

    manifest = yaml.safe_load(read_manifest_text(None)[0])
    manifest["spec"].update(fields)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


@pytest.mark.parametrize("case", sorted(POD_LEVEL))
def test_pod_level_rules_are_refused_offline_naming_the_field(tmp_path: Path, case: str) -> None:
    fields, field = POD_LEVEL[case]
    path = _example_with(tmp_path, fields)
    lines = set()
    for command in ("plan", "render"):
        result = runner.invoke(app, [command, str(path), "-o", "json"])
        assert result.exit_code == 2, (command, result.output[-1000:])
        lines.add(result.stderr.strip())
    assert len(lines) == 1, lines
    text = lines.pop().removeprefix("error: ")
    assert any(line.startswith(field) for line in text.splitlines()), text


@pytest.mark.parametrize("case", sorted(POD_LEVEL_ACCEPTED))
def test_what_the_pods_accept_is_accepted(tmp_path: Path, case: str) -> None:
    path = _example_with(tmp_path, POD_LEVEL_ACCEPTED[case])
    for command in ("plan", "render"):
        result = runner.invoke(app, [command, str(path), "-o", "json"])
        assert result.exit_code == 0, (command, result.stderr[-1000:])

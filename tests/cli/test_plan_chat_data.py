"""`btj plan` on chat data it can read: the mask's coverage and the template's hash in the explanation, and
chat data named as plain shards (which would train on every token) refused in the trainer's words."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from blackwell_trainer.plan.config import Plan
from blackwell_trainer.plan.shard_manifest import MANIFEST_NAME, ShardManifest
from blackwell_trainer.prepare import Options, prepare
from tests.cli.test_plan_weights import job
from tests.support.chat_data import CONVERSATIONS, save_chat_checkpoint, write_conversations

_register_commands()
runner = CliRunner()


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsx")
    folder = save_chat_checkpoint(root / "ckpt", "llama3")
    source = write_conversations(root / "chat.jsonl", CONVERSATIONS * 3)
    prepare(Options(inputs=[str(source)], output=root / "chats", tokenizer=folder, chat="auto"))
    return root / "chats"


def plan(chats: Path, kind: str) -> tuple[int, str, str]:
    dataset = {"kind": kind, "uri": str(chats), "tokenDtype": "uint16"}
    path = job(chats.parent, {"preset": "llama3.2-1b"}, dataset=dataset)
    result = runner.invoke(app, ["plan", str(path), "-o", "json"])
    return result.exit_code, result.stdout, result.stderr.strip()


def test_the_plan_says_how_much_of_the_chat_data_is_trained_on(chats: Path) -> None:
    code, out, err = plan(chats, "chat")
    assert code == 0, err
    line = next(x for x in Plan.model_validate_json(out).explanation if x.startswith(f"dataset.uri {chats}"))
    manifest = ShardManifest.model_validate_json((chats / MANIFEST_NAME).read_text())
    assert f"{manifest.documents} conversations" in line
    assert f"{manifest.trained_tokens:,} trained on ({manifest.loss_mask_coverage:.1%}" in line
    assert line.endswith(f"chat template sha256 {manifest.chat_template_sha256}")


def test_chat_data_named_as_plain_shards_is_refused(chats: Path) -> None:
    code, _, err = plan(chats, "shards")
    assert code != 0
    assert "holds chat data" in err and "set spec.training.dataset.kind: chat" in err

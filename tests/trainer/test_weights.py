"""Weights in and out on one process: config checks, sharded and S3 checkpoints, export round trips.

The references are real: models built and saved by Hugging Face transformers, reloaded by it after an
export; S3 is a moto server over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from blackwell_trainer.checkpoint.store import Checkpointer
from blackwell_trainer.export import main as export_main
from blackwell_trainer.plan.config import CheckpointConfig, architecture_from_hf_config
from blackwell_trainer.weights.export import export_model
from blackwell_trainer.weights.load import load_pretrained
from blackwell_trainer.weights.store import WeightsError
from tests.support.hf_models import (
    ATOL,
    RTOL,
    SEQ,
    architecture_of,
    empty_trainer_model,
    hf_logits,
    save_hf_model,
    tokens,
    trainer_logits,
)
from tests.support.plans import tiny_plan_dict

pytest.importorskip(
    "transformers", reason="transformers (the dev extra) is missing: bash scripts/bootstrap.sh --all"
)
_ARCH = architecture_from_hf_config(
    {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
     "intermediate_size": 128, "vocab_size": 256}
)  # fmt: skip


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _rope(folder: Path, **changes: Any) -> dict[str, Any]:
    params: dict[str, Any] = json.loads((folder / "config.json").read_text())["rope_parameters"]
    return {"rope_parameters": {**params, **changes}}


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"num_key_value_heads": 4}, "num_key_value_heads gives num_key_value_heads=4"),
        ({"num_hidden_layers": 3}, "num_hidden_layers gives num_layers=3"),
        ({"rms_norm_eps": 1e-6}, "rms_norm_eps gives norm_eps=1e-06"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings gives tie_word_embeddings=True"),
        ({"model_type": "qwen2"}, "model_type gives attention_bias=True"),
        ("theta", "rope_theta gives rope_theta=10000.0"),
        ("no-scaling", "rope_scaling gives rope_scaling=None"),
        ({"model_type": "gemma"}, "model_type 'gemma' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"mlp_bias": True}, "mlp_bias true is not supported"),
        ({"model_type": "mistral", "sliding_window": 16}, "sliding_window 16 is shorter than the sequence"),
    ],
    ids=lambda v: v if isinstance(v, str) else next(iter(v)) if isinstance(v, dict) else None,
)
def test_a_checkpoint_that_is_not_the_plans_architecture_is_refused_in_one_line(
    changes: dict[str, Any] | str, needle: str, tmp_path: Path
) -> None:
    save_hf_model("llama3.1", tmp_path)
    arch = architecture_of(tmp_path)
    if changes == "theta":
        changes = _rope(tmp_path, rope_theta=10000.0)
    elif changes == "no-scaling":
        changes = {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    assert isinstance(changes, dict)
    _edit_config(tmp_path, **changes)
    model = empty_trainer_model(arch)
    with pytest.raises(WeightsError) as err:
        load_pretrained(model, str(tmp_path), arch, SEQ)
    message = str(err.value)
    assert needle in message and "\n" not in message
    assert message.startswith(f"weights.uri {tmp_path}: ")


def test_the_hubs_config_layout_reads_the_same_as_transformers_5s(tmp_path: Path) -> None:
    """Hub files carry rope_theta and rope_scaling at the top (transformers < 5 wrote them so)."""
    save_hf_model("llama3.1", tmp_path)
    modern = json.loads((tmp_path / "config.json").read_text())
    hub = json.loads(json.dumps(modern))
    params = hub.pop("rope_parameters")
    hub["rope_theta"] = params.pop("rope_theta")
    hub["rope_scaling"] = params
    assert architecture_from_hf_config(hub) == architecture_from_hf_config(modern)
    assert architecture_from_hf_config(hub).rope_scaling is not None


def test_a_sharded_checkpoint_with_an_index_loads_exactly(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    reference = save_hf_model("qwen2.5", tmp_path / "one")
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    arch = architecture_of(tmp_path / "sharded")
    model = empty_trainer_model(arch)
    load_pretrained(model, str(tmp_path / "sharded"), arch, SEQ)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "sharded", attn_implementation="eager")
    ids = tokens()
    torch.testing.assert_close(
        trainer_logits(model, ids), hf_logits(reloaded.eval(), ids), atol=ATOL, rtol=RTOL
    )


def test_a_missing_or_misshapen_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_hf_model("llama3.1", tmp_path)
    arch = architecture_of(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"has no tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        load_pretrained(empty_trainer_model(arch), str(tmp_path), arch, SEQ)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(128, 60)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"up_proj\.weight is \[128, 60\] but .* needs \[128, 64\]"):
        load_pretrained(empty_trainer_model(arch), str(tmp_path), arch, SEQ)


def test_a_folder_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    save_hf_model("llama3.1", tmp_path)
    arch = architecture_of(tmp_path)
    with pytest.raises(WeightsError, match="is not a folder"):
        load_pretrained(empty_trainer_model(arch), str(tmp_path / "nope"), arch, SEQ)
    (tmp_path / "config.json").unlink()
    with pytest.raises(WeightsError, match=r"has no config\.json"):
        load_pretrained(empty_trainer_model(arch), str(tmp_path), arch, SEQ)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """A moto S3 server on a free loopback port (real HTTP); a boto3 client and bucket 'models'."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("BTJ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("BTJ_CACHE_KEEP_FREE_FRACTION", "0")
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
    client.create_bucket(Bucket="models")
    yield client
    server.stop()


def _upload(client: Any, folder: Path, prefix: str) -> None:
    for path in folder.iterdir():
        client.upload_file(str(path), "models", f"{prefix}/{path.name}")


def _download(client: Any, prefix: str, folder: Path) -> list[str]:
    folder.mkdir(parents=True)
    names = []
    for obj in client.list_objects_v2(Bucket="models", Prefix=prefix + "/")["Contents"]:
        name = obj["Key"].removeprefix(prefix + "/")
        client.download_file("models", obj["Key"], str(folder / name))
        names.append(name)
    return sorted(names)


def test_weights_from_s3_and_the_export_to_s3_round_trip(s3: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    reference = save_hf_model("qwen2.5-tied", tmp_path / "hf")
    reference.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    _upload(s3, tmp_path / "hf", "qwen")
    _upload(s3, tmp_path / "hf", "qwen-old")  # a sibling prefix that must not be mixed in
    arch = architecture_of(tmp_path / "hf")
    model = empty_trainer_model(arch)
    report = load_pretrained(model, "s3://models/qwen", arch, SEQ)
    assert report.tensors == len(list(model.parameters()))
    ids = tokens()
    torch.testing.assert_close(trainer_logits(model, ids), hf_logits(reference, ids), atol=ATOL, rtol=RTOL)

    _upload(s3, tmp_path / "hf", "out")  # an earlier, sharded export under the same prefix
    export_model(
        model, arch, "s3://models/out", sequence_length=SEQ, weights_uri="s3://models/qwen", is_writer=True
    )
    names = _download(s3, "out", tmp_path / "out")
    assert not [n for n in names if n.startswith("model-") or n.endswith("index.json")], names
    assert "config.json" in names and "model.safetensors" in names
    assert "generation_config.json" in names  # the input's non-weight files come along
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    torch.testing.assert_close(hf_logits(reloaded, ids), trainer_logits(model, ids), atol=ATOL, rtol=RTOL)


def test_an_s3_bucket_that_does_not_exist_is_one_permanent_line(s3: Any) -> None:
    """No restart creates the bucket: the job ends once naming it (tests/trainer/test_cloud_errors.py)."""
    from blackwell_trainer.cloud_errors import PermanentCloudError

    with pytest.raises(
        PermanentCloudError,
        match=r"^weights\.uri s3://absent/m: bucket 'absent' does not exist \(NoSuchBucket",
    ):
        load_pretrained(empty_trainer_model(_ARCH), "s3://absent/m", _ARCH, SEQ)
    with pytest.raises(WeightsError, match="holds no Hugging Face checkpoint files"):
        load_pretrained(empty_trainer_model(_ARCH), "s3://models/empty", _ARCH, SEQ)


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(250)} | {"[UNK]": 250}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


@pytest.mark.parametrize("family", ["llama3.1", "mistral", "qwen2.5-tied"])
def test_the_export_reloads_in_transformers_with_the_trainers_logits(family: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    save_hf_model(family, tmp_path / "in")
    _tokenizer(tmp_path / "in")
    arch = architecture_of(tmp_path / "in")
    model = empty_trainer_model(arch)
    load_pretrained(model, str(tmp_path / "in"), arch, SEQ)
    with torch.no_grad():  # trained weights are not the input's: move every one
        for param in model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "stale.safetensors").write_bytes(b"from an earlier export")
    export_model(
        model,
        arch,
        str(tmp_path / "out"),
        sequence_length=SEQ,
        weights_uri=str(tmp_path / "in"),
        is_writer=True,
        max_shard_bytes=60_000,
    )
    out = tmp_path / "out"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (out / "stale.safetensors").exists()
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "in" / "tokenizer.json").read_bytes()
    assert (
        json.loads((out / "config.json").read_text())["model_type"]
        == json.loads((tmp_path / "in" / "config.json").read_text())["model_type"]
    )
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ids = tokens()
    torch.testing.assert_close(hf_logits(reloaded, ids), trainer_logits(model, ids), atol=ATOL, rtol=RTOL)


def test_an_export_from_random_init_writes_a_llama_config_transformers_reads(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    save_hf_model("llama3.1", tmp_path / "in")  # only for its architecture
    arch = architecture_of(tmp_path / "in")
    model = empty_trainer_model(arch)
    export_model(model, arch, str(tmp_path / "out"), sequence_length=SEQ, weights_uri=None, is_writer=True)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["torch_dtype"] == "bfloat16"
    reloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager", dtype=torch.float32
    ).eval()
    ids = tokens()
    with torch.no_grad():  # the export is bf16: compare with the trainer's weights rounded to bf16
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    torch.testing.assert_close(hf_logits(reloaded, ids), trainer_logits(model, ids), atol=ATOL, rtol=RTOL)


def test_an_unwritable_output_is_an_export_failure_a_restart_may_fix(tmp_path: Path) -> None:
    from blackwell_trainer.checkpoint.store import StorageFailed

    save_hf_model("llama3.1", tmp_path / "in")
    arch = architecture_of(tmp_path / "in")
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(StorageFailed, match=r"export of the trained weights not written: output\.uri"):
        export_model(
            empty_trainer_model(arch),
            arch,
            str(tmp_path / "file" / "out"),
            sequence_length=SEQ,
            weights_uri=None,
            is_writer=True,
        )


def test_the_export_command_converts_a_job_checkpoint(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    save_hf_model("llama3.2-tied", tmp_path / "in")
    arch = architecture_of(tmp_path / "in")
    model = empty_trainer_model(arch)
    load_pretrained(model, str(tmp_path / "in"), arch, SEQ)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.1)
    Checkpointer(CheckpointConfig(path=str(tmp_path / "ckpt")), rank=0).save(7, model, None, {"step": 7})
    plan = tiny_plan_dict()
    plan.update(
        architecture=arch.model_dump(by_alias=True, exclude_none=True),
        parameterCount=arch.parameter_count(),
        sequenceLength=SEQ,
        weights={"uri": str(tmp_path / "in")},
    )
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    rc = export_main(
        [
            "--plan",
            str(tmp_path / "plan.json"),
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--output",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    ids = tokens()
    torch.testing.assert_close(hf_logits(reloaded, ids), trainer_logits(model, ids), atol=ATOL, rtol=RTOL)


def test_the_export_command_refuses_a_folder_without_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tiny_plan_dict()
    plan["parameterCount"] = 1
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    rc = export_main(["--plan", str(tmp_path / "plan.json"), "--checkpoint", str(tmp_path), "--output", "x"])
    assert rc == 2
    assert "no complete checkpoint there" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_export_holds_at_most_the_rule_the_planner_budgets(
    dtype: torch.dtype, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blackwell_trainer.plan.config import export_host_bytes
    from blackwell_trainer.weights import export as weights_export

    # Tensors of 1, 3, 2 and 7 thousand elements against files of at most 5,000 elements' bytes: the
    # writer's buffer is one file's worth, except the tensor larger than a file, which is held alone.
    itemsize = torch.empty((), dtype=dtype).element_size()
    sizes = [1000, 3000, 2000, 7000]
    tensors = [
        weights_export.ExportTensor(f"t{i}", (n,), lambda n=n: torch.ones(n)) for i, n in enumerate(sizes)
    ]
    held: list[int] = []
    save = weights_export._save_safetensors

    def recording(buffer: dict[str, torch.Tensor], path: Path) -> None:
        held.append(sum(t.numel() * t.element_size() for t in buffer.values()))
        save(buffer, path)

    monkeypatch.setattr(weights_export, "_save_safetensors", recording)
    limit = 5000 * itemsize
    error = weights_export.write_hf(
        tensors, str(tmp_path / "out"), config={}, dtype=dtype, max_shard_bytes=limit
    )
    assert error is None
    assert sum(held) == sum(sizes) * itemsize and len(held) == 3
    assert max(held) == 7000 * itemsize == export_host_bytes(7000 * itemsize, limit)
    assert all(h <= export_host_bytes(max(sizes) * itemsize, limit) for h in held)
    assert export_host_bytes(1000 * itemsize, limit) == limit  # small tensors: one file's worth

"""Precision plans the GPU or the image cannot run are refused with one line, before the GPU is touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from blackwell_trainer.parallel.precision import (
    PrecisionError,
    apply_precision,
    check_precision,
    resolve_backend,
)
from blackwell_trainer.plan.config import Candidate, PrecisionRecipe
from blackwell_trainer.train import main
from tests.support.plans import tiny_plan, tiny_plan_dict

HOPPER, ADA, AMPERE, BLACKWELL = (9, 0), (8, 9), (8, 0), (10, 0)


def _candidate(precision: str, recipe: str) -> Candidate:
    return tiny_plan(precision=precision, precisionRecipe=recipe).chosen


@pytest.mark.parametrize(
    ("precision", "recipe", "capability", "message"),
    [
        ("mxfp8", "mxfp8-block", HOPPER, "'mxfp8' needs compute capability 10.0 or newer, H has 9.0"),
        ("nvfp4", "nvfp4-block", HOPPER, "'nvfp4' needs compute capability 10.0 or newer, H has 9.0"),
        ("fp8", "current", AMPERE, "'fp8' needs compute capability 8.9\\+, H has 8.0; use precision bf16"),
        ("fp8", "block", ADA, "precisionRecipe 'block' needs compute capability 9.0 or newer"),
        ("fp8", "torchao-tensorwise", None, "needs a CUDA GPU but H has none"),
        ("bf16", "current", HOPPER, "'current' does not realise precision 'bf16'; use one of: none"),
        ("fp8", "mxfp8-block", BLACKWELL, "does not realise precision 'fp8'"),
    ],
)
def test_impossible_precision_is_refused_with_one_line(
    precision: str, recipe: str, capability: tuple[int, int] | None, message: str
) -> None:
    with pytest.raises(PrecisionError, match=message) as err:
        check_precision(_candidate(precision, recipe), capability, where="H")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("precision", "recipe", "capability"),
    [
        ("bf16", "none", None),
        ("fp8", "delayed", ADA),
        ("fp8", "block", HOPPER),
        ("fp8", "torchao-rowwise", HOPPER),
        ("mxfp8", "mxfp8-block", BLACKWELL),
        ("nvfp4", "nvfp4-block", BLACKWELL),
    ],
)
def test_possible_precision_passes(precision: str, recipe: str, capability: tuple[int, int] | None) -> None:
    check_precision(_candidate(precision, recipe), capability, where="H")


@pytest.mark.parametrize(
    ("recipe", "te", "torchao", "expected"),
    [
        ("current", True, True, ("te", PrecisionRecipe.CURRENT)),
        ("current", False, True, ("torchao", PrecisionRecipe.TORCHAO_TENSORWISE)),
        ("delayed", False, True, ("torchao", PrecisionRecipe.TORCHAO_TENSORWISE)),
        ("block", False, True, ("torchao", PrecisionRecipe.TORCHAO_ROWWISE)),
        ("torchao-rowwise", True, True, ("torchao", PrecisionRecipe.TORCHAO_ROWWISE)),
    ],
)
def test_te_when_importable_else_torchao(
    recipe: str, te: bool, torchao: bool, expected: tuple[str, PrecisionRecipe]
) -> None:
    assert resolve_backend(_candidate("fp8", recipe), te=te, torchao=torchao) == expected


def test_mx_formats_without_transformer_engine_are_refused() -> None:
    with pytest.raises(PrecisionError, match="needs Transformer Engine, which is not installed"):
        resolve_backend(_candidate("mxfp8", "mxfp8-block"), te=False, torchao=True)
    with pytest.raises(PrecisionError, match="neither is installed"):
        resolve_backend(_candidate("fp8", "current"), te=False, torchao=False)


def test_bf16_leaves_the_model_untouched() -> None:
    blocks = nn.ModuleDict({"0": nn.Sequential(nn.Linear(16, 16))})
    setup = apply_precision(nn.Module(), _candidate("bf16", "none"), blocks=blocks, te=True, torchao=True)
    assert setup.backend == "bf16" and type(blocks["0"][0]) is nn.Linear
    with setup.forward_context():
        pass


def _write_plan(tmp_path: Path, **chosen: object) -> str:
    plan = tiny_plan_dict(**{"shardDegree": 1, **chosen})
    plan["gpusPerNode"] = 1
    plan["gpu"] = {"name": "H200", "computeCapability": "9.0", "memoryBytes": 1, "peakBf16Flops": 1.0}
    plan["parameterCount"] = tiny_plan().architecture.parameter_count()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return str(path)


def test_cli_refuses_mxfp8_on_an_h200_plan_with_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_plan(tmp_path, precision="mxfp8", precisionRecipe="mxfp8-block")
    assert main(["--plan", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert (
        "error: chosen.precision 'mxfp8' needs compute capability 10.0 or newer, plan GPU H200 has 9.0" in err
    )


def test_cli_refuses_an_impossible_context_parallel_with_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_plan(tmp_path, contextParallel=2)  # one process cannot hold a group of 2
    assert main(["--plan", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "chosen.contextParallel (2) must divide the job's 1 processes" in err


def _llama_block(hidden: int, kv: int, ffn: int) -> nn.ModuleDict:
    """A block's Linears at a Llama shape, on the meta device (shapes only)."""

    def linear(into: int, out: int) -> nn.Linear:
        return nn.Linear(into, out, bias=False, device="meta")

    return nn.ModuleDict(
        {
            "wq": linear(hidden, hidden),
            "wk": linear(hidden, kv),
            "wv": linear(hidden, kv),
            "wo": linear(hidden, hidden),
            "w1": linear(hidden, ffn),
            "w3": linear(hidden, ffn),
            "w2": linear(ffn, hidden),
        }
    )


@pytest.mark.parametrize(
    ("hidden", "kv", "ffn"),
    [(3072, 1024, 8192), (2048, 512, 8192)],  # Llama-3.2-3B, Llama-3.2-1B
)
def test_fp8_skip_small_leaves_torchao_s_small_shapes_in_bf16(hidden: int, kv: int, ffn: int) -> None:
    from torchao.float8.float8_linear import Float8Linear

    def fp8_layers(skip_small: bool) -> set[str]:
        blocks = nn.ModuleDict({"0": _llama_block(hidden, kv, ffn)})
        candidate = _candidate("fp8", "torchao-tensorwise")
        setup = apply_precision(
            nn.Module(), candidate, blocks=blocks, te=False, torchao=True, skip_small=skip_small
        )
        assert setup.backend == "torchao"
        return {name for name, module in blocks["0"].items() if isinstance(module, Float8Linear)}

    assert fp8_layers(False) == {"wq", "wk", "wv", "wo", "w1", "w3", "w2"}
    # torchao's tensorwise table: K <= 4096 with N <= 1024 gains nothing, the K/V projections here.
    assert fp8_layers(True) == {"wq", "wo", "w1", "w3", "w2"}

"""The catalogs: published parameter counts, GPU and instance figures, lookups and their errors."""

from __future__ import annotations

import pytest

from blackwell_operator.catalogs import (
    get_gpu,
    get_instance,
    get_preset,
    list_gpus,
    list_instances,
    list_presets,
    resolve_model,
)
from blackwell_operator.errors import SpecError
from blackwell_operator.models.spec import ModelSpec
from blackwell_trainer.plan.config import Architecture, Precision

# Published totals (Hugging Face safetensors metadata of each model).
PUBLISHED = {
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
    "llama3.1-8b": 8_030_261_248,
    "llama3.1-70b": 70_553_706_496,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
    "mistral-7b": 7_248_023_552,
}


@pytest.mark.parametrize(("name", "count"), sorted(PUBLISHED.items()))
def test_preset_parameter_count_equals_the_published_one(name: str, count: int) -> None:
    preset = get_preset(name)
    assert preset.architecture.parameter_count() == count
    assert preset.parameter_count == count


def test_every_required_preset_is_present_with_a_source() -> None:
    names = {p.name for p in list_presets()}
    assert set(PUBLISHED) <= names
    assert all(p.source for p in list_presets())


def test_qwen_presets_have_qkv_bias_and_mistral_v03_vocab() -> None:
    assert all(get_preset(n).architecture.attention_bias for n in PUBLISHED if n.startswith("qwen"))
    assert get_preset("mistral-7b").architecture.vocab_size == 32768
    assert get_preset("llama3.2-1b").architecture.tie_word_embeddings
    assert not get_preset("qwen2.5-7b").architecture.tie_word_embeddings


def test_gpu_figures() -> None:
    b200, h200, h100 = get_gpu("B200"), get_gpu("h200"), get_gpu("H100")
    assert b200.peak_flops["bf16"] == 2.25e15
    assert b200.peak_flops["fp8"] == 2 * b200.peak_flops["bf16"]
    assert b200.peak_flops["fp4"] == 4 * b200.peak_flops["bf16"]
    assert h100.peak_flops["bf16"] == pytest.approx(989e12, rel=1e-3)
    assert h200.memory_gib == pytest.approx(140.4, abs=0.05)
    assert b200.compute_capability == "10.0" and h100.compute_capability == "9.0"
    # MXFP8 and NVFP4 need Blackwell; FP8 needs Hopper or newer.
    for gpu in list_gpus():
        blackwell = gpu.major >= 10
        assert (Precision.MXFP8 in gpu.precisions) == blackwell
        assert (Precision.NVFP4 in gpu.precisions) == blackwell
        assert Precision.FP8 in gpu.precisions
        assert gpu.source


def test_instances_point_at_known_gpus() -> None:
    assert {i.instance_type for i in list_instances()} == {
        "ml.p5.48xlarge",
        "ml.p5e.48xlarge",
        "ml.p5en.48xlarge",
        "ml.p6-b200.48xlarge",
    }
    for inst in list_instances():
        assert get_gpu(inst.gpu).name == inst.gpu
        assert inst.gpus_per_node == 8 and inst.efa_devices > 0 and inst.source
    assert get_instance("ml.p6-b200.48xlarge").gpu == "B200"
    assert get_instance("ml.p5.48xlarge").gpu == "H100"
    assert get_gpu("H100-SXM").name == "H100"


def test_unknown_names_raise_spec_errors_naming_the_field() -> None:
    with pytest.raises(SpecError, match=r"spec\.model\.preset: unknown preset 'gpt-5'"):
        get_preset("gpt-5")
    with pytest.raises(SpecError, match=r"spec\.cluster\.instanceType"):
        get_instance("ml.p4d.24xlarge")
    with pytest.raises(SpecError, match="unknown GPU"):
        get_gpu("A100")


def test_resolve_model_preset_and_custom() -> None:
    name, arch = resolve_model(ModelSpec(preset="llama3.1-8b"))
    assert name == "llama3.1-8b" and arch.hidden_size == 4096
    custom = Architecture(
        hidden_size=1024,
        num_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        intermediate_size=4096,
        vocab_size=1000,
    )
    assert resolve_model(ModelSpec(architecture=custom)) == ("custom", custom)

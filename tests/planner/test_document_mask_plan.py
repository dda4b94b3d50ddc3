"""A chat data set (packed rows, FlexAttention document mask) is planned slower in attention and says what
its mask's speed rests on: measured on the H200, modelled elsewhere."""

from __future__ import annotations

import pytest

from blackwell_operator.calibration import load_calibration
from blackwell_operator.errors import PlanningError
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.throughput import estimate_time
from blackwell_trainer.plan.config import Basis, DatasetConfig, DatasetKind
from tests.support.specs import hardware, layout, make_spec, setting, shapes


def chat_spec(**knobs: object) -> object:
    spec = make_spec(**knobs)  # type: ignore[arg-type]
    spec.training.dataset = DatasetConfig(kind=DatasetKind.CHAT, uri="/fsx/data/chats", token_dtype="uint32")
    return spec


def test_the_document_mask_costs_attention_time_by_its_modelled_factor() -> None:
    cal = load_calibration("btj-trainer")
    hw = hardware("ml.p6-b200.48xlarge", 1)
    s = setting(mbs=2)
    dense = estimate_time(shapes("llama3.1-8b"), cal, hw, s, layout(s, hw), 8192)
    masked = estimate_time(shapes("llama3.1-8b"), cal, hw, s, layout(s, hw), 8192, document_mask=True)
    factor = cal.throughput.document_mask_attention_factor
    assert masked.breakdown["attention"] == pytest.approx(dense.breakdown["attention"] / factor)
    assert masked.tokens_per_second_per_gpu < dense.tokens_per_second_per_gpu
    assert masked.breakdown["gemm"] == dense.breakdown["gemm"]


def test_a_chat_plan_says_its_document_mask_is_modelled_off_the_h200_and_measured_on_it() -> None:
    plain = plan_job(make_spec(nodes=2, seq=8192))
    chat = plan_job(chat_spec(nodes=2, seq=8192))  # type: ignore[arg-type]
    item = next(c for c in chat.provenance if c.choice == "documentMask")
    assert chat.gpu.name == "B200"
    assert item.basis is Basis.MODELLED and "FlexAttention" in item.detail and "not on a B200" in item.detail
    h200 = plan_job(chat_spec(instance="ml.p5en.48xlarge", nodes=1, seq=4096))  # type: ignore[arg-type]
    measured = next(c for c in h200.provenance if c.choice == "documentMask")
    assert measured.basis is Basis.MEASURED and "measured on a H200 here" in measured.detail
    assert not any(c.choice == "documentMask" for c in plain.provenance)
    assert chat.predicted.tokens_per_second_per_gpu < plain.predicted.tokens_per_second_per_gpu


def test_context_parallelism_pinned_for_chat_data_is_refused_naming_the_field() -> None:
    with pytest.raises(PlanningError, match=r"document mask of dataset.kind chat") as err:
        plan_job(chat_spec(nodes=2, seq=8192, contextParallel=2))  # type: ignore[arg-type]
    assert err.value.field == "spec.tuning.contextParallel"

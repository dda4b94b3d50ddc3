"""spec.env and the trainer agree (issue 36): a variable the operator sets is refused naming the field, and
every variable the trainer checks at start is checked at admission with the same verdict."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from blackwell_operator.admission.job import Rejected, validate_manifest
from blackwell_operator.cli.manifest import read_manifest_text
from blackwell_operator.render.environment import DEFAULT_ENV
from blackwell_trainer.data import shard_cache
from blackwell_trainer.errors import DataError, PlanError
from blackwell_trainer.loop.metrics import metrics_address
from blackwell_trainer.plan.config import CACHE_MAX_BYTES_ENV
from blackwell_trainer.plan.env_vars import OPERATOR_OWNED, USER_SETTINGS
from blackwell_trainer.plan.tuning import Tuning, TuningError

BASE = yaml.safe_load(read_manifest_text(None)[0])


def _with_env(name: str, value: str) -> dict[str, Any]:
    manifest = copy.deepcopy(BASE)
    manifest["spec"]["env"] = [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": name, "value": value}]
    return manifest


def _refusal(name: str, value: str) -> str | None:
    try:
        validate_manifest(_with_env(name, value))
    except Rejected as exc:
        return exc.lines[0]
    return None


@pytest.mark.parametrize("name", sorted(OPERATOR_OWNED))
def test_a_variable_the_operator_sets_is_refused_naming_the_field(name: str) -> None:
    line = _refusal(name, "1")
    assert line is not None and line.startswith("spec.env[1].name: "), line
    assert name in line and "set by the operator" in line and "Fix: remove it" in line


def test_the_operator_owns_what_the_plan_depends_on() -> None:
    # The allocator setting the memory model assumes, and every variable the plan's render sets.
    assert "PYTORCH_CUDA_ALLOC_CONF" in OPERATOR_OWNED
    assert {name for name in DEFAULT_ENV if name.startswith("BTJ_")} <= OPERATOR_OWNED
    assert CACHE_MAX_BYTES_ENV in OPERATOR_OWNED  # what plan_env sets
    # NCCL's and libfabric's tunables stay the user's to change.
    assert _refusal("NCCL_ALGO", "Ring") is None and _refusal("FI_EFA_USE_DEVICE_RDMA", "0") is None


def test_a_variable_of_the_trainers_prefix_it_does_not_read_is_refused() -> None:
    line = _refusal("BTJ_METRICS_ADRESS", "127.0.0.1")
    assert line is not None and line.startswith("spec.env[1].name: ") and "BTJ_METRICS_ADDRESS" in line


def _trainer_address(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BTJ_METRICS_ADDRESS", value)
    metrics_address()


def _trainer_keep_free(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BTJ_CACHE_KEEP_FREE_FRACTION", value)
    shard_cache.keep_free_fraction()


def _trainer_tuning(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BTJ_TRAINER_TUNING", value)
    Tuning.from_env()


# What the trainer runs at start for each variable a user may set, and values on both sides of its rule.
TRAINER: dict[str, tuple[Callable[[str, pytest.MonkeyPatch], None], list[str]]] = {
    "BTJ_METRICS_ADDRESS": (_trainer_address, ["127.0.0.1", "::", "0.0.0.0", "localhost", "pod-ip", "1.2.3"]),
    "BTJ_CACHE_KEEP_FREE_FRACTION": (_trainer_keep_free, ["0.2", "0", "0.99", "1", "-0.1", "a fifth"]),
    "BTJ_TRAINER_TUNING": (
        _trainer_tuning,
        ["compile_mode=default", "fuse-projections=true", "fuse_projections=maybe", "speed=max", "x"],
    ),
}


def test_every_setting_the_trainer_checks_is_compared_here() -> None:
    checked = {name for name in USER_SETTINGS if USER_SETTINGS[name]("\x00not a value\x00") is not None}
    assert checked == set(TRAINER)


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, (_, values) in TRAINER.items() for v in values])
def test_admission_and_the_trainer_agree(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    start, _ = TRAINER[name]
    try:
        start(value, monkeypatch)
        trainer_refuses = False
    except (PlanError, DataError, TuningError):
        trainer_refuses = True
    line = _refusal(name, value)
    assert (line is not None) == trainer_refuses, (value, line)
    if line is not None:
        assert line.startswith("spec.env[1].value: ") and name in line and "Fix" in line, line
        if len(value) > 1:  # the reason never repeats the value
            assert value not in line.partition(": ")[2].replace(name, ""), line

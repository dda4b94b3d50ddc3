"""The fit recovers known constants from records the planner's own model generated (with noise)."""

from __future__ import annotations

import pytest

from blackwell_operator.calibrate.fit import (
    constant_names,
    default_constants,
    fit_calibration,
    get_constant,
    with_constants,
)
from blackwell_operator.calibrate.predict import compare
from blackwell_operator.calibration import Calibration
from tests.support.calibration_records import grid_stubs, measure

TRUTH = {
    "memory.act_hidden": 10.0,
    "memory.fragmentation_base_bytes": 1.5e9,
    "throughput.recipes.9.none.efficiency": 0.66,
    "throughput.attention_efficiency": 0.55,
}


def test_fit_recovers_known_constants(base: Calibration) -> None:
    truth = with_constants(base, TRUTH)
    records = measure(
        grid_stubs(["llama3.2-1b", "llama3.2-3b"], [2048, 8192], ["none", "full"], [1, 2, 4, 8]), truth, 0.005
    )
    assert all(get_constant(base, k) != v for k, v in TRUTH.items())
    # A weak prior: the test is about recovery, not about the default regularisation.
    result = fit_calibration(records, base, list(TRUTH), prior_weight=1e-5)
    for name, value in TRUTH.items():
        got = get_constant(result.calibration, name)
        assert abs(got / value - 1) < 0.05, (name, got, value)
    assert {c.name for c in result.fitted} == set(TRUTH)
    for res in result.residuals:
        assert res.rms_after < res.rms_before and res.rms_after < 0.01


def test_constants_no_record_determines_are_kept(base: Calibration) -> None:
    records = measure(grid_stubs(["llama3.2-1b"], [4096], ["none"], [1, 2, 4]), base, 0.0)
    names = ["memory.selective_hidden", "throughput.comm_overlap", "memory.act_hidden"]
    result = fit_calibration(records, base, names)
    kept = {c.name for c in result.constants if not c.fitted}
    # One GPU and no selective AC: neither communication overlap nor selective factors can be seen.
    assert kept == {"memory.selective_hidden", "throughput.comm_overlap"}
    for name in kept:
        assert get_constant(result.calibration, name) == get_constant(base, name)


def test_ooms_push_memory_up(base: Calibration) -> None:
    # Only measured OOMs, which the base predicts to fit: the fit must grow memory until they do not.
    truth = with_constants(base, {"memory.act_hidden": 20.0})
    stubs = grid_stubs(["llama3.2-3b"], [8192], ["none"], list(range(1, 9)))
    records = [r for r in measure(stubs, truth, 0.0) if r.oom and compare(r, base).predicted_fits]
    assert records
    result = fit_calibration(records, base, ["memory.act_hidden"])
    assert get_constant(result.calibration, "memory.act_hidden") > get_constant(base, "memory.act_hidden")
    assert not any(compare(r, result.calibration).predicted_fits for r in records)


QUANT = "throughput.recipes.9.torchao-tensorwise.quant_bytes_per_element"


def test_a_plus_name_adds_one_constant_to_the_defaults(base: Calibration) -> None:
    records = measure(grid_stubs(["llama3.2-1b"], [4096], ["none"], [1, 2, 4]), base, 0.0)
    defaults = default_constants(records, base, 9)
    assert QUANT not in defaults
    assert constant_names([f"+{QUANT}"], records, base, 9) == [*defaults, QUANT]
    # Naming a default again adds nothing twice; no list at all is the defaults.
    assert constant_names([f"+{defaults[0]}"], records, base, 9) == defaults
    assert constant_names(None, records, base, 9) == defaults
    assert constant_names(["memory.act_hidden"], records, base, 9) == ["memory.act_hidden"]


def test_a_whole_list_and_plus_names_together_are_refused(base: Calibration) -> None:
    with pytest.raises(KeyError, match=r"give either the whole list or only \+names"):
        constant_names(["memory.act_hidden", f"+{QUANT}"], [], base, 9)

"""The CEL rules' presence guards (admission/cel_guards.py) change no verdict: the guarded path gives the
interpreter's every answer, on every example, every bad manifest and generated ones."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blackwell_operator.admission import _crd
from blackwell_operator.admission.cel import cel_errors
from blackwell_operator.admission.cel_guards import certainly_true, guard_of, split_top_level
from blackwell_operator.admission.openapi import Schema, apply_defaults, prune_nulls
from tests.admission.test_verdict_property import ANY, BASE, FIELDS, _set
from tests.support.crd_manifests import bad_manifests, good_manifests

OPEN_API, _ = _crd()
CORPUS = {
    **{f"good:{k}": v for k, v in good_manifests().items()},
    **{f"bad:{k}": v[0] for k, v in bad_manifests().items() if isinstance(v[0], dict)},
}


def _stored(manifest: dict[str, Any]) -> Any:
    """What the CEL rules see, as the admission check builds it: status dropped, nulls pruned, defaults."""
    new = {key: value for key, value in manifest.items() if key != "status"}
    return apply_defaults(OPEN_API, prune_nulls(copy.deepcopy(new)))


def _verdict(obj: Any, *, guards: bool) -> tuple[str, Any]:
    try:
        return "errors", list(cel_errors(OPEN_API, obj, guards=guards))
    except Exception as exc:  # the same surprise on both paths is the same answer
        return "raised", type(exc).__name__


def _guarded_rules(schema: Schema, obj: Any) -> int:
    """How many rule evaluations the guards spare on `obj` (the same walk cel_errors makes)."""
    spared = sum(
        1
        for entry in schema.get("x-kubernetes-validations", [])
        if "oldSelf" not in entry["rule"] and certainly_true(guard_of(entry["rule"]), obj)
    )
    if isinstance(obj, dict):
        for name, child in schema.get("properties", {}).items():
            if name in obj:
                spared += _guarded_rules(child, obj[name])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        spared += sum(_guarded_rules(schema["items"], item) for item in obj)
    return spared


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_the_guarded_path_gives_the_interpreters_answer(case: str) -> None:
    obj = _stored(CORPUS[case])
    assert _verdict(obj, guards=True) == _verdict(obj, guards=False)


def test_the_guards_spare_most_rule_evaluations_of_the_examples() -> None:
    spared = sum(_guarded_rules(OPEN_API, _stored(m)) for k, m in CORPUS.items() if k.startswith("good:"))
    assert spared >= 10 * sum(1 for k in CORPUS if k.startswith("good:"))


# Beyond the verdict property's fields: the ones the guards test for presence.
GUARDED_FIELDS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    **FIELDS,
    ("cluster", "elastic"): st.fixed_dictionaries(
        {"minNodes": st.integers(0, 4), "maxNodes": st.integers(0, 4)}
    )
    | ANY,
    ("cluster", "topology"): st.fixed_dictionaries({"level": st.sampled_from(["rack", ""])}) | ANY,
    ("training", "globalBatchTokens"): st.integers(1, 10**7) | ANY,
    ("training", "checkpoint"): st.fixed_dictionaries(
        {}, optional={"path": st.sampled_from(["", "/local/c"])}
    )
    | ANY,
    ("training", "output"): st.fixed_dictionaries(
        {"uri": st.sampled_from(["s3://b/o", "/fsx/o", "/fsx/../o"])}
    )
    | ANY,
    ("model", "weights"): st.fixed_dictionaries({"uri": st.sampled_from(["s3://b/w", "/fsx/w", "/fsx/o"])})
    | ANY,
    ("model", "architecture"): st.fixed_dictionaries(
        {
            "hiddenSize": st.sampled_from([2000, 2048]),
            "numAttentionHeads": st.sampled_from([16, 32]),
            "numKeyValueHeads": st.sampled_from([8, 12]),
        },
        optional={"headDim": st.just(64)},
    )
    | ANY,
    ("autoResume",): st.booleans() | ANY,
    ("backend",): st.sampled_from(["PyTorchJob", "TrainJob"]) | ANY,
}


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    manifest = copy.deepcopy(BASE)
    paths = draw(st.lists(st.sampled_from(sorted(GUARDED_FIELDS)), min_size=1, max_size=4, unique=True))
    for path in paths:
        _set(manifest["spec"], path, draw(GUARDED_FIELDS[path]))
    return manifest


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_the_guarded_path_gives_the_interpreters_answer_on_generated_manifests(
    manifest: dict[str, Any],
) -> None:
    obj = _stored(manifest)
    assert _verdict(obj, guards=True) == _verdict(obj, guards=False)


def test_terms_are_split_outside_brackets_and_strings_only() -> None:
    assert split_top_level("!has(self.a) || (b || c) || 'x || y' == self.s") == [
        "!has(self.a)",
        "(b || c)",
        "'x || y' == self.s",
    ]
    assert split_top_level("!has(self.a) || self.b ? true : false") is None  # (a || b) ? ...: no terms
    assert split_top_level("'it\\'s' || !has(self.a)") == ["'it\\'s'", "!has(self.a)"]
    assert split_top_level("(unbalanced || !has(self.a)") is None


@pytest.mark.parametrize(
    ("rule", "value", "true"),
    [
        ("!has(self.a.b) || size(self.a.b) > 1", {"a": {}}, True),
        ("!has(self.a.b) || size(self.a.b) > 1", {"a": {"b": "x"}}, False),
        ("!has(self.a.b) || size(self.a.b) > 1", {}, False),  # has(self.a.b) is an error there: undecided
        ("!has(self.a.b) || size(self.a.b) > 1", {"a": "text"}, False),
        ("!(has(self.a) && has(self.a.e)) || x", {"a": {}}, True),
        ("!(has(self.a) && has(self.a.e)) || x", {}, True),
        ("!(has(self.a) && has(self.a.e)) || x", {"a": {"e": 1}}, False),
        ("!self.f || x", {"f": False}, True),
        ("!self.f || x", {"f": 0}, False),  # not a boolean: left to the interpreter
        ("!self.f || x", {}, False),
        ("has(self.h) || x", {"h": 64}, True),
        ("has(self.h) || x", {}, False),
        ("!has(self.a)", {}, True),  # one term: the rule itself
        ("!has(self.a) && x", {}, False),  # an && needs every term
        ("!has(self.a) && !has(self.b)", {}, True),
        ("!(has(self.p) && has(self.a)) && (has(self.p) || has(self.a))", {"p": "x"}, True),
        ("!(has(self.p) && has(self.a)) && (has(self.p) || has(self.a))", {}, False),
        ("((!has(self.a))) || x", {}, True),
        ("(!has(self.a)) && (x) || y", {}, False),  # (.. && x) || y: neither decided
        ("self.k != 'shards' || x", {"k": "synthetic"}, True),
        ("self.k != 'shards' || x", {"k": "shards"}, False),
        ("self.k != 'shards' || x", {"k": 3}, False),  # not a string: left to the interpreter
        ("self.k == 'Exists' || x", {"k": "Exists"}, True),
        ("self.k != 'a\\'b' || x", {"k": "c"}, False),  # an escape in the literal: not decided here
        ("type(self) == string ? (self == 'auto') : (self >= 1)", "auto", True),
        ("type(self) == string ? (self == 'auto') : (self >= 1)", "Auto", False),
        ("type(self) == string ? (self == 'auto') : (self >= 1)", 4, False),  # the number: interpreter's
        ("has(self.a) ? true : x", {"a": 1}, False),  # any other conditional: the interpreter's
        ("x || !has(self.a)", {}, True),  # any term of the chain
    ],
)
def test_each_guard_form_is_true_only_where_cel_is(rule: str, value: Any, true: bool) -> None:
    assert certainly_true(guard_of(rule), value) is true

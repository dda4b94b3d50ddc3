"""One home each: job kinds in render.kinds, byte units in units.py, node labels in nodelabels.py, RFC 3339
in timefmt.py, the trainer's metric names in blackwell_trainer.plan.metric_names, the app.kubernetes.io label
keys and the managed-by value in applabels.py, the cluster correction's factors in planner.cluster_figures.
Static, over the packages' sources: a module elsewhere that spells one of them fails here.

Docstrings are prose and exempt; every other string (f-string parts included) counts.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "src" / "blackwell_operator"
TRAINER = ROOT / "trainer_image" / "src" / "blackwell_trainer"

# Where a job kind's plural, apiVersion or kind name may be spelled: each backend's render module (its
# KIND, API_VERSION, PLURAL), the table built from them, and the spec's Backend enum (the kinds as values).
KIND_HOMES = {"render/pytorchjob.py", "render/hyperpod.py", "render/trainjob.py", "models/spec.py"}
JOB_API = re.compile(
    r"\b(pytorchjobs|hyperpodpytorchjobs|trainjobs|trainingruntimes)\b"
    r"|kubeflow\.org/v1\b|sagemaker\.amazonaws\.com/v1\b|trainer\.kubeflow\.org"
)
KIND_NAMES = {"PyTorchJob", "HyperPodPyTorchJob", "TrainJob", "TrainingRuntime"}
NODE_LABELS = {
    "node.kubernetes.io/instance-type",
    "sagemaker.amazonaws.com/node-health-status",
    "sagemaker.amazonaws.com/deep-health-check-status",
    "kubernetes.io/hostname",
}
NODE_LABEL_PREFIX = "topology.k8s.aws/"
# A name that reads as a byte unit, and the binary units spelled out as a divisor.
UNIT_NAME = re.compile(r"^_?[KMGT]I?B$")
BINARY_UNITS = {1 << 20, 1 << 30, 1 << 40}
RFC3339_PATTERN = "%Y-%m-%dT"
# The app.kubernetes.io keys and the operator's managed-by value (it was spelled two ways before).
APP_LABEL_PREFIX = "app.kubernetes.io/"
MANAGER_VALUE = "blackwell-operator"
LABELS_HOME = "applabels.py"
# A cluster correction's factors are applied (the planner) and read back out (the measure loop) in one place;
# calibration/cluster.py makes them.
FACTOR_NAMES = {"tokens_factor", "memory_factor"}
FACTOR_HOMES = {"planner/cluster_figures.py", "calibration/cluster.py"}
RFC3339_CALLS = {"fromisoformat", "isoformat"}
# A metric the trainer exports, spelled out: the exporter and the operator's measure loop take the names from
# blackwell_trainer.plan.metric_names. The tests spell them on purpose: they pin the names on the wire (the
# dashboard, the alert rules and users' queries spell them too), so a renamed metric fails a test.
TRAINER_METRIC = re.compile(r"\bbtj_trainer_")
METRIC_NAMES_HOME = "plan/metric_names.py"
TRAINER_UNITS_HOME = "plan/units.py"


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(tree: ast.AST) -> Iterator[ast.Constant]:
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


_OPERATORS = {ast.Pow: pow, ast.LShift: operator.lshift, ast.Mult: operator.mul}


def _constant(node: ast.AST) -> int | float | None:
    """The value of an expression of number literals (2**30, 1 << 30, 1024 * 1024), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _constant(node.left), _constant(node.right)
        if isinstance(left, int) and isinstance(right, int):
            value: int = _OPERATORS[type(node.op)](left, right)
            return value
    return None


def _assigned_names(node: ast.AST) -> Iterator[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[attr-defined]
    for target in targets:
        if isinstance(target, ast.Name):
            yield target.id


def _names(node: ast.AST | None, name: str) -> bool:
    """Whether `node` is the name `name` or an attribute of that name (labels.NAME)."""
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def spellings(source: str, home: str, *, units_home: str, metric_names_home: str | None = None) -> list[str]:
    """What a module at `home` (a path inside its package) spells that belongs in one of the homes.

    `metric_names_home`: the path of the metric names' home in this package (None: it has none).
    """
    tree = ast.parse(source)
    found = []
    for node in _strings(tree):
        text = node.value
        assert isinstance(text, str)
        if home != metric_names_home and TRAINER_METRIC.search(text):
            found.append(
                f"{home}:{node.lineno}: trainer metric {text!r} (use blackwell_trainer.plan.metric_names)"
            )
        if home not in KIND_HOMES | {"render/kinds.py"} and (JOB_API.search(text) or text in KIND_NAMES):
            found.append(f"{home}:{node.lineno}: job kind {text!r} (use render.kinds)")
        if home != "nodelabels.py" and (text in NODE_LABELS or text.startswith(NODE_LABEL_PREFIX)):
            found.append(f"{home}:{node.lineno}: node label {text!r} (use nodelabels)")
        if home != "timefmt.py" and RFC3339_PATTERN in text:
            found.append(f"{home}:{node.lineno}: RFC 3339 format {text!r} (use timefmt)")
        if home != LABELS_HOME and (text.startswith(APP_LABEL_PREFIX) or text == MANAGER_VALUE):
            found.append(f"{home}:{node.lineno}: app label {text!r} (use applabels)")
    for node in ast.walk(tree):
        if home != units_home and isinstance(node, ast.Assign | ast.AnnAssign):
            for name in _assigned_names(node):
                if UNIT_NAME.match(name):
                    found.append(f"{home}:{node.lineno}: byte unit {name} (use {units_home})")
        if (
            home != units_home
            and isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and _constant(node.right) in BINARY_UNITS
        ):
            found.append(f"{home}:{node.lineno}: a byte unit spelled as a number (use {units_home})")
        if home != "timefmt.py" and isinstance(node, ast.Attribute) and node.attr in RFC3339_CALLS:
            found.append(f"{home}:{node.lineno}: datetime.{node.attr} (use timefmt)")
        if home not in FACTOR_HOMES and isinstance(node, ast.Attribute) and node.attr in FACTOR_NAMES:
            found.append(f"{home}:{node.lineno}: cluster factor .{node.attr} (use planner.cluster_figures)")
        if home != LABELS_HOME and isinstance(node, ast.Dict):
            found += [
                f"{home}:{value.lineno}: managed-by value {value.value!r} (use applabels.MANAGER)"
                for key, value in zip(node.keys, node.values, strict=True)
                if _names(key, "MANAGED_BY_LABEL") and isinstance(value, ast.Constant)
            ]
    return found


def _package_findings(
    package: Path,
    *,
    check_kinds: bool,
    check_metric_names: bool,
    metric_names_home: str | None = None,
    units_home: str = "units.py",
) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        home = path.relative_to(package).as_posix()
        found += [
            line
            for line in spellings(
                path.read_text(), home, units_home=units_home, metric_names_home=metric_names_home
            )
            if (check_kinds and f"(use {units_home})" not in line and "metric_names)" not in line)
            or f"(use {units_home})" in line
            or (check_metric_names and "(use blackwell_trainer.plan.metric_names)" in line)
        ]
    return found


def test_the_operator_spells_each_in_its_one_home() -> None:
    found = _package_findings(OPERATOR, check_kinds=True, check_metric_names=True)
    assert not found, "\n".join(found)


def test_the_trainer_has_one_home_for_byte_units_and_metric_names() -> None:
    found = _package_findings(
        TRAINER,
        check_kinds=False,
        check_metric_names=True,
        metric_names_home=METRIC_NAMES_HOME,
        units_home=TRAINER_UNITS_HOME,
    )
    assert not found, "\n".join(found)


def test_the_benchmarks_take_metric_names_from_the_trainer() -> None:
    found = _package_findings(ROOT / "benchmarks", check_kinds=False, check_metric_names=True)
    found = [line for line in found if "metric_names)" in line]  # their byte units are not held here
    assert not found, "\n".join(found)


def test_the_tests_take_byte_units_from_the_packages() -> None:
    found = _package_findings(ROOT / "tests", check_kinds=False, check_metric_names=False)
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ('PATH = "/apis/kubeflow.org/v1/namespaces/ns/pytorchjobs"', "job kind"),
        ('path = f"/apis/{group}/namespaces/{ns}/trainjobs"', "job kind"),
        ('if kind == "TrainJob":\n    pass', "job kind"),
        ('SELECT = {"node.kubernetes.io/instance-type": t}', "node label"),
        ('KEY = "topology.k8s.aws/network-node-layer-2"', "node label"),
        ('at = now.strftime("%Y-%m-%dT%H:%M:%SZ")', "RFC 3339 format"),
        ("when = datetime.datetime.fromisoformat(text)", "datetime.fromisoformat"),
        ("GIB = 1 << 30", "byte unit GIB"),
        ("_MIB: int = 1024 * 1024", "byte unit _MIB"),
        ("GB = 1e9", "byte unit GB"),
        ('label = f"{n / 2**30:.1f} GiB"', "spelled as a number"),
        ("gib = n / (1024**3)", "spelled as a number"),
        ('LABELS = {"app.kubernetes.io/managed-by": MANAGER}', "app label"),
        ('source = {"component": "blackwell-operator"}', "app label"),
        ('labels = {MANAGED_BY_LABEL: "btj-operator"}', "managed-by value"),
        ("modelled = plan.predicted.tokens_per_second_per_gpu / c.tokens_factor", "cluster factor"),
        ('labels = {applabels.MANAGED_BY_LABEL: "btj-operator", "x": "y"}', "managed-by value"),
        ('if "btj_trainer_tokens_total" not in values:\n    pass', "trainer metric"),
        ('Gauge(f"btj_trainer_{what}_seconds", "help")', "trainer metric"),
    ],
)
def test_the_check_finds_each_spelling(source: str, what: str) -> None:
    found = spellings(source, "handlers/example.py", units_home="units.py")
    assert len(found) == 1 and what in found[0], found


def test_homes_and_prose_are_exempt() -> None:
    assert not spellings('PLURAL = "pytorchjobs"', "render/pytorchjob.py", units_home="units.py")
    assert not spellings("GIB = 1 << 30", "units.py", units_home="units.py")
    assert not spellings('"""Mirrors PyTorchJob (kubeflow.org/v1) status."""', "x.py", units_home="units.py")
    assert not spellings("limit = {}.get(family, 1 << 30)", "x.py", units_home="units.py")  # not a unit
    assert not spellings('MANAGER = "blackwell-operator"', "applabels.py", units_home="units.py")
    assert not spellings("labels = {MANAGED_BY_LABEL: MANAGER}", "x.py", units_home="units.py")
    home = "metric_names.py"
    assert not spellings('TOKENS = "btj_trainer_tokens"', home, units_home="units.py", metric_names_home=home)
    assert not spellings('"""Reads btj_trainer_tokens_total."""', "x.py", units_home="units.py")
    assert not spellings('NAME = "btj_operator_reconcile_errors"', "x.py", units_home="units.py")

"""The Grafana dashboard, checked strictly offline (no Grafana server is available to load it): every
metric it queries is one the trainer or the operator really exports (read from their registries),
its variables exist and are used, every panel has a unit, only current panel types, no overlaps."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.dashboard.promql import Query, label_values_query, parse

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_PATH = ROOT / "helm" / "btj-operator" / "files" / "dashboards" / "btj-training.json"
DASHBOARD: dict[str, Any] = json.loads(DASHBOARD_PATH.read_text())
PANELS: list[dict[str, Any]] = DASHBOARD["panels"]
CONTENT = [p for p in PANELS if p["type"] != "row"]

ALLOWED_TYPES = {"timeseries", "stat", "gauge", "table", "row"}
# Grafana unit ids used here (packages/grafana-data valueFormats) and its custom-unit prefixes.
KNOWN_UNITS = {"s", "ms", "bytes", "percentunit", "short", "none", "cps", "ops", "reqps", "dateTimeAsIso"}
CUSTOM_UNIT = re.compile(r"^(count|suffix|prefix|si):.+$")
COUNTER_LIKE = ("_total", "_bucket", "_count", "_sum")


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry exposes, including those of families with no sample yet."""
    names: set[str] = set()
    for family in registry.collect():
        names |= {sample.name for sample in family.samples}
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
            "info": ("_info",),
        }.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def a_plan() -> Any:
    """A small, valid plan (built by hand so this test does not depend on the planner)."""
    from blackwell_trainer.plan import config as c

    memory = c.MemoryBreakdown(
        parameters=1,
        gradients=1,
        optimizer_states=1,
        activations=1,
        loss=1,
        fsdp_transient=1,
        precision_overhead=0,
        workspace=1,
        fragmentation=1,
        peak_phase="backward",
        peak_allocated=70 * 2**30,
        peak_reserved=80 * 2**30,
    )
    return c.Plan(
        job_name="llama3-8b-pretrain",
        model_name="llama3.1-8b",
        architecture=c.Architecture(
            hidden_size=4096,
            num_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=14336,
            vocab_size=128256,
        ),
        parameter_count=8_030_261_248,
        gpu=c.GpuInfo(
            name="B200", compute_capability="10.0", memory_bytes=180 * 10**9, peak_bf16_flops=2.25e15
        ),
        instance_type="ml.p6-b200.48xlarge",
        nodes=2,
        gpus_per_node=8,
        sequence_length=8192,
        global_batch_tokens=16 * 8192,
        steps=1000,
        chosen=c.Candidate(
            precision=c.Precision.MXFP8,
            precision_recipe=c.PrecisionRecipe.MXFP8_BLOCK,
            activation_checkpointing=c.ActivationCheckpointing.NONE,
            micro_batch_size=1,
            gradient_accumulation_steps=1,
            sharding=c.Sharding.FULL,
            shard_degree=16,
            replicate_degree=1,
        ),
        predicted=c.Prediction(
            tokens_per_second_per_gpu=20000.0,
            step_time_seconds=0.4,
            model_flops_utilization=0.45,
            memory=memory,
        ),
        provenance=[c.ChoiceProvenance(choice="gpu", value="B200", basis=c.Basis.MODELLED)],
    )


@pytest.fixture(scope="module")
def trainer_names() -> set[str]:
    from blackwell_trainer.loop.metrics import TrainerMetrics

    registry = CollectorRegistry()
    metrics = TrainerMetrics(a_plan(), registry)
    metrics.record_step(
        tokens=8192, step_seconds=0.5, loss=2.5, mfu=0.4, peak_allocated_bytes=1, peak_reserved_bytes=2
    )
    metrics.record_checkpoint(1.0)
    return exported_names(registry)


@pytest.fixture(scope="module")
def operator_names() -> set[str]:
    from blackwell_operator.metrics import OperatorMetrics

    registry = CollectorRegistry()
    OperatorMetrics(registry)
    return exported_names(registry)


def queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every target."""
    return [(p["title"], t["expr"]) for p in CONTENT for t in p.get("targets", [])]


def variable(name: str) -> dict[str, Any]:
    found = [v for v in DASHBOARD["templating"]["list"] if v["name"] == name]
    assert found, f"variable {name} missing"
    return found[0]


def parsed() -> list[tuple[str, Query]]:
    """Every target parsed by a real PromQL parser (a syntax error fails here)."""
    return [(title, parse(expr)) for title, expr in queries()]


def variable_queries() -> list[tuple[str, Query, str]]:
    """(variable, parsed selector, label) of every label_values() variable."""
    found = []
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            selector, label = label_values_query(var["definition"])
            found.append((var["name"], parse(selector), label))
    return found


def queried_metrics() -> set[str]:
    return set().union(*(q.metrics for _, q in parsed()), *(q.metrics for _, q, _ in variable_queries()))


def test_every_query_parses_as_promql() -> None:
    assert len(parsed()) >= 15


def test_current_schema_and_panel_types() -> None:
    assert DASHBOARD["schemaVersion"] >= 39
    assert DASHBOARD["uid"] and DASHBOARD["title"]
    types = {p["type"] for p in PANELS}
    assert types <= ALLOWED_TYPES, f"deprecated or unexpected panel types: {types - ALLOWED_TYPES}"
    assert all(p.get("panels", []) == [] for p in PANELS if p["type"] == "row")  # no collapsed nesting


def test_every_trainer_metric_queried_is_exported_by_the_trainer(trainer_names: set[str]) -> None:
    wanted = {m for m in queried_metrics() if m.startswith("btj_trainer_")}
    assert wanted, "the dashboard queries no trainer metric"
    unknown = wanted - trainer_names
    assert not unknown, f"queried but not exported by TrainerMetrics: {sorted(unknown)}"


def test_every_operator_metric_queried_is_exported_by_the_operator(operator_names: set[str]) -> None:
    wanted = {m for m in queried_metrics() if m.startswith("btj_operator_")}
    assert wanted, "the dashboard queries no operator metric"
    unknown = wanted - operator_names
    assert not unknown, f"queried but not exported by OperatorMetrics: {sorted(unknown)}"


def test_only_project_metrics_are_queried() -> None:
    others = {m for m in queried_metrics() if not m.startswith(("btj_trainer_", "btj_operator_"))}
    assert not others, f"metrics from neither registry: {sorted(others)}"


def test_the_promised_panels_are_there() -> None:
    used = queried_metrics()
    for metric in (
        "btj_trainer_tokens_total",
        "btj_trainer_gpus",
        "btj_trainer_model_flops_utilization_ratio",
        "btj_trainer_step_duration_seconds_bucket",
        "btj_trainer_loss",
        "btj_trainer_gpu_memory_peak_bytes",
        "btj_trainer_predicted_memory_peak_bytes",
        "btj_trainer_predicted_tokens_per_second",
        "btj_trainer_last_checkpoint_timestamp_seconds",
        "btj_operator_reconcile_errors_total",
        "btj_operator_jobs",
        "btj_operator_reconcile_duration_seconds_bucket",
        "btj_trainer_gpu_alloc_retries_total",
        "btj_operator_children_recreated_total",
        "btj_operator_resizes_total",
        "btj_trainer_checkpoint_failures_total",
        "btj_trainer_step",
        "btj_trainer_planned_steps",
    ):
        assert metric in used, f"no panel queries {metric}"
    expressions = " ".join(expr for _, expr in queries())
    assert "histogram_quantile(0.5," in expressions and "histogram_quantile(0.95," in expressions
    assert "time() - " in expressions


def test_rate_is_only_taken_of_counters() -> None:
    for title, query in parsed():
        for inner in query.rated:
            assert inner.endswith(COUNTER_LIKE), f"{title}: rate() of non-counter {inner}"


def test_quantiles_group_by_le() -> None:
    quantiles = 0
    for title, query in parsed():
        for grouping in query.quantile_groupings:
            quantiles += 1
            assert "le" in grouping, f"{title}: histogram_quantile without `by (..., le)`"
    assert quantiles >= 3


def test_variables_exist_and_are_well_formed() -> None:
    datasource = variable("datasource")
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    for name in ("namespace", "job", "pod"):
        var = variable(name)
        assert var["type"] == "query"
        assert var["datasource"]["uid"] == "${datasource}"
        assert var["multi"] and var["includeAll"] and var["allValue"] == ".*"


def test_every_trainer_selector_uses_the_namespace_job_and_pod_variables() -> None:
    for title, query in parsed():
        for metric, matchers in query.selectors:
            if metric.startswith("btj_trainer_"):
                for name in ("namespace", "job", "pod"):
                    assert matchers.get(name) == f"${name}", f"{title}: {metric} not filtered by ${name}"
    # The variables cascade: job within the chosen namespaces, pod within the chosen jobs.
    cascade = {name: (query, label) for name, query, label in variable_queries()}
    assert cascade["job"][0].selectors[0][1] == {"namespace": "$namespace"}
    assert cascade["pod"][0].selectors[0][1] == {"namespace": "$namespace", "job": "$job"}
    assert {name: label for name, (_, label) in cascade.items()} == {
        "namespace": "namespace",
        "job": "job",
        "pod": "pod",
    }


def test_every_panel_uses_the_datasource_variable() -> None:
    for panel in CONTENT:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_panel_has_a_unit() -> None:
    for panel in CONTENT:
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert unit, f"{panel['title']}: no unit"
        assert unit in KNOWN_UNITS or CUSTOM_UNIT.match(unit), f"{panel['title']}: unknown unit {unit}"


def test_ids_and_ref_ids_are_unique_and_panels_described() -> None:
    ids = [p["id"] for p in PANELS]
    assert len(ids) == len(set(ids))
    for panel in CONTENT:
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        assert panel.get("description"), f"{panel['title']}: no description"


def test_grid_positions_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in PANELS:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, f"{panel['title']}: outside the 24-column grid"
        assert pos["w"] > 0 and pos["h"] > 0
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]} at x={x}, y={y}"
                cells[(x, y)] = panel["title"]
    for row in (p for p in PANELS if p["type"] == "row"):
        assert row["gridPos"]["w"] == 24 and row["gridPos"]["h"] == 1


def test_every_predicted_line_names_what_it_rests_on() -> None:
    # Issue 39: a screenshot of a modelled prediction carries the word.
    predicted = [
        (panel["title"], target)
        for panel in DASHBOARD["panels"]
        for target in panel.get("targets", [])
        # A predicted figure drawn as it is (the measured / predicted ratios are not predictions).
        if "btj_trainer_predicted" in target.get("expr", "") and " / " not in target["expr"]
    ]
    assert len(predicted) >= 3
    for title, target in predicted:
        assert target["legendFormat"].startswith("predicted ({{prediction_basis}})"), title
        assert "group_left (prediction_basis)" in target["expr"], title

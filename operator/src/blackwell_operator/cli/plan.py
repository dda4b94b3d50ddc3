"""`btj plan` (the tuned plan for a BTJ, offline) and `btj presets` (the model catalog)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich import box
from rich.console import Console
from rich.table import Table

from blackwell_operator.calibration.cluster import describe_correction
from blackwell_operator.cli import app
from blackwell_operator.cli.backend_option import BackendOption, resolve_offline
from blackwell_operator.cli.console import table_console
from blackwell_operator.cli.manifest import load_manifest_or_fail
from blackwell_operator.cli.options import (
    DEFAULT_CALIBRATION,
    CalibrationOption,
    ClusterCalibrationOption,
    read_calibration,
    read_cluster_calibration,
)
from blackwell_operator.models.spec import TuningSpec
from blackwell_operator.planner.figures import limit_gib, memory_budget, need, parameters_text, tenths
from blackwell_operator.planner.provenance import verdict
from blackwell_operator.units import GB, GIB
from blackwell_trainer.plan.config import MEMORY_COMPONENTS, Plan

DEFAULT_HEADROOM: float = TuningSpec.model_fields["memory_headroom"].default


class PlanFormat(StrEnum):
    """How `btj plan` prints the plan."""

    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


# Below this many columns the alternatives' precision and recipe take two lines (the 80 of a plain terminal).
NARROW_COLUMNS = 110


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def _peak_cell(peak: float, budget_bytes: float) -> str:
    """An alternative's peak: over the budget it is the need its `needs X GiB > Y GiB` reason gives, rounded
    up as there (one figure per row: 149.9 beside `needs 150.0 GiB` read as two peaks, issue 39)."""
    return need(peak).removesuffix(" GiB") if peak > budget_bytes else _gib(peak)


def memory_rows(plan: Plan, headroom: float) -> list[tuple[str, str]]:
    """The memory table's rows: the components (adding up to the peak shown), the peak, the budget."""
    m = plan.predicted.memory
    parts = tenths([getattr(m, key) for key in MEMORY_COMPONENTS], m.peak_reserved)
    named = zip(MEMORY_COMPONENTS, parts, strict=True)
    rows = [(key.replace("_", " "), f"{part:.1f}") for key, part in named]
    budget_bytes = memory_budget(plan.gpu.memory_bytes, headroom)
    budget = limit_gib(budget_bytes)  # rounded down, as every other line of the plan shows it
    peak = round(sum(parts), 1)
    limit = f"budget: {_gib(plan.gpu.memory_bytes)} GiB GPU less {headroom * 100:g}% headroom"
    fits = m.peak_reserved <= budget_bytes  # in bytes: within a tenth the rounded figures may cross
    left = "left under the budget" if fits else "[red]over the budget[/]"
    return [
        *rows,
        ("[bold]= peak reserved (must fit the budget)[/]", f"{peak:.1f}"),
        ("  of which allocated by PyTorch", _gib(m.peak_allocated)),
        (limit, f"{budget:.1f}"),
        (left, f"{max(0.0, budget - peak) if fits else peak - budget:.1f}"),
    ]


def render_plan_tables(
    plan: Plan, console: Console, *, explain: bool = False, headroom: float = DEFAULT_HEADROOM
) -> None:
    """The plan as rich tables: chosen configuration, memory, prediction, alternatives.

    headroom: the spec's tuning.memoryHeadroom (the plan does not carry it), for the budget row.
    """
    c, p, m = plan.chosen, plan.predicted, plan.predicted.memory
    console.print(
        f"[bold]{plan.job_name}[/]: {plan.model_name} ({parameters_text(plan.parameter_count)}) on "
        f"{plan.nodes} x {plan.instance_type} ({plan.world_size} x {plan.gpu.name}), sequence "
        f"{plan.sequence_length}, calibration {plan.calibration}"
    )
    chosen = Table(title="Chosen configuration", show_header=False)
    for key, value in (
        ("precision", f"{c.precision.value} ({c.precision_recipe.value})"),
        ("activation checkpointing", c.activation_checkpointing.value),
        ("micro-batch size", str(c.micro_batch_size)),
        ("gradient accumulation", str(c.gradient_accumulation_steps)),
        ("global batch", f"{plan.global_batch_tokens:,} tokens"),
        ("sharding", f"{c.sharding.value} (shard {c.shard_degree} x replicate {c.replicate_degree})"),
        ("context parallel", str(c.context_parallel)),
        ("compile / loss chunk", f"{c.compile} / {c.loss_chunk_tokens} tokens"),
        ("predicted tokens/s per GPU", f"{p.tokens_per_second_per_gpu:,.0f}"),
        ("predicted MFU (of the BF16 dense peak)", f"{p.model_flops_utilization:.1%}"),
        ("predicted step time", f"{p.step_time_seconds:.3f} s"),
        ("candidates evaluated", str(plan.candidates_evaluated)),
    ):
        chosen.add_row(key, value)
    if plan.cluster_correction is not None:
        chosen.add_row("cluster correction", describe_correction(plan.cluster_correction))
    console.print(chosen)
    _provenance_table(plan, console)

    memory = Table(title=f"Memory per GPU (GiB), peak in the {m.peak_phase} phase")
    memory.add_column("component")
    memory.add_column("GiB", justify="right")
    for row in memory_rows(plan, headroom):
        memory.add_row(*row)
    console.print(memory)

    _weights_table(plan, console)
    _local_storage_line(plan, console)
    if plan.alternatives:
        # The key columns never end in "…" (fp8/torchao-tensorwise and fp8/current must stay told apart,
        # issue 39): on a narrow terminal the recipe goes under its precision, the table drops its
        # vertical rules, and only the reasons wrap.
        narrow = console.width < NARROW_COLUMNS
        alts = (
            Table(title="Alternatives", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
            if narrow
            else Table(title="Alternatives")
        )
        for col in ("precision", "AC", "mbs", "sharding", "cp", "tokens/s/GPU", "peak GiB"):
            alts.add_column(
                col.replace("/GPU", "\n/GPU").replace(" GiB", "\nGiB") if narrow else col, no_wrap=True
            )
        alts.add_column("why not", ratio=1)
        budget_bytes = memory_budget(plan.gpu.memory_bytes, headroom)
        for a in plan.alternatives:
            ac = a.candidate
            alts.add_row(
                f"{ac.precision.value}{chr(10) if narrow else '/'}{ac.precision_recipe.value}",
                ac.activation_checkpointing.value,
                str(ac.micro_batch_size),
                ac.sharding.value,
                str(ac.context_parallel),
                f"{a.prediction.tokens_per_second_per_gpu:,.0f}",
                _peak_cell(a.prediction.memory.peak_reserved, budget_bytes),
                a.reason,
            )
        console.print(alts)
    if explain:
        console.print("[bold]Why[/]")
        for line in plan.explanation:
            console.print(f"  - {line}")
        if p.time_breakdown_seconds:
            parts = ", ".join(f"{k} {v:.3f}s" for k, v in p.time_breakdown_seconds.items() if v > 0)
            console.print(f"  - step time: {parts}")


def _provenance_table(plan: Plan, console: Console) -> None:
    """Per choice: measured here (and where), modelled, or never run on a GPU here."""
    if not plan.provenance:
        console.print("What the plan rests on: not recorded (a plan made before provenance existed)")
        return
    _, reason, _ = verdict(plan.provenance)
    table = Table(title=f"What the plan rests on: {reason.lower()}")
    # Nothing ends in "…" on a narrow terminal (issue 39): the choice and basis never wrap, and a word longer
    # than its column (fp8/torchao-tensorwise, a records path) folds onto the next line.
    table.add_column("choice", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("basis", no_wrap=True)
    table.add_column("where measured / what it rests on", overflow="fold")
    styles = {"measured": "green", "modelled": "yellow", "unverified": "bold red"}
    for item in plan.provenance:
        basis = item.basis.value
        table.add_row(item.choice, item.value, f"[{styles[basis]}]{basis}[/]", item.detail)
    console.print(table)


def _gb(n: float) -> str:
    return f"{n / GB:,.1f} GB"


def _weights_table(plan: Plan, console: Console) -> None:
    """The initial weights (what each node reads, load time, memory and NVMe) and the export target."""
    load = plan.weights.load if plan.weights else None
    if plan.weights is None or load is None:
        if plan.output is not None:
            console.print(f"Trained weights written to {plan.output.uri} (Hugging Face format)")
        return
    table = Table(title=f"Initial weights: {plan.weights.uri}", show_header=False)
    estimated = " (estimated: 2 bytes per parameter)" if load.checkpoint_bytes_estimated else ""
    seconds = load.load_seconds
    bandwidth = load.bandwidth_bytes_per_second
    timing = (
        "not modelled (node-local NVMe)"
        if seconds is None or bandwidth is None
        else f"{seconds:,.1f} s at {bandwidth / GB:.2f} GB/s ({load.source.value})"
    )
    for key, value in (
        ("checkpoint", f"{_gb(load.checkpoint_bytes)}{estimated}"),
        ("read per node", _gb(load.node_read_bytes)),
        ("predicted load time", timing),
        ("host memory per node", f"{_gb(load.host_memory_bytes)} of {_gb(load.host_memory_limit_bytes)}"),
        ("node NVMe (S3 cache)", f"{_gb(load.node_disk_bytes)} of {_gb(load.node_disk_limit_bytes)}"),
        ("trained weights to", plan.output.uri if plan.output else "(not exported)"),
    ):
        table.add_row(key, value)
    console.print(table)


def _local_storage_line(plan: Plan, console: Console) -> None:
    """What each pod declares of its node's disk (ephemeral-storage request and limit) and the cache cap."""
    storage = plan.local_storage
    if storage is None:
        return
    source = "spec.cluster.localStorageGiB" if storage.from_spec else "estimate"
    console.print(
        f"Node-local disk per pod: {storage.limit_bytes // GIB:,} GiB ephemeral-storage ({source}); "
        f"/local sizeLimit {storage.volume_bytes // GIB:,} GiB, S3 cache at most "
        f"{storage.cache_max_bytes / GIB:,.1f} GiB"
    )


def global_batch_lines(plan: Plan, pinned: bool) -> list[str]:
    """Where the plan's global batch came from, and the manifest lines that pin it (docs/global-batch.md)."""
    tokens = plan.global_batch_tokens
    if pinned:
        return [
            f"Global batch: {tokens:,} tokens per step, pinned (spec.training.globalBatchTokens: {tokens})."
        ]
    return [
        f"Global batch: {tokens:,} tokens per step, chosen by the planner's rule from the model and the "
        "sequence length (docs/global-batch.md); the operator stores it with the job and keeps it. Pin it "
        "in the manifest with:",
        "  spec:",
        "    training:",
        f"      globalBatchTokens: {tokens}",
    ]


@app.command()
def plan(
    file: Annotated[
        Path | None, typer.Argument(help="BlackwellTrainingJob manifest; the embedded example if omitted.")
    ] = None,
    output: Annotated[
        PlanFormat, typer.Option("--output", "-o", help="table, json or yaml (json/yaml = status.plan).")
    ] = PlanFormat.TABLE,
    explain: Annotated[bool, typer.Option("--explain", help="Also print why each value was chosen.")] = False,
    calibration: CalibrationOption = DEFAULT_CALIBRATION,
    backend: BackendOption = None,
    cluster_calibration: ClusterCalibrationOption = None,
) -> None:
    """Plan a BTJ offline: the chosen configuration, memory, predicted throughput and alternatives."""
    cal = read_calibration(calibration)
    cluster = None if cluster_calibration is None else read_cluster_calibration(cluster_calibration)
    job = load_manifest_or_fail(file)
    spec, backend_note = resolve_offline(job.spec, backend)
    from blackwell_operator.cli.admit import admit

    result = admit(job, spec, shown_as=str(file or "the manifest"), calibration=cal, cluster=cluster)
    if output is PlanFormat.JSON:
        typer.echo(result.to_json())
    elif output is PlanFormat.YAML:
        typer.echo(yaml.safe_dump(json.loads(result.to_json()), sort_keys=False), nl=False)
    else:
        headroom = job.spec.tuning.memory_headroom
        console = table_console()
        render_plan_tables(result, console, explain=explain, headroom=headroom)
    batch = global_batch_lines(result, spec.training.global_batch_tokens is not None)
    if output is PlanFormat.TABLE:
        for line in batch:  # wrapped to the terminal, as the tables are; the YAML lines are short
            console.print(line, markup=False, highlight=False)
    else:
        typer.echo("\n".join(batch), err=True)
    typer.echo(backend_note, err=True)
    if explain and output is not PlanFormat.TABLE:
        for line in result.explanation:
            typer.echo(f"# {line}", err=True)


@app.command()
def presets() -> None:
    """List the model presets (name, parameters, shape, source)."""
    from blackwell_operator.catalogs import list_presets

    table = Table(title="Model presets")
    for col in ("preset", "model", "parameters", "h", "layers", "heads/kv", "ffn", "vocab", "tied"):
        table.add_column(col)
    for p in list_presets():
        a = p.architecture
        table.add_row(
            p.name,
            p.display_name,
            f"{p.parameter_count:,}",
            str(a.hidden_size),
            str(a.num_layers),
            f"{a.num_attention_heads}/{a.num_key_value_heads}",
            str(a.intermediate_size),
            str(a.vocab_size),
            "yes" if a.tie_word_embeddings else "no",
        )
    table_console().print(table)

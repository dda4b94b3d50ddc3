"""PNG pictures (matplotlib, Agg): measured vs predicted per scenario, and a BTJ's memory and throughput."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from blackwell_operator.calibrate.predict import Comparison, record_spec
from blackwell_operator.calibrate.records import Scenario
from blackwell_operator.calibration import Calibration
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import evaluate, plan_job
from blackwell_operator.planner.figures import limit_gib
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import (
    MEMORY_COMPONENTS,
    ActivationCheckpointing,
    Candidate,
    Plan,
    Precision,
    PrecisionRecipe,
    Sharding,
)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ladder(largest: int) -> list[int]:
    sizes = {1}
    m = 1
    while m < largest:
        m *= 2
        sizes.add(min(m, largest))
    return sorted(sizes | set(range(1, min(largest, 8) + 1)))


def plot_scenario(
    scenario: Scenario, comparisons: Sequence[Comparison], cal: Calibration, path: Path
) -> None:
    """Tokens/s and reserved memory against micro-batch, one colour per precision x AC; prediction dashed."""
    plt = _pyplot()
    fams: dict[tuple[str, str, str], list[Comparison]] = defaultdict(list)
    for c in comparisons:
        if c.record.scenario == scenario:
            k = c.record.candidate
            prec = k.precision.value if k.precision_recipe.value == "none" else k.precision_recipe.value
            fams[(prec, k.activation_checkpointing.value, k.sharding.value)].append(c)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.6))
    capacity = next(iter(fams.values()))[0].capacity_bytes / GIB if fams else 0.0
    for i, (fam, comps) in enumerate(sorted(fams.items())):
        color = f"C{i % 10}"
        label = f"{fam[0]} AC {fam[1]}" + ("" if fam[2] == "full" else f" shard {fam[2]}")
        comps.sort(key=lambda c: c.record.candidate.micro_batch_size)
        ran = [c for c in comps if c.record.ran]
        xs = [c.record.candidate.micro_batch_size for c in ran]
        ax_t.plot(xs, [c.record.tokens_per_second_per_gpu or 0 for c in ran], "o-", color=color, label=label)
        mem = [(c.record.candidate.micro_batch_size, c.record.peak_reserved_bytes or 0) for c in ran]
        mem = [(x, y) for x, y in mem if y > 0]
        ax_m.plot([x for x, _ in mem], [y / GIB for _, y in mem], "o-", color=color, label=label)
        for c in comps:
            if c.record.oom:
                ax_m.plot([c.record.candidate.micro_batch_size], [capacity], "x", color=color, markersize=10)
        # The prediction over the whole ladder, under the calibration being reported.
        ref = comps[0].record
        largest = max(c.record.candidate.micro_batch_size for c in comps)
        pred_x, pred_t, pred_m = [], [], []
        for m in _ladder(largest):
            cand = ref.candidate.model_copy(update={"micro_batch_size": m})
            ev = evaluate(record_spec(ref), cand, calibration=cal)
            pred_x.append(m)
            pred_t.append(ev.prediction.tokens_per_second_per_gpu)
            pred_m.append(ev.memory.allocator_reserved / GIB)
        ax_t.plot(pred_x, pred_t, "--", color=color, alpha=0.8)
        ax_m.plot(pred_x, pred_m, "--", color=color, alpha=0.8)
    if capacity:
        ax_m.axhline(capacity, color="grey", linestyle=":", label="GPU memory")
    for ax, ylabel in ((ax_t, "tokens/s per GPU"), (ax_m, "peak reserved GiB")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batch size")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    ax_t.set_title(f"{scenario.label()}: measured (solid) vs predicted (dashed)")
    ax_m.set_title(f"memory; x = measured OOM ({cal.name})")
    ax_m.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fallback_candidate(cal: Calibration) -> Candidate:
    return Candidate(
        precision=Precision.BF16,
        precision_recipe=PrecisionRecipe.NONE,
        activation_checkpointing=cal.trainer.activation_checkpointing[0],
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        sharding=Sharding.FULL,
        shard_degree=1,
        replicate_degree=1,
        loss_chunk_tokens=cal.trainer.loss_chunk_tokens,
    )


def _basis_words(plan: Plan | None) -> str:
    """What the picture's predicted figures rest on (a sweep with no plan is the model's alone)."""
    basis = "modelled" if plan is None else plan.prediction_basis
    if basis == "measured":
        return "fitted to runs measured on this GPU here"
    if basis == "unverified":
        return "modelled, not measured; a trainer path never ran here"
    if basis == "unknown":
        return "modelled; basis unknown"
    return "modelled, not measured"


def ac_label(cal: Calibration, ac: ActivationCheckpointing, recipe: PrecisionRecipe) -> str:
    """An AC mode's legend entry. A mode the trainer runs as another under `recipe` draws on top of that
    one's line: the entry says why."""
    runs_as = cal.trainer.modelled_checkpointing(ac, recipe)
    return f"AC {ac.value}" + ("" if runs_as is ac else f" (runs as {runs_as.value})")


def plot_btj(spec: BlackwellTrainingJobSpec, cal: Calibration, path: Path, title: str = "") -> str:
    """Plan memory breakdown, tokens/s and memory against micro-batch per AC mode; returns a summary."""
    plt = _pyplot()
    try:
        plan = plan_job(spec, calibration=cal)
        chosen, summary = plan.chosen, plan.explanation[0]
    except PlanningError as err:
        chosen, summary = _fallback_candidate(cal), f"no plan: {err.problem}"
        plan = None
    # The picture and its line travel alone (into a capacity request): what the figures rest on goes too.
    basis = _basis_words(plan)
    summary = f"{summary} ({basis})"
    # The pinned micro-batch would stop the sweep; sweep an unpinned copy of the spec.
    sweep_spec = spec.model_copy(deep=True)
    sweep_spec.tuning.micro_batch_size = "auto"
    fig, (ax_b, ax_t, ax_m) = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [1, 2, 2]})
    chosen_ev = evaluate(sweep_spec, chosen, calibration=cal)
    budget = limit_gib(chosen_ev.budget_bytes)  # rounded down, as the plan's tables show it
    bottom = 0.0
    mem = chosen_ev.prediction.memory
    for i, part in enumerate(MEMORY_COMPONENTS):
        value = getattr(mem, part) / GIB
        if value > 0:
            ax_b.bar([0], [value], bottom=[bottom], color=f"C{i % 10}", label=f"{part} {value:.1f}")
            bottom += value
    ax_b.axhline(budget, color="black", linestyle=":", label=f"budget {budget:.1f}")
    ax_b.set_xticks([])
    ax_b.set_ylabel("GiB per GPU")
    ax_b.set_title(f"memory at mbs {chosen.micro_batch_size} ({mem.peak_phase} peak)")
    ax_b.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.04))
    largest = max(16, 2 * chosen.micro_batch_size)
    for i, ac in enumerate(cal.trainer.activation_checkpointing):
        xs, tps, peaks, fits = [], [], [], []
        for m in _ladder(largest):
            cand = chosen.model_copy(update={"activation_checkpointing": ac, "micro_batch_size": m})
            ev = evaluate(sweep_spec, cand, calibration=cal)
            xs.append(m)
            tps.append(ev.prediction.tokens_per_second_per_gpu)
            peaks.append(ev.memory.peak_reserved / GIB)
            fits.append(ev.fits)
        color = f"C{i}"
        label = ac_label(cal, ac, chosen.precision_recipe)
        ax_t.plot(xs, tps, "-", color=color, label=label)
        ax_m.plot(xs, peaks, "-", color=color, label=label)
        for ax, ys in ((ax_t, tps), (ax_m, peaks)):
            ax.scatter(
                [x for x, f in zip(xs, fits, strict=True) if f],
                [y for y, f in zip(ys, fits, strict=True) if f],
                color=color,
                marker="o",
            )
            ax.scatter(
                [x for x, f in zip(xs, fits, strict=True) if not f],
                [y for y, f in zip(ys, fits, strict=True) if not f],
                color=color,
                marker="x",
            )
    if plan is not None:
        ax_t.plot(
            [chosen.micro_batch_size],
            [plan.predicted.tokens_per_second_per_gpu],
            "*",
            color="gold",
            markersize=18,
            markeredgecolor="black",
            label="chosen",
        )
    ax_m.axhline(budget, color="black", linestyle=":", label="budget")
    prec = chosen.precision.value + (
        "" if chosen.precision_recipe.value == "none" else f" {chosen.precision_recipe.value}"
    )
    for ax, ylabel in (
        (ax_t, f"predicted tokens/s per GPU\n({basis})"),
        (ax_m, f"predicted peak GiB per GPU\n({basis})"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batch size (o fits, x does not)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_title(f"{prec}, sharding {chosen.sharding.value}, CP {chosen.context_parallel}")
    ax_m.set_title(f"calibration {cal.name} ({cal.status})")
    fig.suptitle((title + ": " if title else "") + summary, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return summary

"""The calibration report: markdown tables, plots and the acceptance criteria, from records."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from blackwell_operator.calibrate.checks import DEFAULT_HEADROOM, CheckResult, ScenarioPick, Thresholds
from blackwell_operator.calibrate.coverage import LADDER_TOP, open_ladders
from blackwell_operator.calibrate.plots import plot_scenario
from blackwell_operator.calibrate.predict import Comparison
from blackwell_operator.calibrate.records import CalibrationRecord, Scenario, config_key, family_key
from blackwell_operator.calibration import Calibration
from blackwell_operator.units import GIB


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def _gib(b: float | None) -> str:
    return "" if b is None else f"{b / GIB:.1f}"


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_")


def _config_table(in_sample: Sequence[Comparison], held_out: Sequence[Comparison]) -> list[str]:
    held = {c.record.key: c for c in held_out}
    lines = [
        "| configuration | status | tok/s measured | predicted (fit) | err | predicted (LOO) | err | "
        "reserved GiB measured | predicted (fit) | err | predicted (LOO) | err | fits? (fit/LOO) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in in_sample:
        r, h = c.record, held.get(c.record.key)
        fits = f"{'yes' if c.predicted_fits else 'no'}/{'yes' if h and h.predicted_fits else 'no'}"
        measured_tps = _num(r.tokens_per_second_per_gpu) + (" (at cap)" if c.measured_at_capacity else "")
        lines.append(
            f"| {r.key} | {r.status.value} | {measured_tps} | {_num(c.predicted_tps)} | "
            f"{_pct(c.tps_error)} | {_num(h.predicted_tps if h else None)} | "
            f"{_pct(h.tps_error if h else None)} | "
            f"{_gib(r.peak_reserved_bytes)} | {_reserved(c)} | {_pct(c.reserved_error)} | "
            f"{_reserved(h)} | "
            f"{_pct(h.reserved_error if h else None)} | {fits} |"
        )
    return lines


def _reserved(c: Comparison | None) -> str:
    """Predicted pool, with the uncapped demand when it is over the room the allocator has."""
    if c is None:
        return ""
    if c.saturated and c.record.ran:
        return f"{_gib(c.predicted_reserved)} at cap (demand {_gib(c.reserved_demand)})"
    return _gib(c.reserved_demand)


def _pick_table(picks: Sequence[ScenarioPick], in_sample: Sequence[ScenarioPick]) -> list[str]:
    fitted = {p.scenario: p for p in in_sample}
    lines = [
        "| scenario | planner's pick (LOO) | its measured tok/s | best measured | best tok/s | ratio | "
        "pick with full fit | ratio | best within the budget (tok/s) | verdict (LOO) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in picks:
        f = fitted.get(p.scenario)
        pick_key = p.pick.record.key if p.pick else "none: nothing predicted to fit with the headroom"
        pick_tps = p.pick.record.tokens_per_second_per_gpu if p.pick and p.pick.record.ran else None
        picked = _num(pick_tps) if p.pick and p.pick.record.ran else ("OOM" if p.pick else "")
        best = p.best.key if p.best else ""
        f_key = f.pick.record.key if f and f.pick else ""
        f_ratio = f"{f.ratio:.1%}" if f and f.ratio is not None else ""
        ratio = f"{p.ratio:.1%}" if p.ratio is not None else ""
        verdict = "n/a" if p.best is None else "pass" if p.passed else "FAIL"
        if p.pick is None and p.best is not None:
            confirmed = " (refusal: every run measured over the budget)"
            verdict += confirmed if p.refusal_confirmed else " (refusal)"
        if p.partial:
            verdict += f" (on {p.families_measured} of {p.families_expected} families)"
        within = p.best_within_budget
        within_cell = "none"
        if within is not None:
            same = p.best is not None and within.key == p.best.key
            within_cell = "the best" if same else f"{within.key} ({_num(within.tokens_per_second_per_gpu)})"
        lines.append(
            f"| {p.scenario.label()} | {pick_key} | {picked} | {best} | "
            f"{_num(p.best.tokens_per_second_per_gpu if p.best else None)} | {ratio} | {f_key} | "
            f"{f_ratio} | {within_cell} | {verdict} |"
        )
    return lines


def _planner_table(records: Sequence[CalibrationRecord], cal: Calibration) -> list[str]:
    """plan_job's own choice per scenario (default headroom, any candidate) and whether it was measured."""
    from blackwell_operator.errors import PlanningError
    from blackwell_operator.planner import plan_job

    measured = {r.key: r for r in records}
    lines = [
        "| scenario | plan_job's choice | predicted tok/s | measured? | measured tok/s |",
        "|---|---|---|---|---|",
    ]
    firsts: dict[Scenario, CalibrationRecord] = {}
    for r in records:
        firsts.setdefault(r.scenario, r)
    for scenario, first in firsts.items():
        try:
            plan = plan_job(first.spec(memory_headroom=DEFAULT_HEADROOM), calibration=cal)
        except PlanningError as err:
            lines.append(f"| {scenario.label()} | no plan: {err.problem} | | | |")
            continue
        c = plan.chosen
        # The plan runs the single-device path where the profile's trainer takes it (planner.memory's rule).
        single = (
            cal.trainer.single_device_path
            and scenario.gpus == 1
            and c.context_parallel == 1
            and c.precision_recipe not in cal.trainer.eager_recipes
        )
        key = config_key(scenario.model, scenario.sequence_length, scenario.gpus, c, single_device=single)
        hit = measured.get(key)
        status = "no" if hit is None else hit.status.value
        tps = _num(hit.tokens_per_second_per_gpu) if hit else ""
        predicted = _num(plan.predicted.tokens_per_second_per_gpu)
        lines.append(f"| {scenario.label()} | {key} | {predicted} | {status} | {tps} |")
    return lines


def _coverage(records: Sequence[CalibrationRecord]) -> list[str]:
    families = {family_key(r) for r in records if r.source == "harness"}
    if not families:
        return []  # imported runs only: no ladders to account for
    lines = [
        "## Grid coverage",
        "",
        f"The harness doubles each family's micro-batch size until the first OOM (or mbs {LADDER_TOP}); "
        f"{len(families)} families.",
    ]
    gaps = open_ladders(records)
    if not gaps:
        return [*lines, "Every harness ladder reaches its first OOM or the top size.", ""]
    lines += [
        "",
        "Ladders that stop short: the next doubling was cut by a call's budget or not run, so the family's "
        "first OOM is not measured (the planner's prediction for it is shown):",
        "",
        "| family | largest that ran | next size | its status | next size predicted reserved GiB |",
        "|---|---|---|---|---|",
    ]
    for g in gaps:
        predicted = _gib(g.next_predicted_reserved)
        lines.append(f"| {g.family} | {g.largest_ran} | {g.next_size} | {g.next_status} | {predicted} |")
    return [*lines, ""]


def write_report(
    out_dir: Path,
    records: Sequence[CalibrationRecord],
    calibration: Calibration,
    check: CheckResult,
    *,
    commands: Sequence[str],
    title: str = "Calibration report",
    notes: Sequence[str] = (),
) -> Path:
    """Write report.md and one PNG per scenario under out_dir; return the markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = out_dir / "plots"
    plots.mkdir(exist_ok=True)
    gpus = sorted({r.gpu_name for r in records if r.gpu_name})
    dates = sorted({r.date[:10] for r in records if r.date})
    torch_versions = sorted({r.versions.torch for r in records if r.versions.torch})
    lines = [
        f"# {title}",
        "",
        f"Records: {len(records)} ({sum(r.ran for r in records)} ran, "
        f"{sum(r.oom for r in records)} OOM) from "
        f"{', '.join(sorted({r.source for r in records}))}; trainer(s) "
        f"{', '.join(sorted({r.trainer for r in records}))}; GPU {', '.join(gpus) or 'unknown'}; "
        f"dates {', '.join(dates) or 'unknown'}; torch {', '.join(torch_versions) or 'unknown'}.",
        f"Calibration reported: `{calibration.name}` ({calibration.status}). LOO = the scenario's prediction "
        "from a calibration refitted without any record of that scenario (model, sequence, GPU count).",
        "",
        "Reproduce:",
        "",
        "```",
        *commands,
        "```",
        "",
        *notes,
        "",
        # Each criterion's name carries its threshold; only the defaults are issue 6's.
        "## Acceptance criteria" + (" (issue 6)" if check.thresholds == Thresholds() else ""),
        "",
        "| criterion | verdict | detail |",
        "|---|---|---|",
        *[f"| {c.name} | {c.verdict} | {c.detail} |" for c in check.criteria],
        "",
        "The planner's pick is made among the scenario's measured configurations (the fastest predicted "
        "tokens/s among those predicted to fit with the planner's default memory headroom, "
        f"{DEFAULT_HEADROOM:.0%} of the GPU), so every pick has a measurement to be judged by. When none is "
        "predicted to fit, the planner refuses the job; that counts as a pass only when every configuration "
        "that ran also measured over the same budget (reserved pool + memory outside the allocator). "
        "The criterion compares with the best run whatever memory it used; the column 'best within the "
        "budget' names the fastest run that also measured within the planner's budget, the best it was "
        "allowed to choose.",
        "",
        "Reserved memory saturates: at the GPU's capacity PyTorch's caching allocator frees cached blocks "
        "and retries instead of growing, so a run whose predicted pool exceeds the room the allocator has "
        "is compared at that room (marked `at cap` below). Such runs are also the slow ones (release-and-"
        "retry in every step): their tokens/s is shown but not fitted. The planner never plans them, "
        "because it requires the predicted pool, not the capped one, to fit within its headroom.",
        "",
        *_coverage(records),
        "## Planner's choice vs best measured, per scenario",
        "",
        *_pick_table(check.picks, check.in_sample_picks),
        "",
        "## The planner's own choice (plan_job, default headroom, every candidate it may offer)",
        "",
        "With the reported calibration. Its choice may be a configuration the grid did not measure (another",
        "micro-batch size, a Transformer Engine recipe where the machine had only torchao, context",
        "parallelism): then it is judged only through the picks above.",
        "",
        *_planner_table([r for r in records if r.ran or r.oom], calibration),
        "",
        "## Predicted vs measured, per configuration",
        "",
        "Reserved memory is the caching allocator's pool (torch.cuda.max_memory_reserved) against the "
        "planner's allocator_reserved; 'fits?' compares the full predicted peak (pool + CUDA context + NCCL) "
        "with the GPU's memory.",
        "",
        *_config_table(check.in_sample, check.held_out),
        "",
        "## Plots",
        "",
    ]
    scenarios = list(dict.fromkeys(c.record.scenario for c in check.in_sample))
    for s in scenarios:
        name = f"{_slug(s.label())}.png"
        plot_scenario(s, check.in_sample, calibration, plots / name)
        lines += [f"![{s.label()}](plots/{name})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path

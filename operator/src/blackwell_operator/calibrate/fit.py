"""Least-squares fit of calibration constants to measured records (scipy.optimize.least_squares).

Every constant is a dotted path into the calibration (``memory.act_hidden``,
``throughput.recipes.9.none.efficiency``). Residuals are log ratios of prediction over measurement, so
each configuration weighs the same whatever its size. Memory constants are fitted to allocated and
reserved memory (and to measured OOMs, which must be predicted not to fit); throughput constants to
tokens/s. A weak pull towards the base value keeps constants the records cannot determine where they
were; constants no record is sensitive to are not touched at all and are reported as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from blackwell_operator.calibrate import PRIOR_WEIGHT
from blackwell_operator.calibrate.predict import Comparison, compare
from blackwell_operator.calibrate.records import CalibrationRecord
from blackwell_operator.calibration import Calibration
from blackwell_operator.calibration.profile import replace_constants

# Memory constants the records can determine: activation factors (by AC mode), the loss transient,
# workspace, allocator fragmentation and the optimizer-phase root copies. Not memory.full_hidden: full AC
# keeps exactly each block's bf16 input (2 bytes x h), and fitting it trades against the recompute
# transient (held out, 1B moved it to 2.34 and the transient factor to 1.09, both unphysical). Nor
# memory.chunked_loss_bytes_per_logit: the trainer's chunk holds exactly its bf16 logits and their bf16
# gradient (4 bytes), and only runs small enough for the loss to be the larger transient can see it
# (held out, 1B at 2048 moved it from 4.5 to 5.4 and its full-AC runs 6% over).
MEMORY_CONSTANTS = (
    "memory.act_hidden",
    "memory.act_ffn",
    "memory.selective_hidden",
    "memory.selective_ffn",
    "memory.outside_layers_hidden",
    "memory.recompute_transient_factor",
    "memory.recompute_saving_share",
    "memory.loss_bytes_per_logit",
    "memory.allocator_workspace_bytes",
    "memory.fragmentation_base_bytes",
    "memory.fragmentation_comm_bytes",
    "memory.fragmentation_dynamic",
    "memory.fragmentation_transient",
    "memory.fragmentation_gradients",
    "memory.fragmentation_optimizer",
    "memory.optimizer_phase_root_bytes",
)
# Throughput constants: GEMM efficiency per recipe seen (added per record), attention, memory-bound work,
# fixed per-step costs, recompute share and communication.
THROUGHPUT_CONSTANTS = (
    "throughput.attention_efficiency",
    "throughput.elementwise_bytes_hidden",
    "throughput.elementwise_bytes_ffn",
    "throughput.step_overhead_seconds",
    "throughput.eager_elementwise_factor",
    "throughput.fsdp_copy_bytes_per_param",
    "throughput.fsdp_regather_bytes_per_param",
    "throughput.single_device_cast_bytes_per_param",
    "throughput.gradient_accumulation_bytes_per_param",
    "throughput.selective_recompute_gemm_fraction",
    "throughput.comm_overlap",
    "throughput.comm_interference",
)
# Not throughput.nccl_bus_efficiency: within one node a collective's cost shows only through
# comm_interference / nccl_bus_efficiency, so fitting both is degenerate (two H200s drove it to 0.22 from
# one point); it keeps nccl-tests' bus bandwidth until runs across nodes can pin it.
# Upper bounds of constants that are fractions.
UPPER = {
    "efficiency": 1.0,
    "attention_efficiency": 1.0,
    "comm_overlap": 1.0,
    "comm_interference": 1.0,
    "nccl_bus_efficiency": 1.0,
    "selective_recompute_gemm_fraction": 1.0,
    "recompute_saving_share": 1.0,
    "full_recompute_share": 1.0,
}
# Scale of one unit of the fitted variable for constants whose base value is zero.
ZERO_SCALE = {"bytes": float(1 << 28), "seconds": 1e-3, "other": 0.1}
SENSITIVITY_FLOOR = 1e-4
# A measured OOM predicted to fit is the costliest error (a lost queue slot): weigh it as a near-constraint.
OOM_WEIGHT = 5.0
# A measured OOM must be predicted at least this much over the GPU's memory (the prior pulls back a little).
OOM_MARGIN = 0.03
ALLOCATED_WEIGHT = 0.5


def get_constant(cal: Calibration | dict[str, Any], path: str) -> float:
    """Value of a dotted constant."""
    node: Any = cal.model_dump(mode="json") if isinstance(cal, Calibration) else cal
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"no calibration constant {path!r} (e.g. memory.act_hidden)")
        node = node[part]
    return float(node)


def with_constants(cal: Calibration, values: dict[str, float]) -> Calibration:
    """A copy of the calibration with some dotted constants replaced."""
    data = cal.model_dump(mode="json")
    try:
        replace_constants(data, values, f"calibration {cal.name!r}")
    except ValueError as err:
        raise KeyError(str(err)) from None
    return Calibration.model_validate(data)


def default_constants(records: Sequence[CalibrationRecord], cal: Calibration, gpu_major: int) -> list[str]:
    """The constants worth offering to the fit for these records (the recipes they ran, on their GPU)."""
    recipes = sorted({r.candidate.precision_recipe.value for r in records})
    table = cal.throughput.recipes.get(str(gpu_major), {})
    # Eager recipes (Transformer Engine) keep the GEMM efficiency their isolated GEMM benchmark measured
    # (docs/reference/h200-measurements.md): their few end-to-end runs are slow for eager reasons, which the
    # fit explains through the eager elementwise factor instead of blaming the GEMMs.
    eager = {rc.value for rc in cal.trainer.eager_recipes}
    efficiencies = [
        f"throughput.recipes.{gpu_major}.{rc}.efficiency" for rc in recipes if rc in table and rc not in eager
    ]
    # Low-precision recipes' own memory: saved FP8 linear inputs and their weight copies.
    saving_table = {k.value: v for k, v in cal.memory.precision_activation_saving.items()}
    weight_table = {k.value: v for k, v in cal.memory.precision_weight_bytes.items()}
    savings = [f"memory.precision_activation_saving.{rc}" for rc in recipes if rc in saving_table]
    weights = [f"memory.precision_weight_bytes.{rc}" for rc in recipes if weight_table.get(rc)]
    return [*MEMORY_CONSTANTS, *savings, *weights, *efficiencies, *THROUGHPUT_CONSTANTS]


def constant_names(
    constants: Sequence[str] | None, records: Sequence[CalibrationRecord], cal: Calibration, gpu_major: int
) -> list[str]:
    """The constants a fit moves: the given ones, or the defaults for these records; names written
    ``+name`` are added to the defaults (a fit of one GPU that needs one more constant than the
    others, without restating the whole list)."""
    if constants is None:
        return default_constants(records, cal, gpu_major)
    added = [c[1:] for c in constants if c.startswith("+")]
    exact = [c for c in constants if not c.startswith("+")]
    if added and exact:
        raise KeyError(
            f"constants {exact} and +{added}: give either the whole list "
            "or only +names to add to the defaults"
        )
    if not added:
        return exact
    defaults = default_constants(records, cal, gpu_major)
    return defaults + [c for c in added if c not in defaults]


def is_memory_constant(path: str) -> bool:
    """Memory constants are fitted to memory, the others to throughput."""
    return path.startswith("memory.")


@dataclass(frozen=True)
class FittedConstant:
    """A constant the fit moved (or could not determine)."""

    name: str
    before: float
    after: float
    sensitivity: float
    points: int
    fitted: bool


@dataclass(frozen=True)
class Residuals:
    """Log-ratio residuals of one kind before and after the fit."""

    kind: str
    points: int
    rms_before: float
    rms_after: float
    worst_before: float
    worst_after: float


@dataclass
class FitResult:
    """The fitted calibration and what the fit did."""

    calibration: Calibration
    constants: list[FittedConstant] = field(default_factory=list)
    residuals: list[Residuals] = field(default_factory=list)
    records_used: int = 0
    iterations: int = 0

    @property
    def fitted(self) -> list[FittedConstant]:
        """Constants that were determined by the records."""
        return [c for c in self.constants if c.fitted]


def _residuals(c: Comparison, kind: str) -> list[float]:
    """Weighted log-ratio residuals of one record for one kind (memory or throughput)."""
    r = c.record
    out: list[float] = []
    if kind == "memory":
        if r.ran and r.peak_reserved_bytes:
            out.append(math.log(max(c.predicted_reserved, 1) / r.peak_reserved_bytes))
        if r.ran and r.peak_allocated_bytes:
            out.append(ALLOCATED_WEIGHT * math.log(max(c.predicted_allocated, 1) / r.peak_allocated_bytes))
        if r.oom:
            # Only penalised when predicted to fit (with a margin): a hinge just above the GPU's capacity.
            peak = max(c.evaluation.memory.peak_reserved, 1)
            out.append(OOM_WEIGHT * max(0.0, math.log(c.capacity_bytes * (1 + OOM_MARGIN) / peak)))
    elif r.ran and r.tokens_per_second_per_gpu and not c.measured_at_capacity:
        # (At the capacity the step time measures the allocator's release-and-retry, which the planner
        # avoids by its headroom rather than predicts.)
        out.append(math.log(max(c.predicted_tps, 1e-9) / r.tokens_per_second_per_gpu))
    return out


def _has_data(r: CalibrationRecord, kind: str) -> bool:
    if kind == "memory":
        return bool(r.oom or (r.ran and (r.peak_reserved_bytes or r.peak_allocated_bytes)))
    return bool(r.ran and r.tokens_per_second_per_gpu)


def _scale(path: str, base: float) -> float:
    if base:
        return abs(base)
    leaf = path.rsplit(".", 1)[-1]
    unit = "bytes" if leaf.endswith("bytes") else "seconds" if leaf.endswith("seconds") else "other"
    return ZERO_SCALE[unit]


class _Problem:
    """Residual vector of one kind as a function of the fitted variables x (value = base + scale * x)."""

    def __init__(
        self, records: list[CalibrationRecord], cal: Calibration, names: list[str], kind: str
    ) -> None:
        self.records, self.cal, self.names, self.kind = records, cal, names, kind
        self.base = np.array([get_constant(cal, n) for n in names])
        self.scale = np.array([_scale(n, b) for n, b in zip(names, self.base, strict=True)])
        self.upper = np.array([UPPER.get(n.rsplit(".", 1)[-1], math.inf) for n in names])

    def values(self, x: np.ndarray) -> dict[str, float]:
        v = np.clip(self.base + self.scale * x, 0.0, self.upper)
        return {n: float(val) for n, val in zip(self.names, v, strict=True)}

    def calibration(self, x: np.ndarray) -> Calibration:
        return with_constants(self.cal, self.values(x)) if self.names else self.cal

    def residuals(self, x: np.ndarray) -> np.ndarray:
        cal = self.calibration(x)
        out: list[float] = []
        for r in self.records:
            out.extend(_residuals(compare(r, cal), self.kind))
        return np.array(out)

    def jacobian(self, x: np.ndarray, r0: np.ndarray, step: float = 1e-3) -> np.ndarray:
        jac = np.zeros((len(r0), len(x)))
        for j in range(len(x)):
            xp = x.copy()
            # Step inward at an upper bound so the difference is not clipped to zero.
            at_top = self.base[j] + self.scale[j] * (x[j] + step) > self.upper[j]
            xp[j] += -step if at_top else step
            jac[:, j] = (self.residuals(xp) - r0) / (xp[j] - x[j])
        return jac


def _least_squares(problem: _Problem, prior: float, max_evaluations: int = 60) -> tuple[np.ndarray, int]:
    """Minimise |r(x)|^2 + prior |x|^2 within the bounds (scipy's dogbox trust-region solver).

    Dogbox, not the default trf: constants whose base sits on a bound (comm_interference at 0) make trf's
    strictly-interior steps vanish, and the throughput fit stopped at its start (rms unchanged).

    The prior is a weak pull towards the base values, appended to the residuals as sqrt(prior) * x. Each
    constant is bounded to [0, its upper bound]; in the fitted variable that is [-base/scale, ...]."""
    n = len(problem.names)
    weight = math.sqrt(prior)
    last: dict[bytes, np.ndarray] = {}  # the residuals at the last point, which the Jacobian starts from

    def residuals(x: np.ndarray) -> np.ndarray:
        r = problem.residuals(x)
        last.clear()
        last[x.tobytes()] = r
        return np.concatenate([r, weight * x])

    def jacobian(x: np.ndarray) -> np.ndarray:
        # Our forward differences, not scipy's: its relative step is zero at x = 0 (every constant's base),
        # and the planner's predictions do not move measurably under its fallback step of 1.5e-8.
        r = last.get(x.tobytes())
        r = problem.residuals(x) if r is None else r
        return np.vstack([problem.jacobian(x, r), weight * np.eye(n)])

    lower = (0.0 - problem.base) / problem.scale
    upper = (problem.upper - problem.base) / problem.scale
    solution = least_squares(
        residuals,
        np.zeros(n),
        jac=jacobian,
        bounds=(lower, upper),
        method="dogbox",
        ftol=1e-10,
        xtol=1e-10,
        gtol=1e-10,
        max_nfev=max_evaluations,
    )
    # njev: the solver's iterations (each takes one Jacobian).
    return np.asarray(solution.x), int(solution.njev or solution.nfev)


def _stats(r: np.ndarray) -> tuple[float, float]:
    if not len(r):
        return 0.0, 0.0
    return float(np.sqrt(np.mean(r**2))), float(np.max(np.abs(r)))


def fit_calibration(
    records: Sequence[CalibrationRecord],
    base: Calibration,
    constants: Sequence[str] | None = None,
    *,
    gpu_major: int = 9,
    prior_weight: float = PRIOR_WEIGHT,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Fit the constants the records determine; the others keep the base values."""
    usable = [r for r in records if r.ran or r.oom]
    names = constant_names(constants, usable, base, gpu_major)
    for n in names:
        get_constant(base, n)  # unknown names fail here, before any work
    result = FitResult(calibration=base, records_used=len(usable))
    cal = base
    for kind in ("memory", "throughput"):
        group = [n for n in names if is_memory_constant(n) == (kind == "memory")]
        data = [r for r in usable if _has_data(r, kind)]
        if not data:
            result.constants += [
                FittedConstant(n, get_constant(cal, n), get_constant(cal, n), 0.0, 0, False) for n in group
            ]
            continue
        full = _Problem(data, cal, group, kind)
        x0 = np.zeros(len(group))
        r0 = full.residuals(x0)
        jac = full.jacobian(x0, r0) if group else np.zeros((len(r0), 0))
        sens = np.sqrt(np.sum(jac**2, axis=0)) if group else np.zeros(0)
        points = np.sum(np.abs(jac) > 1e-6, axis=0) if group else np.zeros(0, dtype=int)
        chosen = [n for n, s in zip(group, sens, strict=True) if s > SENSITIVITY_FLOOR]
        problem = _Problem(data, cal, chosen, kind)
        x, iters = _least_squares(problem, prior_weight) if chosen else (np.zeros(0), 0)
        result.iterations += iters
        fitted_values = problem.values(x)
        r1 = problem.residuals(x)
        cal = problem.calibration(x)
        for n, s, p in zip(group, sens, points, strict=True):
            before = get_constant(base, n)
            result.constants.append(
                FittedConstant(n, before, fitted_values.get(n, before), float(s), int(p), n in fitted_values)
            )
        rms0, worst0 = _stats(r0)
        rms1, worst1 = _stats(r1)
        result.residuals.append(Residuals(kind, len(r0), rms0, rms1, worst0, worst1))
        if progress:
            progress(
                f"{kind}: {len(chosen)} constants from {len(r0)} residuals, rms {rms0:.3f} -> {rms1:.3f}"
            )
    result.calibration = cal
    return result

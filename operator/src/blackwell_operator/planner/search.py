"""Search: per family, find the largest micro-batch that fits, time the useful sizes, rank by tokens/s."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from blackwell_operator.calibration import Calibration
from blackwell_operator.calibration.cluster import Corrector
from blackwell_operator.planner.cluster_figures import Factors, corrected_peak, corrected_time, factors_of
from blackwell_operator.planner.layout import Hardware, Layout, Setting
from blackwell_operator.planner.memory import MemoryEstimate, estimate_memory
from blackwell_operator.planner.shapes import Shapes
from blackwell_operator.planner.throughput import TimeEstimate, estimate_time

# Micro-batch sizes timed per family when a global batch fixes the tokens per step.
SIZES_PER_FAMILY = 8
# Families (by rank) whose next, non-fitting micro-batch is timed for the alternatives.
TIMED_TOO_BIG = 12


@dataclass(frozen=True)
class Scored:
    """A fully evaluated candidate."""

    setting: Setting
    gradient_accumulation_steps: int
    memory: MemoryEstimate
    time: TimeEstimate | None
    fits: bool

    @property
    def tokens_per_second(self) -> float:
        """Predicted tokens/s per GPU (0 when not scored)."""
        return self.time.tokens_per_second_per_gpu if self.time else 0.0


@dataclass
class FamilyResult:
    """What the search learned about one family."""

    family: Setting
    max_fitting_mbs: int
    scored: list[Scored] = field(default_factory=list)
    first_too_big: Scored | None = None


@dataclass
class SearchResult:
    """All families, the ranked feasible candidates, and how many evaluations it took."""

    families: list[FamilyResult]
    ranked: list[Scored]
    evaluations: int

    @property
    def best(self) -> Scored | None:
        """The winner, if anything fits."""
        return self.ranked[0] if self.ranked else None


@dataclass
class Problem:
    """Everything fixed for one search."""

    shapes: Shapes
    hw: Hardware
    cal: Calibration
    sequence_length: int
    global_batch_tokens: int | None
    budget_bytes: float
    evaluations: int = 0
    # Factors learned on the user's cluster, per recipe family (calibration/cluster.py); None: the model.
    correct: Corrector | None = None
    # Per family, the largest micro-batch allowed (below one that ran out of memory: planner.correction).
    mbs_limits: dict[tuple[str, str, str, str, int], int] = field(default_factory=dict)
    # Packed chat rows (dataset.kind chat): attention through a document mask (FlexAttention).
    document_mask: bool = False
    # The global batch is the one stored with the job (status.globalBatch), not the spec's or the rule's.
    kept_batch: bool = False

    def tokens_per_micro_step(self, setting: Setting, mbs: int) -> int:
        """Tokens all data-parallel ranks process in one micro-step."""
        return mbs * self.sequence_length * (self.hw.world // setting.context_parallel)

    def max_mbs(self, setting: Setting) -> int:
        """Largest micro-batch the trainer and the global batch allow."""
        limit = min(self.cal.trainer.max_micro_batch_size, self.mbs_limits.get(setting.family, 1 << 30))
        if self.global_batch_tokens is not None:
            limit = min(limit, self.global_batch_tokens // self.tokens_per_micro_step(setting, 1))
        return limit

    def accumulation(self, setting: Setting, mbs: int) -> int:
        """Gradient accumulation steps nearest to the global batch (1 without one)."""
        if self.global_batch_tokens is None:
            return 1
        return max(1, round(self.global_batch_tokens / self.tokens_per_micro_step(setting, mbs)))

    def batch_ok(self, setting: Setting, mbs: int) -> bool:
        """Whether whole micro-batches of this size reach the global batch exactly: the user's number (or
        the rule's) is what trains, never one rounded to suit the micro-batch (docs/global-batch.md)."""
        if self.global_batch_tokens is None:
            return True
        got = self.accumulation(setting, mbs) * self.tokens_per_micro_step(setting, mbs)
        return got == self.global_batch_tokens

    _memo: dict[Setting, tuple[MemoryEstimate, int]] = field(default_factory=dict)
    _layouts: dict[tuple[str, int], Layout] = field(default_factory=dict)

    def layout(self, setting: Setting) -> Layout:
        """The setting's layout on the hardware (cached: it depends on sharding and CP only)."""
        key = (setting.sharding.value, setting.context_parallel)
        found = self._layouts.get(key)
        if found is None:
            found = self._layouts[key] = Layout.of(setting, self.hw)
        return found

    def memory(self, setting: Setting) -> tuple[MemoryEstimate, int]:
        """Memory of a setting and its accumulation steps (each setting is evaluated once)."""
        cached = self._memo.get(setting)
        if cached is None:
            self.evaluations += 1
            ga = self.accumulation(setting, setting.micro_batch_size)
            mem = estimate_memory(
                self.shapes,
                self.cal,
                setting,
                self.layout(setting),
                self.sequence_length,
                ga,
                self.hw.gpu.memory_bytes,
            )
            cached = self._memo[setting] = (mem, ga)
        return cached

    def factors(self, setting: Setting) -> Factors:
        """The tokens/s and peak memory factors of the setting's family on this cluster (1, 1 without)."""
        return factors_of(
            self.correct(setting.recipe, setting.activation_checkpointing) if self.correct else None
        )

    def within_budget(self, setting: Setting, mem: MemoryEstimate) -> bool:
        """Whether a predicted peak, corrected for what this cluster measured, fits the budget."""
        return corrected_peak(mem.peak_reserved, self.factors(setting)) <= self.budget_bytes

    def score(self, setting: Setting, accumulation: int | None = None) -> Scored:
        """Memory and time of a setting (with the accumulation that reaches the global batch, or as given)."""
        if accumulation is None:
            mem, ga = self.memory(setting)
        else:
            ga = accumulation
            layout = self.layout(setting)
            mem = estimate_memory(
                self.shapes, self.cal, setting, layout, self.sequence_length, ga, self.hw.gpu.memory_bytes
            )
        fits = self.within_budget(setting, mem)
        layout = self.layout(setting)
        time = estimate_time(
            self.shapes,
            self.cal,
            self.hw,
            setting,
            layout,
            self.sequence_length,
            ga,
            document_mask=self.document_mask,
        )
        # The cluster may run this family at another speed than the model says (planner/cluster_figures.py).
        time = corrected_time(time, self.factors(setting))
        return Scored(setting, ga, mem, time, fits)

    def fits(self, setting: Setting) -> bool:
        """Whether a setting's predicted peak fits the budget."""
        mem, _ = self.memory(setting)
        return self.within_budget(setting, mem)


def largest_fitting(problem: Problem, family: Setting, upper: int) -> int:
    """Largest micro-batch in [1, upper] that fits (0 if none): memory grows with the micro-batch.

    The backward phase's memory is piecewise affine in the micro-batch, so secant steps on it land on or
    next to the answer in one or two evaluations; bisection of the remaining bracket keeps it exact.
    """
    if upper < 1 or not problem.fits(family.with_mbs(1)):
        return 0
    if upper == 1 or not problem.fits(family.with_mbs(2)):
        return 1

    def backward(mbs: int) -> float:
        return float(problem.memory(family.with_mbs(mbs))[0].backward_reserved)

    lo, hi = 2, upper + 1  # invariant: lo fits, hi does not (or is past the limit)
    points = [(1, backward(1)), (2, backward(2))]
    for _ in range(4):
        (x0, v0), (x1, v1) = points[-2], points[-1]
        slope = (v1 - v0) / (x1 - x0) if x1 != x0 else 0.0
        guess = hi - 1 if slope <= 0 else int(x1 + (problem.budget_bytes - v1) // slope)
        guess = min(max(guess, lo + 1), hi - 1)
        if guess <= lo:
            break
        if problem.fits(family.with_mbs(guess)):
            lo = guess
            if guess + 1 < hi and not problem.fits(family.with_mbs(guess + 1)):
                hi = guess + 1
        else:
            hi = guess
            if guess - 1 > lo and problem.fits(family.with_mbs(guess - 1)):
                lo = guess - 1
        if hi - lo <= 1:
            break
        points.append((guess, backward(guess)))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if problem.fits(family.with_mbs(mid)):
            lo = mid
        else:
            hi = mid
    return lo


def sizes_to_time(problem: Problem, family: Setting, max_fit: int) -> list[int]:
    """Micro-batch sizes to time for a family.

    Without a global batch the time per token never rises with the micro-batch, so the largest fitting
    size is the family's best and the only one timed. With one, the sizes that reach it within the
    tolerance, fewest accumulation steps first (those amortise the per-micro-batch costs best): walking
    the accumulation steps a = a0, a0 + 1, ... and taking the floor, then the ceil, of the exact
    micro-batch G / (a * p) at each, until SIZES_PER_FAMILY are found or it falls below 0.5.

    That walk is solved, not stepped (a huge global batch makes it 2^30 steps and more): the step at
    which each size first appears has a closed form, so the work is bounded by the sizes (at most the
    trainer's largest micro-batch), never by the accumulation count.
    """
    if max_fit < 1:
        return []
    if problem.global_batch_tokens is None:
        return [max_fit]
    per_sequence = problem.tokens_per_micro_step(family, 1)
    tokens = problem.global_batch_tokens
    start = max(1, tokens // (max_fit * per_sequence))
    firsts: list[tuple[int, int, int]] = []  # (step it first appears at, 0 floor / 1 ceil, size)
    for mbs in range(1, max_fit + 1):
        found = first_step(tokens, per_sequence, start, mbs)
        if found is not None and problem.batch_ok(family, mbs):
            firsts.append((*found, mbs))
    sizes: list[int] = []
    last_step = None
    for step, _, mbs in sorted(firsts):
        # The walk checks its count before each step, so one step may add its floor and ceil both.
        if len(sizes) >= SIZES_PER_FAMILY and step != last_step:
            break
        sizes.append(mbs)
        last_step = step
    return sizes


def first_step(tokens: int, per_sequence: int, start: int, mbs: int) -> tuple[int, int] | None:
    """The first accumulation step a >= start at which `mbs` is the floor (0) or else the ceil (1) of the
    exact micro-batch tokens / (a * per_sequence) while that is at least 0.5; None when there is none.

    `mbs` is floor or ceil exactly while mbs - 1 < tokens / (a p) < mbs + 1: one run of steps, the first
    of which is the integer just above tokens / ((mbs + 1) p). The float arithmetic of the step-by-step
    walk can shift a run's edge by one step, so the first few candidates are checked with it.
    """
    step = max(start, tokens // ((mbs + 1) * per_sequence) + 1)
    if step > start:
        step -= 1  # the float walk may already round onto the run one step early
    for candidate in range(step, step + 4):
        exact = tokens / (candidate * per_sequence)
        if exact < 0.5 or exact < mbs - 1:
            return None  # past the run, or the walk ended: later steps only give smaller micro-batches
        if math.floor(exact) == mbs:
            return candidate, 0
        if math.ceil(exact) == mbs:
            return candidate, 1
    return None


def single_step_mbs(problem: Problem, family: Setting, upper: int) -> int:
    """The largest micro-batch up to `upper` that reaches the global batch with no accumulation (0: none)."""
    if problem.global_batch_tokens is None:
        return 0
    exact = problem.global_batch_tokens / problem.tokens_per_micro_step(family, 1)
    for mbs in sorted({math.ceil(exact), math.floor(exact)}, reverse=True):
        if 1 <= mbs <= upper and problem.accumulation(family, mbs) == 1 and problem.batch_ok(family, mbs):
            return mbs
    return 0


def run_search(problem: Problem, families: list[Setting], pinned_mbs: int | None = None) -> SearchResult:
    """Score every family and rank the feasible candidates by predicted tokens/s per GPU."""
    results: list[FamilyResult] = []
    feasible: list[Scored] = []
    for family in families:
        upper = problem.max_mbs(family)
        if pinned_mbs is not None:
            scored = problem.score(family.with_mbs(pinned_mbs))
            valid = pinned_mbs <= upper and problem.batch_ok(family, pinned_mbs)
            result = FamilyResult(family, pinned_mbs if scored.fits and valid else 0)
            if scored.fits and valid:
                result.scored.append(scored)
            else:
                result.first_too_big = scored
            results.append(result)
            feasible.extend(result.scored)
            continue
        max_fit = largest_fitting(problem, family, upper)
        single = single_step_mbs(problem, family, upper)
        if max_fit < single and problem.fits(family.with_mbs(single)):
            # Memory grows with the micro-batch except where accumulation ends: gradients held across
            # micro-steps cost more than the larger micro-batch that reaches the batch in one step (8B on
            # one H200 at two sequences: mbs 1 x 2 needs 158 GiB, mbs 2 x 1 fits in 134).
            max_fit = single
        result = FamilyResult(family, max_fit)
        for mbs in sizes_to_time(problem, family, max_fit):
            scored = problem.score(family.with_mbs(mbs))
            if scored.fits:
                result.scored.append(scored)
        if max_fit < upper:
            # Memory only for now (already evaluated by the search); timed below if it matters.
            too_big = family.with_mbs(max_fit + 1)
            mem, ga = problem.memory(too_big)
            result.first_too_big = Scored(too_big, ga, mem, None, False)
        results.append(result)
        feasible.extend(result.scored)
    ranked = sorted(feasible, key=_rank_key)
    # Time the next size up of the leading families: a faster setting that just misses the budget is
    # the most useful alternative to show.
    leaders = {s.setting.family for s in ranked[:TIMED_TOO_BIG]}
    for result in results:
        if result.first_too_big is not None and result.family.family in leaders:
            result.first_too_big = problem.score(result.first_too_big.setting)
    return SearchResult(results, ranked, problem.evaluations)


def _rank_key(s: Scored) -> tuple[float, int, int]:
    # Highest throughput first; ties go to less memory, then to the smaller micro-batch.
    return (-round(s.tokens_per_second, 6), s.memory.peak_reserved, s.setting.micro_batch_size)

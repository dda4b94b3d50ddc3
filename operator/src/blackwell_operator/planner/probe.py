"""A plan's probe section: which top candidates the trainer times before training, and whether it does."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from blackwell_operator.models.spec import AUTO, ProbeSpec
from blackwell_operator.planner.figures import gib
from blackwell_operator.planner.search import Scored
from blackwell_trainer.plan.config import (
    Candidate,
    Prediction,
    ProbeCandidate,
    ProbeGrowth,
    ProbePlan,
    ProbePolicy,
)

# A runner-up is probed when the model puts it within this share of the pick's tokens/s: the models were
# off by -9% to +6% on an unfitted calibration (docs/probe.md), so a closer one may well be faster.
PROBE_WITHIN = 0.05
# ... and when its predicted peak stays this share below the memory budget (which already keeps
# spec.tuning.memoryHeadroom free): a probe that runs out of memory costs its build and warm-up for
# nothing. The pick is probed regardless (it trains anyway).
FIT_MARGIN = 0.02
# The default budget: this share of the job's predicted run time, at most PROBE_BUDGET_CAP seconds.
PROBE_SHARE = 0.02
PROBE_BUDGET_CAP = 600.0
# Untimed and timed optimizer steps per candidate (ProbePlan's defaults, spelled once for the estimate).
WARMUP_STEPS = 2
TIMED_STEPS = 3
# Building, sharding and (with compile) compiling one candidate before its first step, seconds.
SETUP_SECONDS = {True: 45.0, False: 10.0}

Convert = Callable[[Scored], tuple[Candidate, Prediction]]


# Where a family's best size misses the margin: the smaller sizes tried, at most.
SHRINK_TRIES = 8
Shrink = Callable[[Scored, int], Scored | None]
# The larger micro-batches of each candidate's setting the plan carries (ProbePlan.growth), and how many of
# them one probe tries at most: the trainer tries one where a measured peak shows room (docs/probe.md).
GROWTH_SIZES = 2
GROWN_AT_MOST = 2
# A grown candidate needs its corrected peak within the memory budget itself (which keeps
# spec.tuning.memoryHeadroom free), not FIT_MARGIN below it: the correction rests on a measurement of the
# same setting, and one that measures over the budget is never chosen anyway. A margin would turn away the
# very sizes a fitted model picks (llama3.2-3b at sequence 3072 on one H200: its pick is 0.8% under).
GROWTH_MARGIN = 0.0
# Larger sizes looked at per candidate for GROWTH_SIZES that reach the global batch, at most.
GROWTH_TRIES = 64
# ... and only those predicted at most this multiple of the memory budget: a measured peak would have to
# be far further below its prediction than the worst over-prediction seen (23%, docs/probe.md) for more.
GROWTH_REACH = 1.3
# The larger sizes of a candidate's setting the search allows (global batch, trainer limit, OOM limits).
Larger = Callable[[Scored], Sequence[int]]


def probe_candidates(
    best: Scored, ranked: Sequence[Scored], budget_bytes: float, count: int, shrink: Shrink | None = None
) -> list[Scored]:
    """The pick, then the best of each other (recipe, AC) family within PROBE_WITHIN of it that fits with
    FIT_MARGIN, fastest first, `count` in all at most.

    The search fills the memory budget, so a family's best size is often too tight for the margin;
    `shrink(s, mbs)` scores the same setting at a smaller micro-batch (None where no global batch allows
    it), and the largest one with the margin stands for the family.
    """
    picks = [best]
    seen = {_family(best)}
    limit = (1.0 - FIT_MARGIN) * budget_bytes
    close = (1.0 - PROBE_WITHIN) * best.tokens_per_second
    for s in ranked:
        if len(picks) >= count:
            break
        if _family(s) in seen or not s.fits:
            continue
        if s.tokens_per_second < close:
            break  # ranked fastest first: nothing further is close enough
        seen.add(_family(s))
        found: Scored | None = s
        mbs = s.setting.micro_batch_size
        while found is not None and found.memory.peak_reserved > limit:
            mbs -= 1
            tried = mbs < 1 or s.setting.micro_batch_size - mbs > SHRINK_TRIES or shrink is None
            found = None if tried or shrink is None else shrink(s, mbs)
        if found is not None and found.tokens_per_second >= close:
            picks.append(found)
    picks[1:] = sorted(picks[1:], key=lambda s: -s.tokens_per_second)
    return picks


def _family(s: Scored) -> tuple[str, str]:
    return (s.setting.recipe.value, s.setting.activation_checkpointing.value)


def estimate_seconds(picks: Sequence[Scored]) -> float:
    """What probing `picks` takes: each one's build (and compile) plus its warm-up and timed steps."""
    total = 0.0
    for s in picks:
        step = s.time.step_time_seconds if s.time else 0.0
        total += SETUP_SECONDS[s.setting.compile] + (WARMUP_STEPS + TIMED_STEPS) * step
    return total


def larger_sizes(s: Scored, sizes: Sequence[int], score: Shrink, budget_bytes: float) -> list[Scored]:
    """Up to GROWTH_SIZES of `sizes` (larger micro-batches, ascending) that `score` scores (None: the global
    batch does not allow it), that the model predicts faster than `s` and at most GROWTH_REACH times the
    memory budget: what a measured peak below the prediction could let the probe try."""
    grown: list[Scored] = []
    for mbs in sizes[:GROWTH_TRIES]:
        found = score(s, mbs)
        if found is not None and found.memory.peak_reserved > GROWTH_REACH * budget_bytes:
            break  # memory only grows with the micro-batch
        if found is not None and found.tokens_per_second > s.tokens_per_second:
            grown.append(found)
            if len(grown) >= GROWTH_SIZES:
                break
    return grown


def probe_plan(
    spec: ProbeSpec,
    best: Scored,
    ranked: Sequence[Scored],
    *,
    budget_bytes: float,
    steps: int,
    measured: Callable[[Scored], bool],
    convert: Convert,
    shrink: Shrink | None = None,
    larger: Larger | None = None,
    tokens_factor: Callable[[Scored], float] = lambda s: 1.0,
) -> ProbePlan:
    """The plan's probe section under the spec's policy (docs/probe.md, "Policy")."""
    picks = probe_candidates(best, ranked, budget_bytes, spec.candidates, shrink)

    def option(s: Scored) -> ProbeCandidate:
        c, p = convert(s)
        return ProbeCandidate(candidate=c, prediction=p, measured=measured(s), tokens_factor=tokens_factor(s))

    candidates = [option(s) for s in picks]
    grown = [
        (i, g)
        for i, s in enumerate(picks)
        if larger is not None and shrink is not None
        for g in larger_sizes(s, larger(s), shrink, budget_bytes)
    ]
    growth = [ProbeGrowth(grows=i, **option(g).model_dump()) for i, g in grown]
    run_seconds = steps * (best.time.step_time_seconds if best.time else 0.0)
    estimate = estimate_seconds(picks)
    if spec.budget_seconds == AUTO:
        budget = min(PROBE_BUDGET_CAP, PROBE_SHARE * run_seconds)
        if spec.policy is ProbePolicy.ALWAYS:  # always probes: give it what its candidates need
            costliest = sorted((estimate_seconds([g]) for _, g in grown), reverse=True)[:GROWN_AT_MOST]
            budget = min(PROBE_BUDGET_CAP, max(budget, estimate + sum(costliest)))
    else:
        budget = float(spec.budget_seconds)
    if len(picks) == 1 and grown:
        # Nothing to compare, only a larger size to try: the probe is worth its time only if it reaches
        # at least the cheapest of them (`always` has already made room for the costliest).
        estimate += min(estimate_seconds([g]) for _, g in grown)
    enabled, reason = _decide(spec.policy, candidates, estimate, budget, grows=len(grown))
    return ProbePlan(
        policy=spec.policy,
        enabled=enabled,
        reason=reason,
        candidates=candidates,
        budget_seconds=round(budget, 1),
        warmup_steps=WARMUP_STEPS,
        timed_steps=TIMED_STEPS,
        memory_budget_bytes=int(budget_bytes),
        growth=growth if enabled else [],  # only a probe that runs tries them
        fit_margin=GROWTH_MARGIN,
        max_grown=GROWN_AT_MOST,
    )


def _decide(
    policy: ProbePolicy, candidates: Sequence[ProbeCandidate], estimate: float, budget: float, *, grows: int
) -> tuple[bool, str]:
    """Whether the trainer probes, and the one line that says why (or why not).

    A lone candidate with larger micro-batches to try (``grows``) is still worth a probe where it is
    modelled: on a GPU whose memory nothing measured yet, its measured peak is what lets the job train
    the larger size the model ruled out (issue 37's H100: +6.8% at 3B FP8 from micro-batch 3).
    """
    if policy is ProbePolicy.NEVER:
        return False, "spec.tuning.probe.policy is never"
    if len(candidates) < 2 and not grows:
        return False, (
            f"no other recipe or AC mode is predicted within {PROBE_WITHIN:.0%} of the pick with "
            f"{FIT_MARGIN:.0%} memory to spare, and no larger micro-batch to try: nothing to compare"
        )
    if policy is ProbePolicy.ALWAYS:
        many = len(candidates) > 1
        what = f"{len(candidates)} candidates" if many else f"the pick and {grows} larger size(s)"
        return True, f"spec.tuning.probe.policy is always: {what}, ~{estimate:.0f} s"
    if all(c.measured for c in candidates):
        return False, "every candidate's recipe and AC mode is measured (here or on this cluster)"
    if estimate > budget:
        return False, (
            f"the job is too short to pay for it: probing takes ~{estimate:.0f} s, its budget "
            f"({PROBE_SHARE:.0%} of the predicted run, at most {PROBE_BUDGET_CAP:.0f} s) is {budget:.0f} s"
        )
    modelled = sum(not c.measured for c in candidates)
    if len(candidates) < 2:
        return True, (
            f"the pick is modelled, not measured: its measured peak decides which of {grows} larger "
            f"micro-batch{'es' if grows > 1 else ''} to try, ~{estimate:.0f} s of a {budget:.0f} s budget"
        )
    return True, (
        f"{modelled} of {len(candidates)} candidates are modelled, not measured: ~{estimate:.0f} s of a "
        f"{budget:.0f} s budget"
    )


def describe_probe(probe: ProbePlan, describe: Callable[[Candidate], str]) -> list[str]:
    """The explanation's lines: whether it probes, then each candidate with its prediction."""
    head = "probe: " + ("on" if probe.enabled else "off") + f" ({probe.reason})"
    lines = [head]
    for i, c in enumerate(probe.candidates):
        p = c.prediction
        basis = "measured" if c.measured else "modelled"
        lines.append(
            f"probe candidate {i}{' (the pick)' if i == 0 else ''}: {describe(c.candidate)}, "
            f"{p.tokens_per_second_per_gpu:,.0f} tokens/s per GPU, peak {gib(p.memory.peak_reserved)} "
            f"predicted ({basis})"
        )
    by_candidate: dict[int, list[str]] = {}
    for g in probe.growth:
        by_candidate.setdefault(g.grows, []).append(
            f"mbs {g.candidate.micro_batch_size} (peak {gib(g.prediction.memory.peak_reserved)} predicted)"
        )
    if by_candidate and probe.enabled:
        grows = "; ".join(f"candidate {i} to " + ", ".join(sizes) for i, sizes in by_candidate.items())
        lines.append(
            f"probe growth (tried, {probe.max_grown} at most, where a candidate's measured peak corrects "
            f"these to within the memory budget): {grows}"
        )
    return lines

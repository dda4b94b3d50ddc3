"""Operator metrics (prometheus-client): reconcile duration, errors by reason, re-created children, BTJs by
phase, build info."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from blackwell_operator import __version__
from blackwell_operator.models.status import Phase

METRICS_PORT = 8080
# Reconciles plan in milliseconds and do a few API calls: buckets from 5 ms to 30 s.
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    """The operator's Prometheus series, in their own registry unless one is given."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.reconcile_duration = Histogram(
            "btj_operator_reconcile_duration_seconds",
            "Time to reconcile one BlackwellTrainingJob spec (plan, render, create or patch the child).",
            registry=self.registry,
            buckets=_DURATION_BUCKETS,
        )
        self.reconcile_errors = Counter(
            "btj_operator_reconcile_errors_total",
            "Reconciles that ended in an error, by reason (InvalidSpec, NoFeasiblePlan, ApiError, ...).",
            ["reason"],
            registry=self.registry,
        )
        self.children_recreated = Counter(
            "btj_operator_children_recreated_total",
            "Child jobs re-created because the recorded one was deleted before its BlackwellTrainingJob "
            "finished.",
            registry=self.registry,
        )
        self.replans = Counter(
            "btj_operator_replans_total",
            "BlackwellTrainingJobs re-planned with less memory after their trainer ran out of GPU memory.",
            registry=self.registry,
        )
        self.resizes = Counter(
            "btj_operator_resizes_total",
            "Elastic BlackwellTrainingJobs re-planned for another node count, by direction (shrink, grow).",
            ["direction"],
            registry=self.registry,
        )
        for direction in ("shrink", "grow"):  # exported from the start, so dashboards see zeros
            self.resizes.labels(direction=direction)
        self.jobs = Gauge(
            "btj_operator_jobs", "BlackwellTrainingJobs by phase.", ["phase"], registry=self.registry
        )
        self.build_info = Info("btj_operator_build", "Operator version.", registry=self.registry)
        self.build_info.info({"version": __version__})
        for phase in Phase:  # every phase exported from the start, so dashboards see zeros
            self.jobs.labels(phase=phase.value).set(0)
        self._phases: dict[str, str] = {}

    def record_error(self, reason: str) -> None:
        """Count one failed reconcile."""
        self.reconcile_errors.labels(reason=reason).inc()

    def observe_job(self, uid: str, phase: str | None) -> None:
        """Track a BTJ's current phase (None forgets it, e.g. when it is deleted)."""
        if phase is None:
            self._phases.pop(uid, None)
        else:
            self._phases[uid] = phase
        self._refresh()

    def _refresh(self) -> None:
        counts: dict[str, int] = {p.value: 0 for p in Phase}
        for phase in self._phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase, count in counts.items():
            self.jobs.labels(phase=phase).set(count)

    @property
    def phases(self) -> Mapping[str, str]:
        """uid -> phase of every BTJ seen."""
        return dict(self._phases)

    def exposition(self) -> bytes:
        """The text exposition format of this registry."""
        return bytes(generate_latest(self.registry))

"""The trainer's Prometheus exporter: measured throughput, MFU, loss and memory beside the prediction."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, make_wsgi_app

from blackwell_trainer import __version__
from blackwell_trainer.errors import PlanError
from blackwell_trainer.loop import metrics_server
from blackwell_trainer.plan import env_vars
from blackwell_trainer.plan import metric_names as names
from blackwell_trainer.plan.config import OomPhase, OomResult, Plan, ProbeResult
from blackwell_trainer.plan.env_vars import METRICS_ADDRESS_ENV

log = logging.getLogger(__name__)

# Optimizer-step times span ~50 ms (1B, short sequences) to minutes (70B with large accumulation).
STEP_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)


def is_local_rank_zero() -> bool:
    """One exporter per pod: only the process with LOCAL_RANK 0 (or a single process) serves."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def build_labels(plan: Plan) -> dict[str, str]:
    """The plan's settings as build_info labels (bounded: one value per job)."""
    chosen = plan.chosen
    return {
        "version": __version__,
        "job": plan.job_name,
        "model": plan.model_name,
        "gpu": plan.gpu.name,
        "instance_type": plan.instance_type,
        "nodes": str(plan.nodes),
        "gpus_per_node": str(plan.gpus_per_node),
        "sequence_length": str(plan.sequence_length),
        "precision": chosen.precision.value,
        "recipe": chosen.precision_recipe.value,
        "activation_checkpointing": chosen.activation_checkpointing.value,
        "micro_batch_size": str(chosen.micro_batch_size),
        "gradient_accumulation_steps": str(chosen.gradient_accumulation_steps),
        "sharding": chosen.sharding.value,
        "shard_degree": str(chosen.shard_degree),
        "replicate_degree": str(chosen.replicate_degree),
        "context_parallel": str(chosen.context_parallel),
        "compile": str(chosen.compile).lower(),
        "loss_chunk_tokens": str(chosen.loss_chunk_tokens),
        # What the predicted_* gauges rest on: the dashboard's legends carry it beside the figures.
        "prediction_basis": plan.prediction_basis,
    }


# The address /metrics binds: every address of the pod by default (a pod's network namespace holds only
# its loopback and its pod IP, where the operator's measure loop and Prometheus scrape it); an IP address
# (e.g. 127.0.0.1, to keep the metrics inside the pod, or `::` for IPv6) through spec.env. The check is
# env_vars', which admission runs on spec.env too.


def metrics_address() -> str:
    """The bind address of /metrics: BTJ_METRICS_ADDRESS, else every IPv4 address of the pod."""
    try:
        return env_vars.metrics_address(os.environ.get(METRICS_ADDRESS_ENV, ""))
    except ValueError as exc:
        raise PlanError(str(exc)) from None


class TrainerMetrics:
    """The metrics of one pod, in base units (Prometheus naming practice), registered on `registry`.

    Args:
        plan: the plan being executed; its prediction is exported beside the measurement.
        registry: where the metrics live; a private CollectorRegistry by default, so that tests
            and several instances in one process never collide on the global registry.
    """

    def __init__(self, plan: Plan, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.port: int | None = None
        self._server: Any = None
        self._probe_line: str | None = None  # served at PROBE_RESULT_PATH once the probe has chosen
        self._thread: threading.Thread | None = None  # the server's, joined by close()
        # Ranks of one pod step in lockstep on equal batches, so the pod's tokens are one rank's
        # tokens times the GPUs it serves (LOCAL_WORLD_SIZE under torchrun).
        self.gpus = int(os.environ.get("LOCAL_WORLD_SIZE", plan.gpus_per_node))
        self._lock = threading.Lock()
        self._declare_progress(self.registry)
        self._declare_memory(self.registry)
        self._declare_plan_figures(self.registry)
        self._declare_checkpoints(self.registry)
        self._declare_out_of_memory(self.registry)
        self._declare_probe(self.registry)
        self._pre_export(plan)

    def _declare_progress(self, r: CollectorRegistry) -> None:
        """Tokens, steps, step time, MFU and loss."""
        self.tokens = Counter(names.TOKENS, "Training tokens processed by this pod's GPUs.", registry=r)
        self.steps = Counter(names.STEPS, "Optimizer steps completed.", registry=r)
        # The counter restarts with the pod; progress needs the job's own step (resumed checkpoints count).
        self.step = Gauge(
            names.STEP,
            "The job's last completed optimizer step (1-based, across resumes).",
            registry=r,
        )
        self.steps_planned = Gauge(names.PLANNED_STEPS, "Optimizer steps the plan runs.", registry=r)
        self.step_duration = Histogram(
            names.STEP_DURATION,
            "Wall time of one optimizer step (all micro-batches).",
            buckets=STEP_DURATION_BUCKETS,
            registry=r,
        )
        self.gpus_gauge = Gauge(names.GPUS, "GPUs (trainer processes) this pod serves.", registry=r)
        self.mfu = Gauge(
            names.MFU,
            "Model FLOPs utilisation of the last step against the GPU's dense BF16 peak (0-1).",
            registry=r,
        )
        self.loss = Gauge(names.LOSS, "Training loss of the last step (mean over tokens).", registry=r)

    def _declare_memory(self, r: CollectorRegistry) -> None:
        """Local rank 0's peak memory and the allocator's retries."""
        self.memory_peak = Gauge(
            names.GPU_MEMORY_PEAK,
            "Peak GPU memory of local rank 0 since start, by allocator kind.",
            [names.MEMORY_KIND_LABEL],
            registry=r,
        )
        self.alloc_retries = Counter(
            names.GPU_ALLOC_RETRIES,
            "Times local rank 0's CUDA caching allocator found the GPU full and freed its cache to retry "
            "(torch.cuda.memory_stats num_alloc_retries): steps at the GPU's capacity, which run slowly.",
            registry=r,
        )
        self._alloc_retries_seen = 0

    def _declare_plan_figures(self, r: CollectorRegistry) -> None:
        """The plan's predictions, exported beside the measurements."""
        self.predicted_tokens = Gauge(
            names.PREDICTED_TOKENS_PER_SECOND,
            "The plan's predicted training tokens/s per GPU.",
            registry=r,
        )
        self.predicted_memory = Gauge(
            names.PREDICTED_MEMORY_PEAK,
            "The plan's predicted peak reserved GPU memory per GPU.",
            registry=r,
        )
        self.predicted_mfu = Gauge(
            names.PREDICTED_MFU,
            "The plan's predicted model FLOPs utilisation (0-1).",
            registry=r,
        )

    def _declare_checkpoints(self, r: CollectorRegistry) -> None:
        """Checkpoint saves, skips at resume and the initial weights load."""
        self.last_checkpoint = Gauge(
            names.LAST_CHECKPOINT,
            "Unix time of the last complete checkpoint; 0 until one is written.",
            registry=r,
        )
        self.checkpoint_failures = Counter(
            names.CHECKPOINT_FAILURES,
            "Interval checkpoint saves that failed (a full or failing checkpoint file system); training "
            "went on from the previous complete checkpoint.",
            registry=r,
        )
        self.checkpoints_skipped = Counter(
            names.CHECKPOINTS_SKIPPED,
            "Complete checkpoints skipped at resume: a file failed its size or CRC32 check, or the "
            "checkpoint did not load; the next older one was tried.",
            registry=r,
        )
        self.weights_load = Gauge(
            names.WEIGHTS_LOAD,
            "Seconds this pod's local rank 0 took to load the initial weights (plan.weights); 0 when it "
            "started from random init or resumed from the job's own checkpoint.",
            registry=r,
        )

    def _declare_out_of_memory(self, r: CollectorRegistry) -> None:
        """Out-of-memory stops by phase and how much was needed."""
        self.out_of_memory = Counter(
            names.OUT_OF_MEMORY,
            "CUDA out-of-memory errors that stopped this process, by phase (setup, forward, backward, "
            "optimizer); the termination message carries the details.",
            [names.OOM_PHASE_LABEL],
            registry=r,
        )
        self.out_of_memory_needed = Gauge(
            names.OUT_OF_MEMORY_NEEDED,
            "At least this much GPU memory was needed when it ran out (peak or live tensors plus the failed "
            "request, plus memory outside the allocator); 0 until it runs out.",
            registry=r,
        )

    def _declare_probe(self, r: CollectorRegistry) -> None:
        """The probe's candidates, winner and wall time, and the build info."""
        self.probe_tokens = Gauge(
            names.PROBE_TOKENS_PER_SECOND,
            "Each probe candidate's tokens/s per GPU, predicted and measured (the slowest rank's); the "
            "measured series is absent for a candidate that did not run or failed.",
            [names.PROBE_CANDIDATE_LABEL, names.PROBE_SOURCE_LABEL],
            registry=r,
        )
        self.probe_winner = Gauge(
            names.PROBE_WINNER,
            "The probe candidate this job trains with (its index in plan.probe.candidates, then in its "
            "growth); -1 without one.",
            registry=r,
        )
        self.probe_seconds = Gauge(
            names.PROBE_SECONDS, "Wall time of the probe before the first step; 0 without one.", registry=r
        )
        self.build_info = Info(names.BUILD, "Trainer version and the plan's settings.", registry=r)

    def _pre_export(self, plan: Plan) -> None:
        """Every series exported from the start (zeros until measured), so none goes missing."""
        self.gpus_gauge.set(self.gpus)
        self.step.set(0)
        self.steps_planned.set(plan.steps)
        for kind in names.MEMORY_KINDS:
            self.memory_peak.labels(kind).set(0)  # positional: the label is named once
        self.predicted_tokens.set(plan.predicted.tokens_per_second_per_gpu)
        self.predicted_memory.set(plan.predicted.memory.peak_reserved)
        self.predicted_mfu.set(plan.predicted.model_flops_utilization)
        self.last_checkpoint.set(0)
        self.weights_load.set(0)
        for phase in OomPhase:
            self.out_of_memory.labels(phase.value)
        self.out_of_memory_needed.set(0)
        self.probe_winner.set(-1)
        self.probe_seconds.set(0)
        self.build_info.info(build_labels(plan))

    def serve(self, port: int) -> None:
        """Serve /metrics on `port` (0 picks a free one, see `.port`), from local rank 0 only, at the
        address BTJ_METRICS_ADDRESS names (metrics_address())."""
        if not is_local_rank_zero():
            return
        address = metrics_address()
        try:
            # A bounded pool of threads, each connection bounded in time (metrics_server.py).
            self._server, self._thread = metrics_server.start(address, port, self._app())
        except OSError as err:
            raise RuntimeError(
                f"cannot serve metrics on {address} port {port}: {err}; set metricsPort in the plan to a "
                f"free port, or {METRICS_ADDRESS_ENV} to an address of the pod"
            ) from err
        self.port = int(self._server.server_port)
        log.info("serving Prometheus metrics on %s:%d/metrics", address, self.port)

    def _app(self) -> Callable[..., Iterable[bytes]]:
        """/metrics (Prometheus), and PROBE_RESULT_PATH: the probe's result line once it has chosen."""
        metrics = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") != names.PROBE_RESULT_PATH:
                served: Iterable[bytes] = metrics(environ, start_response)
                return served
            line = self._probe_line
            if line is None:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"no probe result\n"]
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{line}\n".encode()]

        return app

    def close(self) -> None:
        """Stop the HTTP server, if serving, and join its thread (none of ours outlives the run)."""
        if self._server is not None:
            self._server.shutdown()  # returns once serve_forever() has: the thread ends right after
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def record_step(
        self,
        *,
        tokens: int,
        step_seconds: float,
        loss: float,
        mfu: float,
        peak_allocated_bytes: int,
        peak_reserved_bytes: int,
        alloc_retries: int = 0,
        step: int | None = None,
    ) -> None:
        """Record one optimizer step.

        Args:
            tokens: tokens this rank processed in the step (micro-batch x sequence x accumulation);
                the pod counter adds them once per GPU the pod serves.
            step_seconds: wall time of the step.
            loss: the step's loss.
            mfu: model FLOPs utilisation of the step, 0-1.
            peak_allocated_bytes: torch.cuda.max_memory_allocated() (0 on CPU).
            peak_reserved_bytes: torch.cuda.max_memory_reserved() (0 on CPU).
            alloc_retries: the allocator's cumulative num_alloc_retries since start (0 on CPU).
            step: the job's step number just completed (counting steps before a resume).
        """
        with self._lock:
            self.tokens.inc(tokens * self.gpus)
            self.steps.inc()
            self.step_duration.observe(step_seconds)
            self.loss.set(loss)
            self.mfu.set(mfu)
            if step is not None:
                self.step.set(step)
            self.memory_peak.labels(names.ALLOCATED).set(peak_allocated_bytes)
            self.memory_peak.labels(names.RESERVED).set(peak_reserved_bytes)
            if alloc_retries > self._alloc_retries_seen:
                self.alloc_retries.inc(alloc_retries - self._alloc_retries_seen)
                self._alloc_retries_seen = alloc_retries

    def record_checkpoint(self, timestamp: float) -> None:
        """Record the Unix time at which a complete checkpoint was written."""
        self.last_checkpoint.set(timestamp)

    def record_checkpoint_skipped(self) -> None:
        """Count one checkpoint that resuming skipped (it did not verify or did not load)."""
        self.checkpoints_skipped.inc()

    def record_checkpoint_failure(self) -> None:
        """Count one interval checkpoint save that failed on some rank (training went on)."""
        self.checkpoint_failures.inc()

    def record_weights_load(self, seconds: float) -> None:
        """Record how long loading the initial weights took."""
        self.weights_load.set(seconds)

    def record_probe(self, plan: Plan, result: ProbeResult) -> None:
        """Record the probe's figures and winner; the prediction and settings become the winner's."""
        with self._lock:
            for m in result.measurements:
                index = str(m.index)
                self.probe_tokens.labels(index, names.PREDICTED).set(m.predicted_tokens_per_second_per_gpu)
                if m.tokens_per_second_per_gpu is not None:
                    self.probe_tokens.labels(index, names.MEASURED).set(m.tokens_per_second_per_gpu)
            self.probe_winner.set(result.winner)
            self.probe_seconds.set(result.seconds)
            self._probe_line = result.to_line()
            if plan.probe is not None and result.winner < len(plan.probe.options):
                won = plan.probe.options[result.winner]
                self.predicted_tokens.set(won.prediction.tokens_per_second_per_gpu)
                self.predicted_memory.set(won.prediction.memory.peak_reserved)
                self.predicted_mfu.set(won.prediction.model_flops_utilization)
                self.build_info.info(build_labels(plan.model_copy(update={"chosen": won.candidate})))

    def record_out_of_memory(self, result: OomResult) -> None:
        """Record the out-of-memory error that stops this process."""
        with self._lock:
            self.out_of_memory.labels(result.phase.value).inc()
            self.out_of_memory_needed.set(result.needed_bytes)

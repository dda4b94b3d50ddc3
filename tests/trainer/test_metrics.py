"""TrainerMetrics: names, types and values as Prometheus scrapes them over real HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from blackwell_trainer.loop.metrics import TrainerMetrics
from blackwell_trainer.plan import metric_names
from blackwell_trainer.plan.config import Plan, ProbeResult
from tests.support.plans import probed_plan
from tests.support.probe_results import measured_probe

# Family name (as the parser reports it: counters without _total) -> type.
EXPECTED_TYPES = {
    "btj_trainer_tokens": "counter",
    "btj_trainer_steps": "counter",
    "btj_trainer_step_duration_seconds": "histogram",
    "btj_trainer_gpus": "gauge",
    "btj_trainer_model_flops_utilization_ratio": "gauge",
    "btj_trainer_loss": "gauge",
    "btj_trainer_gpu_memory_peak_bytes": "gauge",
    "btj_trainer_gpu_alloc_retries": "counter",
    "btj_trainer_predicted_tokens_per_second": "gauge",
    "btj_trainer_predicted_memory_peak_bytes": "gauge",
    "btj_trainer_predicted_model_flops_utilization_ratio": "gauge",
    "btj_trainer_last_checkpoint_timestamp_seconds": "gauge",
    "btj_trainer_checkpoint_failures": "counter",
    "btj_trainer_checkpoints_skipped": "counter",
    "btj_trainer_weights_load_seconds": "gauge",
    # An Info metric: the classic text format exposes it as a gauge of value 1 named *_info.
    "btj_trainer_build_info": "gauge",
}


def scrape(port: int) -> dict[str, Metric]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family: Metric, sample_name: str, **labels: str) -> float:
    for sample in family.samples:
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    raise AssertionError(f"no sample {sample_name}{labels} in {family.samples}")


@pytest.fixture
def served(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> Iterator[TrainerMetrics]:
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    metrics = TrainerMetrics(plan)
    metrics.serve(0)
    assert metrics.port
    yield metrics
    metrics.close()


def test_every_series_is_exported_before_the_first_step(served: TrainerMetrics) -> None:
    assert served.port is not None
    families = scrape(served.port)
    assert {name: families[name].type for name in EXPECTED_TYPES if name in families} == EXPECTED_TYPES
    assert value(families["btj_trainer_tokens"], "btj_trainer_tokens_total") == 0
    assert value(families["btj_trainer_gpus"], "btj_trainer_gpus") == 2
    for kind in ("allocated", "reserved"):
        assert (
            value(
                families["btj_trainer_gpu_memory_peak_bytes"], "btj_trainer_gpu_memory_peak_bytes", kind=kind
            )
            == 0
        )
    assert (
        value(families["btj_trainer_predicted_tokens_per_second"], "btj_trainer_predicted_tokens_per_second")
        == 1234.5
    )
    assert (
        value(families["btj_trainer_predicted_memory_peak_bytes"], "btj_trainer_predicted_memory_peak_bytes")
        == 8e6
    )


def test_steps_and_checkpoints_show_in_the_scrape(served: TrainerMetrics) -> None:
    for loss in (5.0, 4.0, 3.5):
        served.record_step(
            tokens=128,
            step_seconds=0.3,
            loss=loss,
            mfu=0.4,
            peak_allocated_bytes=100,
            peak_reserved_bytes=200,
        )
    served.record_checkpoint(1_700_000_000.0)
    assert served.port is not None
    families = scrape(served.port)
    assert (
        value(families["btj_trainer_tokens"], "btj_trainer_tokens_total") == 3 * 128 * 2
    )  # 2 GPUs in the pod
    assert value(families["btj_trainer_steps"], "btj_trainer_steps_total") == 3
    duration = families["btj_trainer_step_duration_seconds"]
    assert value(duration, "btj_trainer_step_duration_seconds_count") == 3
    assert value(duration, "btj_trainer_step_duration_seconds_sum") == pytest.approx(0.9)
    assert value(duration, "btj_trainer_step_duration_seconds_bucket", le="0.25") == 0
    assert value(duration, "btj_trainer_step_duration_seconds_bucket", le="0.5") == 3
    assert value(families["btj_trainer_loss"], "btj_trainer_loss") == 3.5
    assert (
        value(
            families["btj_trainer_model_flops_utilization_ratio"], "btj_trainer_model_flops_utilization_ratio"
        )
        == 0.4
    )
    peak = families["btj_trainer_gpu_memory_peak_bytes"]
    assert value(peak, "btj_trainer_gpu_memory_peak_bytes", kind="reserved") == 200
    last = families["btj_trainer_last_checkpoint_timestamp_seconds"]
    assert value(last, "btj_trainer_last_checkpoint_timestamp_seconds") == 1_700_000_000.0


def test_build_info_carries_the_plan_settings(served: TrainerMetrics) -> None:
    assert served.port is not None
    (sample,) = scrape(served.port)["btj_trainer_build_info"].samples
    assert sample.name == "btj_trainer_build_info" and sample.value == 1
    assert sample.labels["precision"] == "bf16"
    assert sample.labels["activation_checkpointing"] == "none"
    assert sample.labels["micro_batch_size"] == "4"
    assert sample.labels["sharding"] == "full"
    assert sample.labels["model"] == "custom"
    assert sample.labels["compile"] == "false"
    assert sample.labels["version"]


def test_only_local_rank_zero_serves(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    metrics = TrainerMetrics(plan)
    metrics.serve(0)
    assert metrics.port is None


def test_instances_do_not_share_a_registry(plan: Plan) -> None:
    # A private registry by default: two exporters in one process (tests, restarts) never collide.
    first, second = TrainerMetrics(plan), TrainerMetrics(plan)
    assert first.registry is not second.registry
    shared = CollectorRegistry()
    TrainerMetrics(plan, registry=shared)
    assert shared.get_sample_value("btj_trainer_gpus") is not None


def test_a_busy_port_is_a_clear_error(served: TrainerMetrics, plan: Plan) -> None:
    with pytest.raises(RuntimeError, match="metricsPort"):
        TrainerMetrics(plan).serve(served.port or 0)


def test_allocator_retries_count_up_from_the_cumulative_value(served: TrainerMetrics) -> None:
    # The allocator reports a running total; the counter adds what is new and never goes back.
    for total in (0, 0, 3, 3, 7, 5):
        served.record_step(
            tokens=1,
            step_seconds=0.1,
            loss=1.0,
            mfu=0.1,
            peak_allocated_bytes=1,
            peak_reserved_bytes=1,
            alloc_retries=total,
        )
    assert served.port is not None
    families = scrape(served.port)
    assert value(families["btj_trainer_gpu_alloc_retries"], "btj_trainer_gpu_alloc_retries_total") == 7


def test_a_full_gpu_is_logged_once_per_new_burst(caplog: pytest.LogCaptureFixture) -> None:
    from blackwell_trainer.loop.step_report import warn_at_capacity

    with caplog.at_level("WARNING", logger="blackwell_trainer"):
        warned = 0
        for step, total in enumerate((0, 0, 2, 2, 2, 5), start=1):
            warned = warn_at_capacity(total, warned, step)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and warned == 5
    assert "step 3: the GPU was full 2 time(s)" in messages[0]
    assert "spec.tuning.memoryHeadroom" in messages[1]


def test_the_weights_load_time_is_exported(served: TrainerMetrics) -> None:
    family = "btj_trainer_weights_load_seconds"
    assert value(scrape(served.port)[family], family) == 0  # random init or resume: nothing loaded
    served.record_weights_load(12.5)
    assert value(scrape(served.port)[family], family) == 12.5


def test_the_bind_address_is_an_option_of_the_pod(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """BTJ_METRICS_ADDRESS (spec.env) picks the address /metrics binds; unset, every address of the pod."""
    from blackwell_trainer.errors import PlanError
    from blackwell_trainer.loop.metrics import METRICS_ADDRESS_ENV, metrics_address

    monkeypatch.delenv(METRICS_ADDRESS_ENV, raising=False)
    assert metrics_address() == "0.0.0.0"  # today's behaviour: the operator scrapes the pod IP
    monkeypatch.setenv(METRICS_ADDRESS_ENV, "127.0.0.1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    metrics = TrainerMetrics(plan)
    metrics.serve(0)
    try:
        assert metrics._server is not None and metrics._server.server_address[0] == "127.0.0.1"
        assert metric_names.STEP in scrape(metrics.port)
    finally:
        metrics.close()
    monkeypatch.setenv(METRICS_ADDRESS_ENV, "pod-ip")
    with pytest.raises(
        PlanError, match=r"BTJ_METRICS_ADDRESS='pod-ip' is not an IP address\. Fix: set it in"
    ):
        TrainerMetrics(plan).serve(0)


def test_idle_connections_hold_a_bounded_number_of_threads(
    plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 idle connections (issue 36: once 302 threads): at most metrics_server.WORKERS are served, the
    rest closed at once, and a connection that sends nothing is let go after its read timeout."""
    import socket
    import threading
    import time

    from blackwell_trainer.loop import metrics_server

    monkeypatch.setattr(metrics_server._Handler, "timeout", 1.0)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    before = threading.active_count()
    metrics = TrainerMetrics(plan)
    metrics.serve(0)
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            conn = socket.create_connection(("127.0.0.1", int(metrics.port or 0)), timeout=10)
            idle.append(conn)
        # Every connection is answered, in time: served (then let go after its timeout) or closed at once.
        for conn in idle:
            assert conn.recv(1) == b""  # EOF; a thread-per-connection server never sends it
        during = threading.active_count()
        assert during <= before + metrics_server.WORKERS + 1, during  # the pool and the accept thread
        deadline = time.monotonic() + 30
        while True:  # a scraper is served again once the idle connections are gone
            try:
                assert metric_names.STEP in scrape(int(metrics.port or 0))
                break
            except OSError:
                assert time.monotonic() < deadline, "no scrape served after the idle connections"
                time.sleep(0.1)
    finally:
        for conn in idle:
            conn.close()
        metrics.close()


def test_the_probe_result_is_served_beside_the_metrics_once_the_probe_has_chosen(
    served: TrainerMetrics,
) -> None:
    url = f"http://127.0.0.1:{served.port}{metric_names.PROBE_RESULT_PATH}"
    with pytest.raises(urllib.error.HTTPError) as before:
        urllib.request.urlopen(url, timeout=10)
    assert before.value.code == 404  # still probing, or no probe: nothing to take yet
    plan = probed_plan()
    assert plan.probe is not None
    result = measured_probe(plan, speed=[0.9, 1.0], peak=lambda c: 0.9 * c.prediction.memory.peak_reserved,
                            winner=1, seconds_each=50.0, seconds=104.0)  # fmt: skip
    served.record_probe(plan, result)
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    # The termination message's very line, which the operator parses the same way.
    assert text == f"{result.to_line()}\n" and ProbeResult.find(text) == result
    assert (
        "btj_trainer_probe_winner"
        in urllib.request.urlopen(f"http://127.0.0.1:{served.port}/metrics", timeout=10).read().decode()
    )

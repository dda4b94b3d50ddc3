"""status.measured: the operator reads a running trainer pod's /metrics (real HTTP) beside the plan.

Pure tests of lifecycle.measure and the status change, then the real operator under KopfRunner
scraping the trainer's own metrics exporter (blackwell_trainer.loop.metrics) over HTTP.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import generate_latest

from blackwell_operator.handlers.measure import INTERVAL_ENV, PROBE_BYTES, measure_interval
from blackwell_operator.lifecycle.measure import (
    Reading,
    metrics_endpoint,
    parse_reading,
    tokens_per_second_per_gpu,
)
from blackwell_operator.lifecycle.measured import measured_changes
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.lifecycle.status_patch import status_patch
from blackwell_operator.lifecycle.writers import MEASURE_LOOP
from blackwell_trainer.loop.metrics import TrainerMetrics
from blackwell_trainer.plan.config import ProbeResult
from blackwell_trainer.plan.metric_names import PROBE_RESULT_PATH
from tests.operator.harness import Cluster, btj, running_operator, wait_for
from tests.support.plans import probed_plan, tiny_plan
from tests.support.pods import container, pod, pod_status
from tests.support.probe_results import measured_probe

STEP = dict(step_seconds=0.5, loss=2.0, peak_allocated_bytes=0, peak_reserved_bytes=0)


@pytest.fixture
def trainer_metrics(monkeypatch: pytest.MonkeyPatch) -> Iterator[TrainerMetrics]:
    """The trainer's exporter for a pod serving 2 GPUs, on a free port."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    metrics = TrainerMetrics(tiny_plan())
    metrics.serve(0)
    yield metrics
    metrics.close()


def _running(
    name: str, port: int, ip: str = "127.0.0.1", owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    body = pod(name, owner=owner)
    body["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    body["status"] = pod_status(container(), podIP=ip)
    return body


# ----- the pure part ---------------------------------------------------------------------------------------


def test_a_reading_of_the_trainer_s_own_exposition(trainer_metrics: TrainerMetrics) -> None:
    trainer_metrics.record_step(tokens=4096, mfu=0.41, step=7, **{**STEP, "peak_reserved_bytes": 3 << 30})
    reading = parse_reading(generate_latest(trainer_metrics.registry).decode(), at=10.0)
    plan = tiny_plan()
    assert reading == Reading(
        at=10.0,
        tokens=8192.0,
        gpus=2,
        mfu=0.41,
        step=7,
        planned_steps=plan.steps,
        pod_steps=1,
        reserved_bytes=3 << 30,
        probe_winner=None,  # the gauge's -1: no probe
        predicted_tokens_per_second=plan.predicted.tokens_per_second_per_gpu,
        predicted_peak_reserved=plan.predicted.memory.peak_reserved,
    )
    assert parse_reading("# not a trainer\nup 1\n", at=0.0) is None


def test_a_probed_pod_s_reading_names_its_winner_and_the_winner_s_prediction(
    trainer_metrics: TrainerMetrics,
) -> None:
    plan = probed_plan()
    assert plan.probe is not None
    won = plan.probe.options[1]
    trainer_metrics.record_probe(plan, ProbeResult(winner=1, chosen=won.candidate, seconds=90.0))
    trainer_metrics.record_step(tokens=4096, mfu=0.41, step=7, **STEP)
    reading = parse_reading(generate_latest(trainer_metrics.registry).decode(), at=10.0)
    assert reading is not None and reading.probe_winner == 1
    # Through the text exposition and back: the very figures of the plan, which the operator compares.
    assert reading.predicted_tokens_per_second == won.prediction.tokens_per_second_per_gpu
    assert reading.predicted_peak_reserved == won.prediction.memory.peak_reserved


def test_a_count_beyond_what_a_gauge_counts_is_not_a_count() -> None:
    # A step gauge of 1e300 became a 300-digit int in status.progress, which a real API server's int64
    # refuses, and with it the whole status write (status.measured too).
    text = (
        "btj_trainer_tokens_total 4096\nbtj_trainer_gpus 1\n"
        "btj_trainer_step 1e300\nbtj_trainer_planned_steps 1e18\n"
    )
    reading = parse_reading(text, at=0.0)
    assert reading is not None and reading.tokens == 4096.0
    assert reading.step is None and reading.planned_steps is None


async def test_one_job_s_surprise_does_not_cost_the_jobs_after_it_their_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The measure round's last line of defence: whatever one job's reading raises, the next is still read.
    import aiohttp

    from blackwell_operator.handlers.measure import Measurer

    errors: list[str] = []
    pods = [_running(name, 9400) for name in ("a-bad-worker-0", "b-good-worker-0")]
    for p in pods:
        p["metadata"]["uid"] = p["metadata"]["name"]
    ctx: Any = SimpleNamespace(
        running_pods=lambda: pods,
        known_btjs=dict,
        metrics=SimpleNamespace(record_error=errors.append),
    )
    lineages = {
        p["metadata"]["uid"]: Lineage("PyTorchJob", "j", "ju", p["metadata"]["name"][0], "bu") for p in pods
    }
    read: list[str] = []

    async def one(self: Measurer, _: Any, namespace: str, name: str, pod: Any, found: Lineage) -> int:
        read.append(name)
        if name == "a":
            raise OverflowError("a reading no job can have")
        return 1

    monkeypatch.setattr(Measurer, "_lineages", lambda self, _: lineages)
    monkeypatch.setattr(Measurer, "_one", one)
    async with aiohttp.ClientSession() as session:
        written = await Measurer(ctx, logging.getLogger("test")).once(session)
    assert read == ["a", "b"] and written == 1 and errors == ["MeasureError"]


def test_tokens_per_second_per_gpu_between_two_readings() -> None:
    first, later = Reading(10.0, 8192.0, 2, 0.4), Reading(12.0, 16384.0, 2, 0.4)
    assert tokens_per_second_per_gpu(first, later) == 2048.0
    assert tokens_per_second_per_gpu(later, first) is None  # a restarted container counts from zero
    assert tokens_per_second_per_gpu(first, first) is None


def test_only_a_running_trainer_pod_with_an_ip_has_an_endpoint() -> None:
    assert metrics_endpoint(_running("w-worker-0", 9400, "10.1.2.3")) == "http://10.1.2.3:9400/metrics"
    assert metrics_endpoint(_running("w-worker-0", 9400, "fd00::7")) == "http://[fd00::7]:9400/metrics"
    pending = _running("w-worker-0", 9400)
    pending["status"]["phase"] = "Pending"
    assert metrics_endpoint(pending) is None
    no_port = _running("w-worker-0", 9400)
    no_port["spec"]["containers"][0]["ports"] = []
    assert metrics_endpoint(no_port) is None


# The verified owner chain of a worker of _btj (lifecycle/ownership.py).
OURS = Lineage("PyTorchJob", "w", "u-job", "w", "u-btj")


def _btj(phase: str, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    body = btj("w")
    body["metadata"].update(creationTimestamp="2026-11-30T07:00:00Z", uid="u-btj")
    body["status"] = {"phase": phase, **({"measured": measured} if measured else {})}
    return body


def test_status_measured_is_written_when_running_and_moved() -> None:
    worker = _running("w-worker-0", 9400)
    now = "2026-11-30T08:00:00Z"
    change = measured_changes(_btj("Running"), worker, 2048.04, 0.41234, now, found=OURS)
    assert change is not None and status_patch(change, {}, MEASURE_LOOP) == {
        "measured": {"tokensPerSecondPerGpu": 2048.0, "modelFlopsUtilization": 0.4123, "observedAt": now}
    }
    stored = {"tokensPerSecondPerGpu": 2048.0, "modelFlopsUtilization": 0.41, "observedAt": now}
    assert (
        measured_changes(_btj("Running", stored), worker, 2060.0, 0.415, now, found=OURS) is None
    )  # within 1%
    assert measured_changes(_btj("Running", stored), worker, 1900.0, 0.41, now, found=OURS) is not None
    assert measured_changes(_btj("Restarting"), worker, 2048.0, 0.41, now, found=OURS) is None


@pytest.mark.parametrize(("raw", "value"), [("", 60.0), ("5", 5.0), ("0", None)])
def test_the_interval_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, value: float
) -> None:
    monkeypatch.setenv(INTERVAL_ENV, raw)
    assert measure_interval() == value


def test_a_bad_interval_names_the_variable_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "often")
    with pytest.raises(ValueError, match=rf"{INTERVAL_ENV}='often'.*Fix"):
        measure_interval()


# ----- the running operator --------------------------------------------------------------------------------


@pytest.mark.integration
async def test_the_operator_reads_a_running_worker_s_throughput(
    cluster: Cluster, trainer_metrics: TrainerMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0.3")
    stop = threading.Event()

    def train() -> None:  # steps of 2,048 tokens per GPU every 20 ms, as a trainer would record them
        while not stop.wait(0.02):
            trainer_metrics.record_step(tokens=2048, mfu=0.41, **STEP)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        async with running_operator(cluster):
            job = await cluster.running_child("w")
            body = _running("w-worker-0", int(trainer_metrics.port or 0), owner=job)
            status = body.pop("status")
            await cluster.add_pod(body, status)
            measured = await wait_for(lambda: cluster.status("w").get("measured"), what="status.measured")
            await cluster.settle("w")
    finally:
        stop.set()
        trainer.join()
    # 2,048 tokens per GPU a step, at most 50 steps a second: the reading is a real rate, not a count.
    assert 0 < measured["tokensPerSecondPerGpu"] <= 2048 * 50 * 1.2
    assert measured["modelFlopsUtilization"] == 0.41 and measured["observedAt"].endswith("Z")


def _served_result() -> ProbeResult:
    plan = probed_plan()
    return measured_probe(plan, speed=[1.0, 1.0], peak=lambda c: 1.0, winner=0, seconds_each=1.0, seconds=2.0)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, b"no probe result\n"),  # still probing
        (200, b"not a probe line\n"),
        (200, b"\xff\xfe not utf-8"),
        # A good line past what the operator reads: it is never reached, so nothing is held beyond the bound.
        (200, b"-\n" * (PROBE_BYTES // 2) + f"{_served_result().to_line()}\n".encode()),
    ],
)
async def test_a_served_probe_result_that_is_not_one_takes_nothing_and_is_read_again(
    status: int, body: bytes
) -> None:
    import aiohttp
    from aiohttp import web

    from blackwell_operator.handlers.measure import Measurer

    async def probe(_: web.Request) -> web.Response:
        return web.Response(status=status, body=body)

    app = web.Application()
    app.router.add_get(PROBE_RESULT_PATH, probe)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    # A context any use of which fails the test: nothing may be recorded from such a body.
    measurer = Measurer(cast(Any, SimpleNamespace()), logging.getLogger("test"))
    worker = _running("w-worker-0", port)
    try:
        async with aiohttp.ClientSession() as session:
            await measurer._take_probe(session, f"http://127.0.0.1:{port}/metrics", "ns", worker, OURS)
    finally:
        await runner.cleanup()
    assert measurer.probed == set()  # the next reading asks again

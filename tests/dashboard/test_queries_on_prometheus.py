"""Every dashboard query, run by a real Prometheus against the real trainer and operator exporters,
returns data. Needs the `prometheus` binary (Debian's prometheus package); skipped without it."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from tests.dashboard.promql import label_values_query
from tests.dashboard.test_dashboard import DASHBOARD, a_plan, queries
from tests.ports import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus) to run the queries on"
)
SCRAPE_SECONDS = 1
# Labels a trainer PodMonitor gives the series: job = the BTJ name (jobLabel), namespace and pod.
TRAINER_TARGET = {"namespace": "hyperpod-ns-team-a", "pod": "llama3-8b-pretrain-worker-0"}
TRAINER_JOB = "llama3-8b-pretrain"


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from blackwell_operator.metrics import OperatorMetrics
    from blackwell_trainer.loop.metrics import TrainerMetrics

    trainer = TrainerMetrics(a_plan(), CollectorRegistry())
    trainer.serve(0)
    operator_registry = CollectorRegistry()
    operator = OperatorMetrics(operator_registry)
    operator_port = free_port()
    operator_server, _ = start_http_server(operator_port, addr="127.0.0.1", registry=operator_registry)
    stop = threading.Event()

    def work() -> None:
        # A training job and an operator going about their business, a few times per scrape.
        step = 0
        while not stop.is_set():
            step += 1
            trainer.record_step(
                tokens=16384,
                step_seconds=0.4 + 0.01 * (step % 5),
                loss=3.0 - step * 1e-3,
                mfu=0.41,
                peak_allocated_bytes=70 * 2**30,
                peak_reserved_bytes=78 * 2**30,
                alloc_retries=step // 3,
            )
            if step % 5 == 0:
                trainer.record_checkpoint(time.time())
            with operator.reconcile_duration.time():
                operator.observe_job(f"uid-{step % 3}", "Running")
            if step % 4 == 0:
                operator.record_error("ApiError")
            if step % 6 == 0:
                operator.children_recreated.inc()
            stop.wait(0.2)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()

    folder = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "scrape_configs": [
            {
                "job_name": TRAINER_JOB,
                "static_configs": [{"targets": [f"127.0.0.1:{trainer.port}"], "labels": TRAINER_TARGET}],
            },
            {"job_name": "btj-operator", "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"]}]},
        ],
    }
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    process = subprocess.Popen(
        [
            PROMETHEUS or "prometheus",
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        # Ready once both targets have been scraped often enough for rate() over a few seconds.
        deadline = time.monotonic() + 60
        while True:
            try:
                counts = api(base, "query", query="count_over_time(up[1m]) >= 4")["result"]
                if len(counts) == 2:
                    break
            except OSError:
                pass
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "Prometheus did not scrape both exporters within 60 s"
            time.sleep(0.5)
        yield base
    finally:
        stop.set()
        worker.join()
        process.terminate()
        process.wait(timeout=30)
        operator_server.shutdown()
        trainer.close()


def substitute(expr: str) -> str:
    """What Grafana sends with every variable on "All" (allValue .*) and a short rate interval."""
    for name in ("namespace", "job", "pod"):
        expr = expr.replace(f"${name}", ".*")
    return expr.replace("$__rate_interval", "10s")


@pytest.mark.parametrize(("title", "expr"), queries(), ids=[f"{t}:{i}" for i, (t, _) in enumerate(queries())])
def test_panel_query_returns_data(prometheus: str, title: str, expr: str) -> None:
    result = api(prometheus, "query", query=substitute(expr))["result"]
    assert result, f"{title}: no data for {substitute(expr)}"
    for series in result:
        assert not math.isnan(float(series["value"][1])), f"{title}: NaN"


def test_variable_queries_find_the_job(prometheus: str) -> None:
    expected = {"namespace": TRAINER_TARGET["namespace"], "job": TRAINER_JOB, "pod": TRAINER_TARGET["pod"]}
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] != "query":
            continue
        selector, label = label_values_query(var["definition"])
        values = api(prometheus, f"label/{label}/values", **{"match[]": substitute(selector)})
        assert values == [expected[var["name"]]], var["name"]


def test_per_gpu_throughput_divides_by_the_gpus_a_pod_serves(prometheus: str) -> None:
    per_job = next(e for t, e in queries() if t == "Tokens/s per job")
    per_gpu = next(e for t, e in queries() if t == "Tokens/s per GPU: measured vs predicted")
    at = f"{time.time() - 2:.3f}"  # one evaluation time for all three, so they see the same samples
    job_rate = float(api(prometheus, "query", query=substitute(per_job), time=at)["result"][0]["value"][1])
    gpu_rate = float(api(prometheus, "query", query=substitute(per_gpu), time=at)["result"][0]["value"][1])
    gpus = float(api(prometheus, "query", query="sum(btj_trainer_gpus)", time=at)["result"][0]["value"][1])
    assert gpus == 8
    assert gpu_rate == pytest.approx(job_rate / gpus, rel=1e-6)


def test_the_predicted_series_carry_their_basis(prometheus: str) -> None:
    # The plan's choices are modelled (a_plan): the legend's label says so beside the figure.
    at = f"{time.time() - 2:.3f}"
    for title, expr in queries():
        if "prediction_basis" not in expr:
            continue
        result = api(prometheus, "query", query=substitute(expr), time=at)["result"]
        assert [series["metric"]["prediction_basis"] for series in result] == ["modelled"], title

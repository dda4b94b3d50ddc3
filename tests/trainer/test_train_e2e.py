"""The real trainer entry point under torchrun: 2 CPU processes (gloo), the tiny model, a few steps each.

What a user relies on, end to end: the loss falls; SIGTERM (to torchrun, or to one worker only) writes
a checkpoint of one step on every rank and the workers exit 0, and the resume goes on from it; a full
checkpoint volume is survived, then stops the run with one line per rank; /metrics answers over HTTP
while training; S3 shards come through a moto server; every AC and sharding mode trains; a bad plan is
refused with one line and exit code 2. Resumes on the same and on other layouts: test_elastic_resume.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from blackwell_trainer.data.tokens import Batch
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import Plan
from blackwell_trainer.train import _token_source, main
from tests.ports import free_port
from tests.support.plans import tiny_plan, tiny_plan_dict

from .test_metrics import EXPECTED_TYPES

STEP_LINE = re.compile(r"step (\d+)/\d+ loss (\d+\.\d+)")
# Safety nets only (a hung collective must not hang CI); no assertion depends on timing.
RUN_TIMEOUT_S = 180


def write_plan(
    folder: Path, *, steps: int, checkpoint: Path | None = None, interval: int = 1000, **chosen: Any
) -> Path:
    """The tiny plan with `steps`, a checkpoint folder and `chosen` overrides, as the ConfigMap holds it."""
    plan = tiny_plan_dict(**chosen)
    plan["parameterCount"] = tiny_plan().architecture.parameter_count()
    plan["steps"] = steps
    plan["checkpoint"] = {
        "path": str(checkpoint) if checkpoint else None,
        "intervalSteps": interval,
        "keepLatest": 2,
    }
    plan["metricsPort"] = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def edit_plan(path: Path, change: Callable[[dict[str, Any]], object]) -> Path:
    plan = json.loads(path.read_text())
    change(plan)
    path.write_text(json.dumps(plan))
    return path


@dataclass
class Trainer:
    """A torchrun launch of `python -m blackwell_trainer`, its output collected line by line."""

    plan: Path
    env: dict[str, str] = field(default_factory=dict)
    nproc: int = 2
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={self.nproc}",
        ]
        cmd += ["-m", "blackwell_trainer", "--plan", str(self.plan)]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **self.env},
            start_new_session=True,  # its own process group, so a failed test can kill the workers too
        )
        self._changed = threading.Condition()
        self._seen_workers: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first output line matching `pattern`, waiting for it while the trainer runs."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        with self._changed:
            while True:
                self._seen_workers.update(self._children())
                for line in self.lines:
                    if match := regex.search(line):
                        return match
                if not self._reader.is_alive() or time.monotonic() > deadline:
                    raise AssertionError(f"no line matching {pattern!r}; output ends:\n{self.output[-4000:]}")
                self._changed.wait(timeout=1)

    def finish(self) -> int:
        self._seen_workers.update(self._children())
        try:
            rc = self.proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired as err:
            self.kill()
            # Say where it hung: the last lines torchrun and its workers printed.
            tail = self.output[-4000:]
            raise AssertionError(f"still running after {err.timeout} s; output ends:\n{tail}") from err
        self._reader.join(timeout=10)
        return rc

    def kill(self) -> None:
        """SIGKILL torchrun and every worker it was seen with (cleanup, also after a pass)."""
        # torchrun starts each worker in a session of its own, so killpg misses them, and once torchrun
        # is gone they are re-parented and no longer found as its children: kill every worker seen
        # while it ran. One left behind trains on for its 100,000 steps and starves later tests of CPU.
        self._seen_workers.update(self._children())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self._seen_workers:
            with contextlib.suppress(OSError):
                # Guard against a recycled PID: only a trainer process is ours to kill.
                if b"blackwell_trainer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def _children(self) -> list[int]:
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                # Fields after the parenthesised command: state, ppid, ...
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.proc.pid:
                children.append(int(stat.parent.name))
        return children

    def workers(self) -> dict[int, int]:
        """Global rank -> PID of torchrun's worker processes."""
        ranks: dict[int, int] = {}
        for pid in self._children():
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                rank = next(int(v.split(b"=", 1)[1]) for v in environ if v.startswith(b"RANK="))
                ranks[rank] = pid
        assert ranks, f"torchrun {self.proc.pid} has no workers"
        return ranks

    def signal_story(self) -> str:
        """What a failure needs first: who got SIGTERM, the last step logged, how each rank stopped."""
        wanted = ("received SIGTERM", "preempted", "Sending process", "Unable to shutdown")
        story = [line for line in self.lines if any(w in line for w in wanted)]
        steps = [line for line in self.lines if STEP_LINE.search(line)]
        return "".join(story + steps[-1:]) or "(no SIGTERM, preemption or step lines)\n"

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def losses(self) -> dict[int, str]:
        """Step -> loss as rank 0 logs it (4 decimals)."""
        return {int(m[1]): m[2] for m in STEP_LINE.finditer(self.output)}


def run_to_end(plan: Path, env: dict[str, str] | None = None, nproc: int = 2) -> Trainer:
    trainer = Trainer(plan, env or {}, nproc)
    try:
        rc = trainer.finish()
    finally:
        trainer.kill()
    assert rc == 0, trainer.output[-4000:]
    return trainer


def first_step_batches(plan: Plan) -> list[Batch]:
    """Each rank's micro-batch of step 1, in rank order: the batches the first logged loss averages."""
    world, cpu = plan.world_size, torch.device("cpu")
    return [_token_source(plan, Runtime(rank, rank, world, world, cpu)).next_batch() for rank in range(world)]


def run_one_process(plan: Path, termination: Path) -> subprocess.CompletedProcess[str]:
    """The entry point as one process (no torchrun), its termination message going to `termination`."""
    return subprocess.run(
        [sys.executable, "-m", "blackwell_trainer", "--plan", str(plan)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "BTJ_TERMINATION_LOG": str(termination)},
    )


def complete_steps(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "COMPLETE.json").exists())


# --- one long run: loss, /metrics, SIGTERM to torchrun; then a resume that is SIGTERMed at the workers


@dataclass
class Preempted:
    first: Trainer
    metrics_text: str
    checkpoint: Path
    second: Trainer
    second_rc: int


@pytest.fixture(scope="module")
def preempted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Preempted]:
    folder = tmp_path_factory.mktemp("preempted")
    plan = write_plan(folder, steps=100_000, checkpoint=folder / "ckpt")
    port = json.loads(plan.read_text())["metricsPort"]

    first = Trainer(plan)
    second: Trainer | None = None
    try:
        first.wait_for(r"step 40/")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics_text = response.read().decode()
        # Kubernetes sends SIGTERM to the container's PID 1, here torchrun, which forwards it to the workers.
        first.proc.send_signal(signal.SIGTERM)
        first.finish()
        # The resume below depends on it: fail here, with the first run's output, if it was not written.
        assert "preempted: checkpoint at step" in first.output, (
            f"no checkpoint after SIGTERM to torchrun:\n{first.signal_story()}"
            f"output ends:\n{first.output[-4000:]}"
        )

        second = Trainer(plan)
        second.wait_for(r"resumed at step \d+")
        second.wait_for(r"step \d+/")
        # This time one worker gets the signal directly (a node-local kill, or the first rank torchrun
        # reached): rank 1, which does not log steps, so rank 0 stops only if the ranks agree.
        os.kill(second.workers()[1], signal.SIGTERM)
        try:
            second_rc = second.finish()
        except AssertionError as hung:
            raise AssertionError(f"{hung}\nafter SIGTERM to rank 1:\n{second.signal_story()}") from None
    finally:
        for launched in (first, second):
            if launched is not None:
                launched.kill()
    yield Preempted(first, metrics_text, folder / "ckpt", second, second_rc)


@pytest.mark.distributed
def test_loss_falls_on_the_learnable_synthetic_task(preempted: Preempted) -> None:
    losses = {step: float(loss) for step, loss in preempted.first.losses().items()}
    early = np.mean([losses[s] for s in range(1, 6)])
    late = np.mean([losses[s] for s in range(36, 41)])
    # ln(256) = 5.55 at the start; the arithmetic-sequence task is learnt well below it in 40 steps.
    assert early > 5.0 and late < early - 1.0, losses


@pytest.mark.distributed
def test_metrics_endpoint_carries_every_metric_while_training(preempted: Preempted) -> None:
    families = {f.name: f for f in text_string_to_metric_families(preempted.metrics_text)}
    expected = EXPECTED_TYPES  # every metric the exporter has, as the scrape test lists them
    assert {name: families[name].type for name in expected if name in families} == expected

    def sample(name: str, **labels: str) -> float:
        family = next(f for f in families.values() if any(s.name == name for s in f.samples))
        return next(s.value for s in family.samples if s.name == name and labels.items() <= s.labels.items())

    steps = sample("btj_trainer_steps_total")
    assert steps >= 40
    # 2 GPUs in the pod, each 4 sequences x 32 tokens a step. The scrape may fall between two updates
    # of one step (the client library collects without a registry-wide lock): allow one step apart.
    tokens = sample("btj_trainer_tokens_total")
    assert tokens % (2 * 4 * 32) == 0 and abs(tokens / (2 * 4 * 32) - steps) <= 1
    assert sample("btj_trainer_gpus") == 2
    assert abs(sample("btj_trainer_step_duration_seconds_count") - steps) <= 1
    assert sample("btj_trainer_step_duration_seconds_sum") > 0
    assert 0 < sample("btj_trainer_loss") < 6
    assert 0 < sample("btj_trainer_model_flops_utilization_ratio") < 1
    assert sample("btj_trainer_gpu_memory_peak_bytes", kind="allocated") == 0  # CPU: no device memory
    assert sample("btj_trainer_predicted_tokens_per_second") == 1234.5
    assert sample("btj_trainer_predicted_memory_peak_bytes") == 8e6
    assert sample("btj_trainer_last_checkpoint_timestamp_seconds") == 0  # interval 1000: none yet
    info = next(s for s in families["btj_trainer_build_info"].samples)
    assert info.labels["activation_checkpointing"] == "none" and info.labels["sharding"] == "full"


@pytest.mark.distributed
def test_sigterm_to_torchrun_writes_a_checkpoint_and_the_workers_exit_0(preempted: Preempted) -> None:
    out = preempted.first.output
    assert "received SIGTERM" in out
    step = int(re.findall(r"preempted: checkpoint at step (\d+) written, exiting 0", out)[0])
    assert step >= 40
    assert out.count(f"preempted: checkpoint at step {step} written, exiting 0") == 2  # both ranks
    assert step in complete_steps(preempted.checkpoint)
    # NOTE: torchrun itself exits 1 here: it re-raises the SIGTERM it handled (SignalException),
    # whatever the workers returned. The workers' clean exit is what the lines above show.


@pytest.mark.distributed
def test_resume_continues_and_sigterm_to_one_worker_stops_every_rank_at_one_step(
    preempted: Preempted,
) -> None:
    saved = int(re.findall(r"preempted: checkpoint at step (\d+)", preempted.first.output)[0])
    second = preempted.second
    assert f"resumed at step {saved}" in second.output
    assert min(second.losses()) == saved + 1
    assert preempted.second_rc == 0, second.output
    assert second.output.count("received SIGTERM") == 1  # rank 1 only
    finals = re.findall(r"preempted: checkpoint at step (\d+) written, exiting 0", second.output)
    assert len(finals) == 2 and finals[0] == finals[1], second.signal_story()  # both ranks, one step
    assert complete_steps(preempted.checkpoint) == [saved, int(finals[0])]


# --- a full checkpoint file system (a real 3 MiB tmpfs: room for one tiny checkpoint, not two)


@pytest.fixture
def full_volume(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip(
            "needs root to mount a small tmpfs (a file system that fills up): run the tests as root (CI does)"
        )
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.distributed
def test_a_full_checkpoint_volume_is_survived_then_stops_the_run_with_one_line(
    tmp_path: Path, full_volume: Path
) -> None:
    # Step 5 fits, 10, 15 and 20 do not (ENOSPC on one rank, DCP's CheckpointException on both): two
    # logged failures while training goes on, then the third in a row stops both ranks with exit 2.
    plan = write_plan(tmp_path, steps=40, checkpoint=full_volume, interval=5)
    trainer = Trainer(plan)
    try:
        rc = trainer.finish()
    finally:
        trainer.kill()
    out = trainer.output
    assert rc != 0, out[-4000:]
    assert "failed (exitcode: 2)" in out, out[-4000:]  # torchrun's report of the workers' exit code
    for step in (10, 15):
        logged = [
            line
            for line in out.splitlines()
            if f"ERROR blackwell_trainer: checkpoint of step {step} " in line
        ]
        assert len(logged) == 1, out[-4000:]  # rank 0 only
        assert f"spec.training.checkpoint.path {full_volume} (" in logged[0]
        assert "No space left on device" in logged[0] and "newest complete checkpoint is step 5" in logged[0]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2, out[-4000:]  # one line per rank
    assert all(
        e.startswith("error: 3 interval checkpoints in a row not written, the last checkpoint of step 20")
        for e in errors
    )
    # No worker traceback (torchrun prints its own ChildFailedError summary).
    assert "CheckpointException" not in out and "OSError" not in out, out[-6000:]
    assert max(trainer.losses()) == 20
    assert complete_steps(full_volume) == [5]
    assert [p.name for p in full_volume.iterdir()] == ["step-000005"]


# --- every activation-checkpointing and sharding mode, one with S3 shards through moto


@pytest.fixture
def s3_shards(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """s3://tokens/tiny/ on a moto server (real HTTP on 127.0.0.1), and the env that points boto3 at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "BTJ_CACHE_DIR": str(tmp_path / "cache"),
        "BTJ_CACHE_KEEP_FREE_FRACTION": "0",  # this machine's disk fullness is not under test here
    }
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket="tokens")
    rng = np.random.default_rng(0)
    for i in range(2):
        client.put_object(
            Bucket="tokens",
            Key=f"tiny/shard-{i}.bin",
            Body=rng.integers(0, 256, 4000).astype(np.uint16).tobytes(),
        )
    yield "s3://tokens/tiny", env
    server.stop()


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("ac", "sharding", "shard_degree", "replicate_degree"),
    [("selective", "hybrid", 2, 1), ("full", "none", 1, 2)],
)
def test_each_mode_trains_and_checkpoints(
    tmp_path: Path,
    s3_shards: tuple[str, dict[str, str]],
    ac: str,
    sharding: str,
    shard_degree: int,
    replicate_degree: int,
) -> None:
    uri, env = s3_shards
    plan = write_plan(
        tmp_path,
        steps=4,
        checkpoint=tmp_path / "ckpt",
        interval=2,
        activationCheckpointing=ac,
        sharding=sharding,
        shardDegree=shard_degree,
        replicateDegree=replicate_degree,
    )
    if sharding == "hybrid":  # one of the two runs reads its tokens from S3
        edit_plan(plan, lambda p: p.update(dataset={"kind": "shards", "uri": uri, "tokenDtype": "uint16"}))
    trainer = run_to_end(plan, env)
    losses = trainer.losses()
    assert sorted(losses) == [1, 2, 3, 4]
    assert all(0 < float(v) < 10 for v in losses.values())
    assert complete_steps(tmp_path / "ckpt") == [2, 4]
    if sharding == "hybrid":
        # Shards are fetched on first use: 4 steps read only the first shard of the epoch's order.
        cached = {p.name for p in (tmp_path / "cache" / "s3" / "tokens" / "tiny").glob("*.bin")}
        assert cached and cached <= {"shard-0.bin", "shard-1.bin"}


# --- bad plans: one line, exit code 2, before any process group or device


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.pop("architecture"), r"architecture"),
        (
            lambda p: (
                p["chosen"].update(precision="mxfp8", precisionRecipe="mxfp8-block"),
                p["gpu"].update(name="H200", computeCapability="9.0"),
            ),
            r"(?i)mxfp8",
        ),
        (lambda p: p.update(gpusPerNode=3), r"gpusPerNode"),
    ],
    ids=["missing-architecture", "mxfp8-on-hopper", "wrong-world-size"],
)
def test_bad_plans_are_refused_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[dict[str, Any]], object],
    message: str,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    plan = edit_plan(write_plan(tmp_path, steps=2), change)
    assert main(["--plan", str(plan)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and re.search(message, err[0]), err


def test_a_missing_plan_file_is_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--plan", str(tmp_path / "absent.json")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "plan file not found" in line


@pytest.mark.usefixtures("world_of_one")
def test_resuming_onto_another_data_set_is_refused_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # One process, main() in this one (no torchrun, no torch import of its own): the refusal happens
    # while loading the checkpoint.
    plan = write_plan(tmp_path, steps=1, checkpoint=tmp_path / "ckpt", shardDegree=1)
    edit_plan(plan, lambda p: p.update(gpusPerNode=1))
    assert main(["--plan", str(plan)]) == 0
    assert complete_steps(tmp_path / "ckpt") == [1]

    (np.arange(4000) % 256).astype(np.uint16).tofile(tmp_path / "tokens.bin")
    edit_plan(
        plan,
        lambda p: p.update(steps=2, dataset={"kind": "shards", "uri": str(tmp_path), "tokenDtype": "uint16"}),
    )
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # a fresh gloo world of one
    capsys.readouterr()
    assert main(["--plan", str(plan)]) == 2
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "dataset.kind" in errors[0], stderr[-3000:]
    assert "Traceback" not in stderr

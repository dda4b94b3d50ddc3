"""The trainer process's exit: the code main() returned, reached intact, and no abort from torch's threads.

The abort is staged deterministically (tests/trainer/exit_hazard.py): a gloo worker thread that needs the
GIL while the interpreter finalizes aborts a plain Python exit with SIGABRT, as one rank of the fine-tuning
e2e test did once in four CI runs after its run had finished; the trainer's exit is not touched by it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from blackwell_trainer.data.tokens import DataLayout, Shard, ShardTokenSource
from blackwell_trainer.loop.metrics import TrainerMetrics
from blackwell_trainer.loop.process_exit import exit_status
from blackwell_trainer.train import main
from tests.ports import free_port

from .test_train_e2e import edit_plan, write_plan

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # a safety net: each process takes a few seconds
TERMINATE = "terminate called without an active exception"


def exit_with(body: str) -> subprocess.CompletedProcess[str]:
    """Run `body` in a fresh Python after ``process_exit = ProcessExit()``, as __main__ starts."""
    script = "from blackwell_trainer.loop.process_exit import ProcessExit\nprocess_exit = ProcessExit()\n"
    return subprocess.run(
        [sys.executable, "-c", script + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("code", [0, 2, 3])
def test_the_exit_code_is_what_main_returned_and_no_output_is_lost(code: int) -> None:
    done = exit_with(
        f"""
        import atexit, sys, threading, time
        atexit.register(lambda: print("later atexit handler ran"))
        worker = threading.Thread(target=lambda: (time.sleep(0.2), print("non-daemon thread finished")))
        worker.start()
        print("unflushed line", end="")
        sys.stderr.write("unflushed error")
        process_exit.run(lambda: {code})
        """
    )
    assert done.returncode == code, done.stderr
    # Python's own exit joins non-daemon threads and runs every atexit handler first; so does this one.
    assert done.stdout == "unflushed linenon-daemon thread finished\nlater atexit handler ran\n"
    assert done.stderr == "unflushed error"


def test_system_exit_keeps_its_status_and_an_escaped_error_exits_1_with_its_traceback() -> None:
    usage = exit_with("import sys\nprocess_exit.run(lambda: sys.exit(2))")  # argparse's usage error
    assert usage.returncode == 2
    message = exit_with("import sys\nprocess_exit.run(lambda: sys.exit('bad flag'))")
    assert (message.returncode, message.stderr) == (1, "bad flag\n")

    crashed = exit_with("def fail():\n    raise RuntimeError('a bug')\nprocess_exit.run(fail)")
    assert crashed.returncode == 1
    assert "Traceback" in crashed.stderr and crashed.stderr.endswith("RuntimeError: a bug\n")


def test_python_m_blackwell_trainer_exits_with_mains_code_before_the_interpreter_teardown(
    tmp_path: Path,
) -> None:
    # An object the interpreter's module teardown would free: its line shows whether that teardown ran.
    script = f"""
import runpy, sys
class Teardown:
    def __del__(self):
        print("teardown ran", flush=True)
teardown = Teardown()
sys.argv = ["blackwell_trainer", "--plan", {str(tmp_path / "missing.json")!r}]
runpy.run_module("blackwell_trainer", run_name="__main__", alter_sys=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: plan file not found: ")
    assert "teardown ran" not in done.stdout


def test_exit_status_reads_system_exit_codes_as_python_does() -> None:
    assert [exit_status(c) for c in (None, 0, 3, "message")] == [0, 0, 3, 1]


def hazard(mode: str, code: int, folder: Path) -> subprocess.CompletedProcess[str]:
    """Rank 0 of tests/trainer/exit_hazard.py (rank 1 beside it), ending in `mode`."""
    port, flag = str(free_port()), str(folder / "rank-0-waits")
    command = [sys.executable, "-m", "tests.trainer.exit_hazard"]
    peer = subprocess.Popen([*command, "1", port, mode, "0", flag], cwd=ROOT)
    try:
        return subprocess.run(
            [*command, "0", port, mode, str(code), flag],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    finally:
        peer.wait(timeout=TIMEOUT_S)


@pytest.mark.distributed
def test_a_gloo_worker_waiting_for_the_gil_aborts_a_plain_exit(tmp_path: Path) -> None:
    # The control: without the trainer's exit, the staged race aborts Python's finalization. It shows the
    # hazard is torch's and real, and that the test below would catch an exit path that meets it.
    plain = hazard("plain", 0, tmp_path)
    assert plain.returncode == -signal.SIGABRT, (plain.returncode, plain.stderr[-2000:])
    assert TERMINATE in plain.stderr


@pytest.mark.distributed
def test_the_trainer_exit_keeps_its_code_when_a_gloo_worker_waits_for_the_gil(tmp_path: Path) -> None:
    code = 3  # a failed run's code is not turned into -6 either (0 is the same path, tested above)
    ended = hazard("trainer", code, tmp_path)
    assert ended.returncode == code, (ended.returncode, ended.stderr[-2000:])
    assert TERMINATE not in ended.stderr
    assert ended.stdout == f"rank 0 done, exiting {code}\n"


def test_closing_a_shard_source_joins_its_background_fetch(tmp_path: Path) -> None:
    release = threading.Event()
    fetched: list[str] = []

    def local(name: str) -> Shard:
        path = tmp_path / name
        path.write_bytes(bytes(range(200)))

        def fetch() -> Path:
            if threading.current_thread().name == "btj-shard-prefetch":
                release.wait(timeout=TIMEOUT_S)  # a download still running when the run ends
            fetched.append(name)
            return path

        return Shard(name=name, num_tokens=200, fetch=fetch)

    source = ShardTokenSource(
        [local("a.bin"), local("b.bin")],
        token_dtype="uint8",
        seed=0,
        uri=str(tmp_path),
        layout=DataLayout(micro_batch_size=1, sequence_length=8, vocab_size=256),
    )
    source.next_batch()  # opens the epoch's first shard and starts fetching the second
    prefetch = [t for t in threading.enumerate() if t.name == "btj-shard-prefetch"]
    assert len(prefetch) == 1 and prefetch[0].is_alive()
    threading.Timer(0.2, release.set).start()
    source.close()
    assert not prefetch[0].is_alive()  # joined, not left to the interpreter's exit
    assert len(fetched) == 2
    source.close()  # closing again is harmless


@pytest.mark.usefixtures("world_of_one")
def test_run_joins_every_thread_it_started_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "shards"
    data.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.bin", "b.bin", "c.bin"):
        rng.integers(0, 256, size=400, dtype=np.uint16).tofile(data / name)
    plan = write_plan(tmp_path, steps=3, checkpoint=tmp_path / "ckpt", shardDegree=1)
    edit_plan(
        plan,
        lambda p: p.update(
            gpusPerNode=1, dataset={"kind": "shards", "uri": str(data), "tokenDtype": "uint16", "seed": 1}
        ),
    )
    started: list[threading.Thread] = []
    close_source, close_metrics = ShardTokenSource.close, TrainerMetrics.close

    def closing_source(self: ShardTokenSource) -> None:
        started.extend([self._prefetch] if self._prefetch else [])
        close_source(self)

    def closing_metrics(self: TrainerMetrics) -> None:
        started.extend([self._thread] if self._thread else [])
        close_metrics(self)

    monkeypatch.setattr(ShardTokenSource, "close", closing_source)
    monkeypatch.setattr(TrainerMetrics, "close", closing_metrics)
    before = set(threading.enumerate())

    assert main(["--plan", str(plan)]) == 0
    # The shard prefetch and the /metrics server ran, and both are joined when run() returns, before
    # the interpreter's exit could meet them.
    assert len(started) == 2 and "btj-shard-prefetch" in {t.name for t in started}
    assert not any(t.is_alive() for t in started)
    # No thread it started outlives it. Threads an earlier test left behind may finish meanwhile, so
    # the check is that nothing new is alive, not that the set is unchanged.
    assert set(threading.enumerate()) <= before

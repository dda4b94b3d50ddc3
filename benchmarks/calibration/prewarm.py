"""Pre-started one-GPU workers: the next configuration's imports run while the current one trains.

A configuration's process spends 7-14 s importing torch, torchao and the trainer before it touches the GPU
(the `import` phase in every record's detail, H100 and CPU alike), a quarter of a 40 s configuration. A
worker started early (`worker.py --wait-in DIR`) imports, then waits for DIR/go.json without touching CUDA;
the next configuration on the same GPU lane takes it. It is started with that lane's environment
(CUDA_VISIBLE_DEVICES and the allocator's settings are read when CUDA starts, so they cannot change
later), and one that found CUDA started by its imports exits instead of waiting: a waiting process holding
a CUDA context would take memory from the configuration being measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.calibration.worker import GO_FILE, LOG_FILE


@dataclass
class WarmWorker:
    """One pre-started worker: its process and the folder it waits in (its log, plan and results)."""

    proc: subprocess.Popen[bytes]
    folder: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, plan: Path, result_dir: Path, warmup: int, timed: int) -> None:
        """Hand it its configuration (written whole, then renamed: it never reads half a file)."""
        ticket = {"plan": str(plan), "result_dir": str(result_dir), "warmup": warmup, "timed": timed}
        partial = self.folder / f"{GO_FILE}.partial"
        partial.write_text(json.dumps(ticket))
        partial.rename(self.folder / GO_FILE)


class WarmPool:
    """At most one pre-started worker per GPU lane (the lane's GPU ids)."""

    def __init__(self, worker_module: str, cwd: Path) -> None:
        self.worker_module, self.cwd = worker_module, cwd
        self.lock = threading.Lock()
        self.waiting: dict[tuple[int, ...], WarmWorker] = {}

    def spawn(self, lane: tuple[int, ...], env: dict[str, str]) -> None:
        """Start the lane's next worker (its imports run now), unless one already waits there."""
        with self.lock:
            if lane in self.waiting and self.waiting[lane].alive():
                return
            folder = Path(tempfile.mkdtemp(prefix="btj-cal-warm-"))
            with open(folder / LOG_FILE, "w") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", self.worker_module, "--wait-in", str(folder)],
                    env=env,
                    cwd=self.cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # killed as a group, as the configurations are
                )
            self.waiting[lane] = WarmWorker(proc, folder)

    def take(self, lane: tuple[int, ...]) -> WarmWorker | None:
        """The lane's waiting worker, if one is alive (None: start one cold)."""
        with self.lock:
            warm = self.waiting.pop(lane, None)
        if warm is None or not warm.alive():
            return None
        return warm

    def close(self, kill: Callable[[int], None]) -> None:
        """End every worker still waiting (`kill`: the scheduler's kill_tree)."""
        with self.lock:
            left, self.waiting = list(self.waiting.values()), {}
        for warm in left:
            if warm.alive():
                kill(warm.proc.pid)
                warm.proc.wait()

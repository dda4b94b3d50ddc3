"""One rank of a 2-rank gloo world that exits while a gloo worker thread waits for the GIL.

Usage: python -m tests.trainer.exit_hazard RANK PORT MODE CODE FLAG
MODE `trainer` ends through blackwell_trainer.loop.process_exit, as ``python -m blackwell_trainer`` does;
MODE `plain` ends with ``SystemExit(CODE)`` and Python's normal finalization.

Rank 0 stages, deterministically, what the trainer met rarely, by chance: its
last collective completes on a gloo worker after its tensor's Python object is gone, so the worker must
take the GIL to free it, while the main thread is on its way out and does not hand the GIL over until the
interpreter is finalizing. Rank 1 only takes part in that collective, once rank 0 has created the file
FLAG (the tensor's Python object is gone by then), and leaves with os._exit.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import time

ALIVE_S = 3.0  # how long rank 0 keeps the GIL after the collective: the worker is waiting for it by then


class SlowTeardown:
    """Freed during finalization, it lets go of the GIL, as C++ destructors that release it do there."""

    def __init__(self) -> None:
        self.sleep = time.sleep

    def __del__(self) -> None:
        self.sleep(0.5)


teardown: SlowTeardown | None = None  # a module global: the interpreter's module teardown frees it


def main() -> None:
    rank, port, mode, code, flag = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    process_exit = None
    if mode == "trainer" and rank == 0:
        from blackwell_trainer.loop.process_exit import ProcessExit

        process_exit = ProcessExit()  # first, as in blackwell_trainer/__main__.py
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    group = dist.group.WORLD
    assert group is not None
    if rank == 1:
        while not os.path.exists(flag):
            time.sleep(0.01)
        group.allreduce([torch.ones(4)]).wait()
        os._exit(0)
    # FSDP2's and DTensor's caches hold the trainer's group past destroy_process_group(); one reference
    # that nothing releases stands for them here.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
    dist.destroy_process_group()  # as run() does: the group and its worker threads live on

    def last_collective() -> None:
        # Runs as the last atexit handler before the trainer's own: the interpreter is still alive.
        sys.setswitchinterval(1000)  # a thread waiting for the GIL never asks the main thread for it
        group.allreduce([torch.ones(4)])  # the tensor's only Python reference dies here
        open(flag, "w").close()  # now rank 1 joins: the collective completes on the gloo worker
        end = time.monotonic() + ALIVE_S
        while time.monotonic() < end:  # holds the GIL: the worker completes and waits to free the tensor
            pass

    atexit.register(last_collective)
    global teardown
    teardown = SlowTeardown()
    print(f"rank 0 done, exiting {code}")  # not flushed: the exit must not lose it
    if process_exit is not None:
        process_exit.run(lambda: code)
    raise SystemExit(code)


if __name__ == "__main__":
    main()

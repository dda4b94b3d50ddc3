"""SIGTERM to a stop every rank agrees on; torch-free at import, so it is installed before torch loads."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

log = logging.getLogger("blackwell_trainer.loop.preemption")


class PreemptionGuard:
    """Turns SIGTERM (preemption, Kueue suspend, HyperPod auto-resume, pod deletion) into a stop.

    torchrun forwards the SIGTERM it gets as the container's PID 1 to every worker and kills them
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds later (the operator renders 270; torch before 2.12 ignores
    it and keeps 30), so the loop must notice, save and exit 0 within that time. Install the guard first
    thing in the process (``python -m blackwell_trainer`` does, before torch is imported): until then
    SIGTERM's default action kills the worker without a word.

    The handler only records the signal. Ranks may see it in different steps (torchrun signals its
    workers one after another; a node-local kill may reach one rank only), so the loop calls
    `agreed()` at the same point of every step on every rank: it all-reduces (MAX) whether this rank
    was signalled, and every rank stops after the same step and saves together.

    The recorded signal is never cleared and the agreed stop is latched: a signal that lands while
    `agreed()` is inside its all-reduce counts at the next call instead of being overwritten by the
    result of a reduction it came too late for (that overwrite lost SIGTERM on every rank when all of
    them were signalled during the collective; the workers trained on until torchrun's SIGKILL).
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> None:
        self._signalled: signal.Signals | None = None  # written only by the handler
        self._reported = False
        self._stop = False
        self._previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # No logging here: the handler may interrupt a write to stderr (a reentrant write raises).
        self._signalled = signal.Signals(signum)

    @property
    def requested(self) -> bool:
        """Whether this process has received one of the signals (not yet agreed with the other ranks)."""
        return self._signalled is not None

    def agreed(self) -> bool:
        """True on every rank once any rank has been signalled (collective when distributed).

        Every rank must call it at the same point of the same step; once True it stays True.
        """
        signalled = self._signalled
        if signalled is not None and not self._reported:
            self._reported = True
            log.warning("received %s: will checkpoint and exit after this step", signalled.name)
        if self._stop:
            return True
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self._stop = signalled is not None
            return self._stop
        backend = dist.get_backend()
        device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        flag = torch.tensor([1 if signalled is not None else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        # Only the reduction's answer is stored here; a signal that arrived meanwhile stays recorded.
        self._stop = bool(flag.item())
        return self._stop

    def restore(self) -> None:
        """Put back the signal handlers that were installed before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
